"""The chat with accounts, under AppTest (one process, several browser sessions): nothing but
the sign-in form before signing in, a wrong password refused, members see only their own
chats (an id from another user's address finds nothing), only the owner gets the upload box
and remove buttons (a crafted click on the owner's button does nothing), a member with an
upload quota gets a personal collection that stops at the quota, members' limits on answer
length, queued answers and models are enforced by `ask` itself, and the audit log says who
uploaded and removed what. The settings sit under "Advanced"; the answer's speed is one line."""

from __future__ import annotations

import html

import pytest
from ui_support import METRICS_DOC, fast_page, tiny_model_folder

from ragspec.accounts import audit, policy
from ragspec.accounts.users import AccountStore, Quotas
from ragspec.web import answering
from ragspec.web import chats as ch
from ragspec.web.answer_queue import TurnQueue
from ragspec.web.model_choice import ModelChoice, ModelRegistry

PASSWORD = "correct horse battery"


@pytest.fixture
def site(tmp_path, monkeypatch):
    home = tmp_path / "home"
    fast_page(monkeypatch, home, models=[["tiny", str(tiny_model_folder(tmp_path / "tiny"))]],
              model_cache=tmp_path / "cache", auth="accounts")
    accounts = AccountStore(home / "accounts.json")
    accounts.add("olive", PASSWORD, "owner")
    accounts.add("mia", PASSWORD, "member")
    accounts.add("max", PASSWORD, "member", Quotas(upload_mb=0.001, queued=1, answer_tokens=64))
    return home


def signed_in(name: str, password: str = PASSWORD):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(__import__("ui_support").APP), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    at.text_input(key="sign-in-name").input(name)
    at.text_input(key="sign-in-password").input(password)
    at.button[0].click().run()
    assert not at.exception, at.exception
    return at


def texts(elements) -> list[str]:
    return [html.unescape(e.value).replace("\u2060", "") for e in elements]


def keys(at, prefix: str) -> list[str]:
    return [b.key for b in at.sidebar.button if (b.key or "").startswith(prefix)]


def test_nothing_but_the_sign_in_form_before_signing_in(site):
    at = signed_in("olive", "wrong password")
    assert "Wrong name or password." in texts(at.error)
    assert not at.chat_input and not at.sidebar.button and not at.file_uploader
    assert signed_in("nobody").error  # an unknown name: the same refusal
    at = signed_in("olive")
    assert at.chat_input and any("Signed in as" in m.value for m in at.sidebar.markdown)
    assert [e["action"] for e in audit.read()] == ["sign-in-failed", "sign-in-failed",
                                                   "sign-in"]
    at.button(key="sign-out").click().run()
    assert not at.chat_input and at.text_input(key="sign-in-name")
    assert audit.read()[-1] == {**audit.read()[-1], "user": "olive", "action": "sign-out"}


def test_members_see_only_their_own_chats(site):
    chats = ch.ChatStore(site / "chats")
    mine = ch.ChatStore(site / "chats", user="mia").create("Mia's question")
    theirs = ch.ChatStore(site / "chats", user="max").create("Max's question")
    legacy = chats.create("Before accounts")

    mia = signed_in("mia")
    assert keys(mia, "chat-") == [f"chat-{mine['id']}"]
    for crafted in (theirs["id"], legacy["id"]):  # another user's id typed into the address
        mia.query_params["chat"] = crafted
        mia.run()
        assert any("no longer exists" in t for t in texts(mia.warning))
        assert "chat" not in mia.query_params
    owner = signed_in("olive")
    assert sorted(keys(owner, "chat-")) == sorted([f"chat-{legacy['id']}"])
    assert chats.exists(theirs["id"])  # nothing was deleted along the way


def test_only_the_owner_manages_shared_documents_even_against_crafted_clicks(site):
    owner = signed_in("olive")
    owner.file_uploader[0].set_value(("metrics.md", METRICS_DOC, "text/markdown"))
    owner.run()
    assert any("metrics.md: added" in t for t in texts(owner.success))
    (remove,) = [b for b in owner.sidebar.button if (b.key or "").startswith("remove-")]

    member = signed_in("mia")
    assert not member.file_uploader and not keys(member, "remove-")
    assert any("metrics.md" in t for t in texts(member.sidebar.markdown))  # listed, read-only
    # A browser that sends the owner's remove button anyway (a forged widget trigger):
    states = member._tree.get_widget_states()
    forged = states.widgets.add()
    forged.id, forged.trigger_value = remove.id, True
    member._run(states)
    assert not member.exception, member.exception
    assert any("metrics.md" in t for t in texts(member.sidebar.markdown))

    remove.click()
    owner.run()
    assert keys(owner, "remove-")  # asked first (sidebar._confirm_remove)
    (confirm,) = [b for b in owner.sidebar.button if (b.key or "").startswith("confirm-remove-")]
    confirm.click()
    owner.run()
    assert not keys(owner, "remove-")
    entries = audit.read()
    assert [(e["user"], e["action"], e.get("name")) for e in entries
            if e["action"] in ("upload", "remove")] == [("olive", "upload", "metrics.md"),
                                                         ("olive", "remove", "metrics.md")]


def test_a_member_with_an_upload_quota_gets_a_personal_collection(site):
    AccountStore(site / "accounts.json").update("mia", quotas=Quotas(upload_mb=0.0002))
    mia = signed_in("mia")
    mia.radio(key="collection").set_value("mia").run()
    mia.file_uploader[0].set_value(("mine.md", METRICS_DOC, "text/markdown"))
    mia.run()
    assert any("mine.md: added" in t for t in texts(mia.success)), texts(mia.error)
    mia.file_uploader[0].set_value(("more.md", METRICS_DOC + b"\nMore.\n", "text/markdown"))
    mia.run()
    assert any("more.md" in t and "upload quota" in t for t in texts(mia.error))
    assert (site / "users" / "mia" / "uploads").is_dir()
    assert keys(mia, "remove-")  # her own documents she may remove

    owner = signed_in("olive")  # the shared collection does not hold her file
    assert not any("mine.md" in t for t in texts(owner.sidebar.markdown))
    max_ = signed_in("max")  # his own collection (he has a quota too) is his alone
    max_.radio(key="collection").set_value("max").run()
    assert not any("mine.md" in t for t in texts(max_.sidebar.markdown))
    assert [e["action"] for e in audit.read()].count("upload") == 1


def test_member_limits_are_enforced_by_ask_itself(tmp_path, monkeypatch):
    chats = ch.ChatStore(tmp_path, user="max")
    registry = ModelRegistry([ModelChoice("small", "a"), ModelChoice("big", "b")])
    member = policy.Principal("max", "member", Quotas(upload_mb=0, queued=1, answer_tokens=64))

    class Hold(TurnQueue):
        def submit(self, turn):
            turn._queue, turn.state = self, "waiting"
            return turn

    def ask(settings, chat_id=None):
        return answering.ask(chats, chat_id or chats.create()["id"], "Which port?", settings,
                             store=object(), models=registry, queue=Hold("test"),
                             principal=member)

    with pytest.raises(policy.QuotaExceeded, match="64 tokens"):
        ask(answering.AnswerSettings(model="small", max_new_tokens=65))
    with pytest.raises(policy.Denied, match="only an owner can load"):
        ask(answering.AnswerSettings(model="big", max_new_tokens=64))
    try:
        ask(answering.AnswerSettings(model="small", max_new_tokens=64))
        with pytest.raises(policy.QuotaExceeded, match="limit is 1"):
            ask(answering.AnswerSettings(model="small", max_new_tokens=64))
    finally:
        for job in list(answering.ACTIVE._jobs.values()):
            answering.ACTIVE.discard(job)


def test_the_page_offers_a_member_only_what_they_may_use(site):
    at = signed_in("max")
    assert at.selectbox(key="model").options == ["tiny"]
    assert at.number_input(key="max_new_tokens").max == 64
    assert at.number_input(key="max_new_tokens").value == 64


def test_engine_settings_sit_under_advanced_and_the_speed_is_one_line(tmp_path, monkeypatch):
    from ui_support import settle, tiny_page

    at = tiny_page(tmp_path, monkeypatch)
    (advanced,) = [e for e in at.sidebar.expander if e.label == "Advanced"]
    inside = {w.key for w in advanced.slider} | {w.key for w in advanced.number_input} \
        | {w.key for w in advanced.toggle} | {w.key for w in advanced.selectbox}
    assert inside == {"max_ngram", "max_draft", "k", "min_score", "temperature",
                      "max_new_tokens", "adaptive", "search"}
    outside = {w.key for w in at.sidebar.toggle} - inside
    assert outside == {"speculate", "side_by_side"} and at.selectbox(key="model")
    at.number_input(key="max_new_tokens").set_value(16)
    at.chat_input[0].set_value("On which port does the metrics endpoint listen?").run()
    settle(at)
    speed = [t for t in texts(at.caption) if "tokens/s" in t]
    assert len(speed) == 1 and "16 tokens in" in speed[0]
    assert [e.label for e in at.main.expander].count("Speculation stats") == 1
