"""Sign-in for the chat page: who is asking, a sign-in form, the session cookie, sign-out.

Contract:
  * The mode comes from `ragspec ui` (RAGSPEC_AUTH, see ragspec.accounts.binding). A page
    started some other way (`streamlit run`) decides itself: accounts exist -> sign-in; none ->
    single-user only when Streamlit listens on a loopback address, else it refuses to serve.
  * `gate()` returns the `Principal` of this browser session, or shows the sign-in form and
    stops the script run: nothing below it runs for a visitor who has not signed in, whatever
    requests the browser crafts.
  * A session is a random token (ragspec.accounts.sessions): kept in the browser as the cookie
    `ragspec_session` (SameSite=Strict; Secure on https; it expires with the session) and
    checked against the server's session file on every script run, so a sign-out elsewhere,
    a new password, a removed account or an expired session takes effect on the next click.
    Streamlit reads cookies from the request that opened the page (st.context.cookies), so a
    reload signs back in without a round trip; the page sets and clears the cookie with a
    small script of its own (no user text in it).
  * Sign-in and sign-out are in the audit log; a failed sign-in names the attempted user only.
    After 5 failed sign-ins for one name in 5 minutes, that name is refused without checking
    the password until the oldest failure is 5 minutes old (ragspec.accounts.throttle).
"""

from __future__ import annotations

import os

import streamlit as st

from ragspec.accounts import audit
from ragspec.accounts.binding import MODE_ENV, MODES, BindingRefused, auth_mode
from ragspec.accounts.policy import Principal
from ragspec.accounts.sessions import SessionStore
from ragspec.accounts.throttle import THROTTLE
from ragspec.accounts.users import AccountStore, User

COOKIE = "ragspec_session"
_TOKEN = "ragspec_session_token"
_COOKIE_SCRIPT = "ragspec_cookie_script"
_SIGNED_OUT = "ragspec_signed_out"


def mode() -> str:
    chosen = os.environ.get(MODE_ENV)
    if chosen in MODES:
        return chosen
    host = st.get_option("server.address") or "0.0.0.0"  # unset: Streamlit listens everywhere
    try:
        return auth_mode(host, False, AccountStore().has_accounts())
    except BindingRefused as exc:
        st.error(str(exc).replace("--no-auth", "`ragspec ui --no-auth`"))
        st.stop()


def _session_user(token: str | None) -> User | None:
    return SessionStore().user_for(token, AccountStore()) if token else None


def principal() -> Principal | None:
    """Who this browser session acts for (None: nobody has signed in)."""
    if mode() != "accounts":
        return Principal.single_user()
    token = st.session_state.get(_TOKEN)
    if token is None and not st.session_state.get(_SIGNED_OUT):
        token = st.context.cookies.get(COOKIE)
    user = _session_user(token)
    if user is None:
        st.session_state.pop(_TOKEN, None)
        return None
    st.session_state[_TOKEN] = token
    return Principal.of(user)


def _cookie_script() -> None:
    """Set or clear the session cookie once, after a sign-in or a sign-out."""
    pending = st.session_state.pop(_COOKIE_SCRIPT, None)
    if pending is None:
        return
    token, seconds = pending  # the token is hex digits: nothing in it can break the script
    value = f"{COOKIE}={token}; Path=/; Max-Age={int(seconds)}; SameSite=Strict"
    st.html(f"<script>document.cookie = '{value}' + (location.protocol === 'https:' ? "
            f"'; Secure' : '');</script>", unsafe_allow_javascript=True)


def _sign_in(name: str, password: str) -> None:
    pause = THROTTLE.wait(name)
    if pause:
        audit.record("sign-in-failed", name[:64], reason="too many failed attempts")
        st.session_state["ragspec_sign_in_error"] = (
            f"Too many failed sign-ins for this name; try again in {pause / 60:.0f} min.")
        return
    user = AccountStore().verify_password(name, password) if name and password else None
    if user is None:
        THROTTLE.failed(name)
        audit.record("sign-in-failed", name[:64] if name else "")
        st.session_state["ragspec_sign_in_error"] = "Wrong name or password."
        return
    THROTTLE.succeeded(name)
    token, seconds = SessionStore().create(user.name)
    st.session_state[_TOKEN] = token
    st.session_state[_COOKIE_SCRIPT] = (token, seconds)
    st.session_state.pop(_SIGNED_OUT, None)
    audit.record("sign-in", user.name)


def sign_in_form() -> None:
    st.title("ragspec")
    st.subheader("Sign in")
    with st.form("sign-in"):
        name = st.text_input("Name", key="sign-in-name")
        password = st.text_input("Password", type="password", key="sign-in-password")
        submitted = st.form_submit_button("Sign in")
    if submitted:
        _sign_in(name.strip(), password)
        error = st.session_state.pop("ragspec_sign_in_error", None)
        if error:
            st.error(error)
        else:
            st.rerun()
    st.caption("Accounts are made by the server's owner (`ragspec users add NAME`).")


def gate() -> Principal:
    """The signed-in principal, or the sign-in form and the end of this script run."""
    who = principal()
    _cookie_script()
    if who is None:
        sign_in_form()
        st.stop()
    return who


def sign_out() -> None:
    token = st.session_state.pop(_TOKEN, None)
    if token:
        user = _session_user(token)
        SessionStore().revoke(token)
        audit.record("sign-out", user.name if user else "")
    st.session_state[_SIGNED_OUT] = True
    st.session_state[_COOKIE_SCRIPT] = ("", 0)


def account_box(who: Principal) -> None:
    """Who is signed in, and the sign-out button (nothing in the single-user mode)."""
    if who.name is None:
        return
    left, right = st.columns([3, 2])
    left.markdown(f"Signed in as **{_escaped(who.name)}** ({who.role})")
    right.button("Sign out", key="sign-out", on_click=sign_out, use_container_width=True)


def _escaped(text: str) -> str:
    from ragspec.web.page_html import escape_text

    return escape_text(text, inline=True)
