"""Accounts on their own: argon2id password hashes in a 0600 file, hashed API keys and
`authenticate_api_key`, sessions that expire and end with a new password, roles and quotas,
the binding rule, `ragspec users ...`, and `ragspec ui` refusing a network address without an
account (a real start) or warning with --no-auth. No hash or key is ever printed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_ui_command import started  # noqa: F401 (a fixture: records what `ragspec ui` runs)

from ragspec.accounts import audit, policy
from ragspec.accounts.api_keys import authenticate_api_key
from ragspec.accounts.binding import BindingRefused, auth_mode, is_loopback
from ragspec.accounts.files import AccountError
from ragspec.accounts.sessions import SessionStore
from ragspec.accounts.users import AccountStore, Quotas
from ragspec.cli import main

PASSWORD = "correct horse battery"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    return tmp_path


def test_passwords_are_argon2_hashes_in_a_private_file(home):
    store = AccountStore()
    owner = store.add("olive", PASSWORD)
    member = store.add("mia", "another password")
    assert (owner.role, member.role) == ("owner", "member")  # the first account is the owner
    assert member.quotas == Quotas(upload_mb=0, queued=2, answer_tokens=512)
    path = home / "accounts.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert PASSWORD not in text and text.count("$argon2id$") == 2
    assert store.verify_password("olive", PASSWORD) == owner
    assert store.verify_password("olive", PASSWORD + "!") is None
    assert store.verify_password("nobody", PASSWORD) is None
    assert "argon2" not in json.dumps([u.to_dict() for u in store.users()])
    with pytest.raises(AccountError, match="already"):
        store.add("mia", PASSWORD)
    with pytest.raises(AccountError, match="too short"):
        store.add("max", "short")
    for bad in ("../x", "", "a b", "x" * 41):
        with pytest.raises(AccountError, match="not a valid user name"):
            store.add(bad, PASSWORD)


def test_the_only_owner_cannot_be_removed_or_demoted_while_others_remain(home):
    store = AccountStore()
    store.add("olive", PASSWORD)
    store.add("mia", PASSWORD)
    with pytest.raises(AccountError, match="only owner"):
        store.remove("olive")
    with pytest.raises(AccountError, match="only owner"):
        store.update("olive", role="member")
    store.update("mia", role="owner")
    store.remove("olive")
    assert [u.name for u in store.users()] == ["mia"]


def test_api_keys_are_stored_hashed_and_authenticate_their_user(home):
    store = AccountStore()
    store.add("olive", PASSWORD)
    key = store.create_key("olive")
    assert key.startswith("rsk_") and key not in (home / "accounts.json").read_text()
    assert authenticate_api_key(f"Bearer {key}").name == "olive"
    assert authenticate_api_key(key).name == "olive"
    assert authenticate_api_key(f"bearer   {key}  ").name == "olive"
    for bad in (None, "", "Bearer", f"Bearer {key[:-1]}x", f"Basic {key}", key + "x",
                "Bearer rsk_00000000_" + "A" * 43, "\x00" * 10):
        assert authenticate_api_key(bad) is None, bad
    assert store.revoke_keys("olive") == 1
    assert authenticate_api_key(f"Bearer {key}") is None
    key2 = store.create_key("olive")
    store.add("mia", PASSWORD)
    store.update("mia", role="owner")
    store.remove("olive")
    assert authenticate_api_key(f"Bearer {key2}") is None  # a removed user's key is dead


def test_sessions_expire_and_end_with_a_new_password(home):
    accounts = AccountStore()
    accounts.add("olive", PASSWORD)
    now = [1_000_000.0]
    sessions = SessionStore(clock=lambda: now[0])
    token, seconds = sessions.create("olive", lifetime=3600)
    assert seconds == 3600 and token not in (home / "sessions.json").read_text()
    assert stat.S_IMODE((home / "sessions.json").stat().st_mode) == 0o600
    assert sessions.user_for(token, accounts).name == "olive"
    now[0] += 3601
    assert sessions.user_for(token, accounts) is None  # expired
    token, _ = sessions.create("olive", lifetime=3600)
    assert sessions.revoke_user("olive") == 1
    assert sessions.user_for(token, accounts) is None
    token, _ = sessions.create("olive", lifetime=3600)
    sessions.revoke(token)
    assert sessions.user_for(token, accounts) is None
    assert sessions.user_for("not a token", accounts) is None


def test_roles_and_quotas():
    owner = policy.Principal("olive", "owner")
    member = policy.Principal("mia", "member", Quotas(upload_mb=0, queued=2, answer_tokens=512))
    uploader = policy.Principal("max", "member", Quotas(upload_mb=1, queued=1))
    policy.require_manage(owner, policy.SHARED)
    for who, collection in ((member, policy.SHARED), (member, "mia"), (uploader, "mia"),
                            (uploader, policy.SHARED)):
        with pytest.raises(policy.Denied):
            policy.require_manage(who, collection)
    policy.require_manage(uploader, "max")
    assert policy.collections(member) == [policy.SHARED]
    assert policy.collections(uploader) == [policy.SHARED, "max"]
    with pytest.raises(policy.QuotaExceeded, match="1.0 MB|1 MB|MiB"):
        policy.check_upload(uploader, 2**20 - 10, 11)
    policy.check_upload(uploader, 2**20 - 10, 10)
    with pytest.raises(policy.QuotaExceeded, match="limit is 2"):
        policy.check_queue(member, 2)
    with pytest.raises(policy.QuotaExceeded, match="512 tokens"):
        policy.check_answer_tokens(member, 513)
    policy.check_answer_tokens(owner, 10**6)
    with pytest.raises(policy.Denied, match="only an owner can load"):
        policy.require_model(member, "big", "small", ["small"])
    policy.require_model(member, "big", "small", ["small", "big"])
    assert policy.may_see_chat(owner, None) and not policy.may_see_chat(member, None)
    assert not policy.may_see_chat(member, "max") and policy.may_see_chat(member, "mia")
    assert policy.may_see_chat(policy.Principal.single_user(), "anyone")


@pytest.mark.parametrize("host, loopback", [
    ("localhost", True), ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("myhost.example", False),
])
def test_the_binding_rule(host, loopback):
    assert is_loopback(host) is loopback
    assert auth_mode(host, False, True) == "accounts"
    assert auth_mode(host, True, False) == "open"
    if loopback:
        assert auth_mode(host, False, False) == "single-user"
    else:
        with pytest.raises(BindingRefused, match="ragspec users add"):
            auth_mode(host, False, False)


# -- the command line ----------------------------------------------------------------------------

def invoke(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def test_users_add_list_set_passwd_key_remove(home):
    added = invoke("users", "add", "olive", "--password-stdin", input=PASSWORD + "\n")
    assert added.exit_code == 0, added.output
    assert "olive  owner" in added.output
    added = invoke("users", "add", "mia", "--password-stdin", "--upload-mb", "5", "--json",
                   input="mia's password\n")
    assert json.loads(added.output)["quotas"] == {"upload_mb": 5.0, "queued": 2,
                                                  "answer_tokens": 512}
    prompted = invoke("users", "add", "max", input="max password\nmax password\n")
    assert prompted.exit_code == 0 and "max  member" in prompted.output
    assert invoke("users", "add", "max", "--password-stdin", input="whatever1\n").exit_code == 1

    listed = json.loads(invoke("users", "list", "--json").output)
    assert [(u["name"], u["role"]) for u in listed] == [("max", "member"), ("mia", "member"),
                                                        ("olive", "owner")]
    changed = invoke("users", "set", "mia", "--max-queued", "none", "--max-answer-tokens", "64",
                     "--json")
    assert json.loads(changed.output)["quotas"]["queued"] is None
    assert invoke("users", "set", "mia", "--max-queued", "lots").exit_code == 2

    sessions = SessionStore()
    token, _ = sessions.create("mia")
    changed = invoke("users", "passwd", "mia", "--password-stdin", input="a new password\n")
    assert changed.exit_code == 0 and "1 session ended" in changed.output
    assert sessions.user_for(token, AccountStore()) is None
    assert AccountStore().verify_password("mia", "a new password").name == "mia"

    made = invoke("users", "key", "mia")
    key = made.stdout.strip()
    assert made.exit_code == 0 and authenticate_api_key(f"Bearer {key}").name == "mia"
    assert invoke("users", "key", "mia", "--revoke").exit_code == 0
    assert authenticate_api_key(key) is None

    assert invoke("users", "remove", "olive").exit_code == 1  # the only owner
    assert invoke("users", "remove", "max").exit_code == 0
    assert invoke("users", "remove", "max").exit_code == 1
    # nothing the commands print or log holds a hash or the key
    everything = "".join(r.output for r in (added, prompted, changed, made))
    everything += invoke("users", "list").output + (home / "audit.jsonl").read_text()
    assert "argon2" not in everything and key not in (home / "audit.jsonl").read_text()
    assert stat.S_IMODE((home / "audit.jsonl").stat().st_mode) == 0o600
    actions = [e["action"] for e in audit.read()]
    assert actions.count("user-add") == 3 and "key-create" in actions and "password" in actions


def test_ui_on_a_network_address_without_an_account_refuses_to_start(home, tmp_path):
    """The real command, as a user would type it: it exits with a usage error instead of
    serving (no Streamlit process is started)."""
    env = {**os.environ, "RAGSPEC_HOME": str(home)}
    env.pop("RAGSPEC_AUTH", None)
    ragspec = str(Path(sys.executable).with_name("ragspec"))
    proc = subprocess.run([ragspec, "ui", "--host", "0.0.0.0", "--port", "1"], env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to serve on 0.0.0.0" in proc.stderr and "ragspec users add" in proc.stderr
    assert "Starting ragspec" not in proc.stderr


def test_ui_no_auth_warns_on_every_start_and_accounts_turn_sign_in_on(home, started):  # noqa: F811
    for _ in range(2):
        result = CliRunner().invoke(main, ["ui", "--host", "0.0.0.0", "--no-auth"])
        assert result.exit_code == 0 and "warning: --no-auth" in result.output
    assert [env["RAGSPEC_AUTH"] for _, _, env in started] == ["open", "open"]
    result = CliRunner().invoke(main, ["ui"])  # loopback, no account: single-user as before
    assert result.exit_code == 0 and "warning" not in result.output
    result = CliRunner().invoke(main, ["ui"], env={"RAGSPEC_SESSION_HOURS": "soon"})
    assert result.exit_code == 2 and "RAGSPEC_SESSION_HOURS" in result.output
    assert len(started) == 3
    AccountStore().add("olive", PASSWORD)
    for host in ("0.0.0.0", "localhost"):
        result = CliRunner().invoke(main, ["ui", "--host", host])
        assert result.exit_code == 0 and "everyone signs in" in result.output
    assert [env["RAGSPEC_AUTH"] for _, _, env in started[2:]] == ["single-user", "accounts",
                                                                 "accounts"]


def test_sign_in_is_throttled_after_repeated_failures():
    from ragspec.accounts.throttle import SignInThrottle

    now = [0.0]
    throttle = SignInThrottle(attempts=3, window=60, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.wait("olive") == 0
        throttle.failed("olive")
        now[0] += 1
    assert throttle.wait("olive") == pytest.approx(57)  # the first failure leaves at t=60
    assert throttle.wait("mia") == 0  # other names are not affected
    now[0] = 60.5
    assert throttle.wait("olive") == 0
    throttle.failed("olive")
    throttle.succeeded("olive")
    assert throttle.wait("olive") == 0


def test_an_audit_line_that_does_not_fit_is_not_left_half_written(tmp_path, monkeypatch, caplog):
    """A full disk takes part of the line (a short write), then refuses the rest: the part is
    cut off, the log stays readable, the failure is one line in the server's log."""
    import errno
    import os

    monkeypatch.setenv("RAGSPEC_HOME", str(tmp_path))
    audit.record("sign-in", "ann")
    log = audit.log_path()
    before = log.read_bytes()
    real = os.write
    calls = []

    def short_then_full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_full)
    audit.record("upload", "ann", name="report.pdf")
    monkeypatch.setattr(os, "write", real)
    assert log.read_bytes() == before
    assert [e["action"] for e in audit.read(log)] == ["sign-in"]
    assert "the disk is full" in caplog.text
