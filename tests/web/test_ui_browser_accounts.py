"""Accounts in a real browser: `ragspec ui`'s server with sign-in on, headless Chromium.

  * a wrong password and an expired session cookie get the sign-in form, nothing else;
  * the owner signs in, uploads a document and may remove it;
  * a member sees only her own chat, not another member's (not even by typing its id into the
    address), has no upload box and no remove buttons; her session survives a reload, and
    sign-out ends it (a reload then shows the sign-in form);
  * no page ever holds a password hash.
"""

from __future__ import annotations

import time
import unicodedata

import pytest
from test_ui_browser import CHROMIUM, SIDEBAR, chromium, serving  # noqa: F401 (fixture)

from ragspec.accounts.sessions import SessionStore
from ragspec.accounts.users import AccountStore
from ragspec.web.chats import ChatStore

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PASSWORD = "correct horse battery"
DOC = "# Larkspur\n\nThe metrics endpoint of the Larkspur daemon listens on port 7432.\n"
ASK = "Ask a question about your documents"


def sign_in(context, url: str, name: str, password: str = PASSWORD):
    page = context.new_page()
    page.set_default_timeout(120_000)
    page.goto(url)
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Sign in").click()
    return page


def sidebar_text(page) -> str:
    return page.locator(SIDEBAR).inner_text()


def sidebar_drawn(page) -> None:
    """Wait until the sidebar's last part (the settings, after chats and documents) is drawn:
    Streamlit sends a page's elements one by one, so an earlier one shows up first."""
    page.locator(SIDEBAR).get_by_text("Side by side (speculation off vs on)").wait_for()


def remove_buttons(page):
    """The documents' remove buttons (Streamlit marks each widget with its key as a class)."""
    return page.locator(f'{SIDEBAR} .stElementContainer[class*="st-key-remove-"]')


def delete_buttons(page):
    return page.locator(f'{SIDEBAR} .stElementContainer[class*="st-key-delete-chat-"]')


def test_browser_roles_sessions_and_sign_out(chromium, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    accounts = AccountStore(home / "accounts.json")
    for name, role in (("olive", "owner"), ("mia", "member"), ("max", "member")):
        accounts.add(name, PASSWORD, role)
    chats = {name: ChatStore(home / "chats", user=name).create(f"{name}'s question about ports")
             for name in ("mia", "max")}
    expired, _ = SessionStore(home / "sessions.json",
                              clock=lambda: time.time() - 7200).create("mia", lifetime=60)
    doc = tmp_path / "larkspur.md"
    doc.write_text(DOC)

    with serving(tmp_path, RAGSPEC_AUTH="accounts") as url:
        # -- a wrong password, an expired session: the form and nothing else
        page = sign_in(chromium.new_context(), url, "mia", "not her password")
        page.get_by_text("Wrong name or password.").wait_for()
        assert page.get_by_placeholder(ASK).count() == 0
        context = chromium.new_context()
        context.add_cookies([{"name": "ragspec_session", "value": expired, "url": url}])
        page = context.new_page()
        page.goto(url)
        page.get_by_role("button", name="Sign in").wait_for()
        assert "question about ports" not in page.content()

        # -- the owner uploads a document and may remove it
        owner = sign_in(chromium.new_context(), url, "olive")
        owner.get_by_placeholder(ASK).wait_for()
        owner.locator(f'{SIDEBAR} input[type="file"]').set_input_files(doc)
        owner.get_by_text("larkspur.md: added").wait_for()
        # the message is drawn before the document list below it: wait for the list's button
        remove_buttons(owner).first.wait_for()
        assert remove_buttons(owner).count() == 1
        # Icons are Material icons, drawn by the page's own font: no emoji (Debian's Chromium
        # has no emoji font and shows them as empty boxes)
        icons = owner.locator(f'{SIDEBAR} .st-key-new-chat [data-testid="stIconMaterial"]')
        assert icons.first.inner_text() == "add"
        assert remove_buttons(owner).first.locator('[data-testid="stIconMaterial"]').count()
        assert not [c for c in sidebar_text(owner) if unicodedata.category(c) == "So"]
        assert "max's question" not in sidebar_text(owner)  # members' chats are theirs

        # -- a member: her chat only, no upload box, no remove buttons
        member_context = chromium.new_context()
        member = sign_in(member_context, url, "mia")
        member.get_by_placeholder(ASK).wait_for()
        member.get_by_text("mia's question about ports").wait_for()
        sidebar_drawn(member)
        side = sidebar_text(member)
        assert "larkspur.md" in side and "max's question" not in side
        assert member.locator(f'{SIDEBAR} input[type="file"]').count() == 0
        assert remove_buttons(member).count() == 0 and delete_buttons(member).count() == 1
        member.goto(f"{url}/?chat={chats['max']['id']}")  # another member's chat, by its id
        member.get_by_text("That chat no longer exists").wait_for()
        assert "max's question" not in member.content()

        member.reload()  # the session survives a reload
        member.get_by_placeholder(ASK).wait_for()
        assert "Signed in as" in sidebar_text(member)
        member.get_by_role("button", name="Sign out").click()
        member.get_by_role("button", name="Sign in").wait_for()
        member.reload()  # the cookie went with the session
        member.get_by_role("button", name="Sign in").wait_for()
        assert member.get_by_placeholder(ASK).count() == 0

        remove_buttons(owner).first.locator("button").first.click()  # the owner can, when
        confirm = owner.locator(f'{SIDEBAR} .stElementContainer[class*="st-key-confirm-remove-"]'
                                f' button')  # ... asked first
        confirm.first.wait_for()
        assert "larkspur.md" in sidebar_text(owner)
        confirm.first.click()
        owner.get_by_text("No documents yet").first.wait_for()
        for page in (owner, member):
            assert "$argon2" not in page.content()
    assert "$argon2" not in (tmp_path / "streamlit.log").read_text()
