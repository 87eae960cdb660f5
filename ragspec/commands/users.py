"""`ragspec users add | list | set | passwd | remove | key`: the accounts of the chat and the API.

Accounts live in $RAGSPEC_HOME/accounts.json (0600; argon2id password hashes, hashed API keys).
The first account is an owner; later ones are members unless `--role owner`. Passwords are
typed twice at a hidden prompt, or read as one line from standard input with
`--password-stdin` (for scripts). Changing a password or removing a user ends their sessions.
Nothing here prints a password hash; `key` prints a new API key once.
"""

from __future__ import annotations

import json
import sys

import click

from ragspec.commands.common import json_option

ROLE_CHOICE = click.Choice(["owner", "member"])


class Limit(click.ParamType):
    """A number, or "none" for no limit."""

    name = "LIMIT"

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() in ("none", "unlimited"):
            return "none"
        try:
            return self.kind(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number (or 'none' for no limit)", param, ctx)


def quota_options(f):
    f = click.option("--max-answer-tokens", type=Limit(int), default=None,
                     help="Longest answer the user may ask for, in tokens ('none': no limit; "
                          "members default to 512).")(f)
    f = click.option("--max-queued", type=Limit(int), default=None,
                     help="Answers the user may have waiting or being written at once "
                          "('none': no limit; members default to 2).")(f)
    f = click.option("--upload-mb", type=Limit(float), default=None,
                     help="Megabytes the user's personal collection may hold; 0 (the default "
                          "for members) allows no uploads ('none': no limit).")(f)
    return f


def _quotas(base, upload_mb, max_queued, max_answer_tokens):
    from dataclasses import asdict

    from ragspec.accounts.users import Quotas

    values = asdict(base)
    for key, value in (("upload_mb", upload_mb), ("queued", max_queued),
                       ("answer_tokens", max_answer_tokens)):
        if value is not None:
            values[key] = None if value == "none" else value
    try:
        return Quotas(**values)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


def _accounts():
    from ragspec.accounts.users import AccountStore

    return AccountStore()


def _fail(exc: Exception):
    return click.ClickException(str(exc))


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        if not line:
            raise click.UsageError("--password-stdin: standard input is empty")
        return line.rstrip("\r\n")
    return click.prompt("Password", hide_input=True, confirmation_prompt=True)


def _audit(action: str, **details) -> None:
    import getpass

    from ragspec.accounts import audit

    try:
        actor = getpass.getuser()
    except (KeyError, OSError):
        actor = "unknown"
    audit.record(action, f"cli:{actor}", **details)


def _describe(user) -> str:
    q = user.quotas

    def show(value, unit=""):
        return "no limit" if value is None else f"{value:g}{unit}"

    return (f"{user.name}  {user.role:<6}  uploads {show(q.upload_mb, ' MB')}, "
            f"queued {show(q.queued)}, answer tokens {show(q.answer_tokens)}, "
            f"{user.keys} API key{'s' if user.keys != 1 else ''}")


@click.group("users")
def users() -> None:
    """Manage the accounts that sign in to the chat and the API."""


@users.command("add")
@click.argument("name")
@click.option("--role", type=ROLE_CHOICE, default=None,
              help="owner: manages documents, users and models; member: asks, sees only their "
                   "own chats. Default: owner for the first account, member after.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@quota_options
@json_option
def add(name, role, password_stdin, upload_mb, max_queued, max_answer_tokens, as_json):
    """Add an account (asks for its password)."""
    from ragspec.accounts.files import AccountError
    from ragspec.accounts.users import DEFAULT_QUOTAS, check_name

    store = _accounts()
    try:
        check_name(name)
        chosen = role or ("member" if store.has_accounts() else "owner")
        quotas = _quotas(DEFAULT_QUOTAS[chosen], upload_mb, max_queued, max_answer_tokens)
        password = _read_password(password_stdin)
        user = store.add(name, password, chosen, quotas)
    except AccountError as exc:
        raise _fail(exc) from exc
    _audit("user-add", target=user.name, role=user.role)
    click.echo(json.dumps(user.to_dict()) if as_json else f"Added {_describe(user)}")


@users.command("list")
@json_option
def list_users(as_json):
    """The accounts: name, role, quotas, number of API keys (never a hash)."""
    from ragspec.accounts.files import AccountError

    try:
        found = _accounts().users()
    except AccountError as exc:
        raise _fail(exc) from exc
    if as_json:
        click.echo(json.dumps([u.to_dict() for u in found], indent=1))
        return
    if not found:
        click.echo("No accounts: `ragspec ui` runs in single-user mode on this machine only. "
                   "Add one with `ragspec users add NAME`.")
    for user in found:
        click.echo(_describe(user))


@users.command("set")
@click.argument("name")
@click.option("--role", type=ROLE_CHOICE, default=None, help="Change the role.")
@quota_options
@json_option
def set_user(name, role, upload_mb, max_queued, max_answer_tokens, as_json):
    """Change an account's role or quotas (options left out stay as they are)."""
    from ragspec.accounts.files import AccountError

    store = _accounts()
    try:
        user = store.get(name)
        if user is None:
            raise AccountError(f"no user {name!r} (`ragspec users list` shows them)")
        quotas = _quotas(user.quotas, upload_mb, max_queued, max_answer_tokens)
        user = store.update(name, role=role, quotas=quotas)
    except AccountError as exc:
        raise _fail(exc) from exc
    _audit("user-set", target=name, role=user.role)
    click.echo(json.dumps(user.to_dict()) if as_json else f"Now {_describe(user)}")


@users.command("passwd")
@click.argument("name")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
def passwd(name, password_stdin):
    """Set an account's password; its open sessions end."""
    from ragspec.accounts.files import AccountError
    from ragspec.accounts.sessions import SessionStore

    store = _accounts()
    try:
        if store.get(name) is None:
            raise AccountError(f"no user {name!r} (`ragspec users list` shows them)")
        store.set_password(name, _read_password(password_stdin))
        ended = SessionStore().revoke_user(name)
    except AccountError as exc:
        raise _fail(exc) from exc
    _audit("password", target=name)
    click.echo(f"Password changed for {name}; {ended} session{'s' if ended != 1 else ''} ended")


@users.command("remove")
@click.argument("name")
@json_option
def remove(name, as_json):
    """Remove an account, its API keys and sessions. Its chats and personal documents stay on
    disk ($RAGSPEC_HOME/chats, $RAGSPEC_HOME/users/NAME) until you delete them."""
    from ragspec.accounts.files import AccountError
    from ragspec.accounts.sessions import SessionStore

    try:
        _accounts().remove(name)
        SessionStore().revoke_user(name)
    except AccountError as exc:
        raise _fail(exc) from exc
    _audit("user-remove", target=name)
    click.echo(json.dumps({"removed": name}) if as_json else f"Removed {name}")


@users.command("key")
@click.argument("name")
@click.option("--revoke", is_flag=True, help="Revoke all of NAME's API keys instead.")
@json_option
def key(name, revoke, as_json):
    """Make an API key for NAME (printed once: store it now), or revoke NAME's keys.

    Clients send it as `Authorization: Bearer KEY`. Only its SHA-256 is stored.
    """
    from ragspec.accounts.files import AccountError

    store = _accounts()
    try:
        if revoke:
            count = store.revoke_keys(name)
        else:
            new_key = store.create_key(name)
    except AccountError as exc:
        raise _fail(exc) from exc
    if revoke:
        _audit("key-revoke", target=name, keys=count)
        click.echo(json.dumps({"user": name, "revoked": count}) if as_json
                   else f"Revoked {count} API key{'s' if count != 1 else ''} of {name}")
        return
    _audit("key-create", target=name, key_id=new_key.split("_")[1])
    if as_json:
        click.echo(json.dumps({"user": name, "key": new_key}))
    else:
        click.echo(f"API key for {name} (shown once; send it as `Authorization: Bearer KEY`):",
                   err=True)
        click.echo(new_key)


COMMANDS = [users]
