"""Who may reach a server decides whether it needs accounts.

Contract: `auth_mode(host, no_auth, has_accounts)`:
  * "accounts" when accounts exist (and --no-auth was not given): everyone signs in;
  * "single-user" on a loopback address without accounts: today's one-person mode;
  * "open" with --no-auth: no sign-in on any address (the caller warns on every start);
  * otherwise (another address, no account) `BindingRefused`, whose message says how to add
    an account or pass --no-auth.
The chat (`ragspec ui`) and the HTTP server use the same rule.
"""

from __future__ import annotations

import ipaddress

MODE_ENV = "RAGSPEC_AUTH"
MODES = ("accounts", "single-user", "open")
NO_AUTH_WARNING = ("warning: --no-auth: no sign-in; everyone who can reach {where} can read and "
                   "delete every chat, add and remove documents and use every model")


class BindingRefused(ValueError):
    """Serving on this address needs an account first."""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (localhost, 127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost.localdomain") or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def auth_mode(host: str, no_auth: bool, has_accounts: bool) -> str:
    if no_auth:
        return "open"
    if has_accounts:
        return "accounts"
    if is_loopback(host):
        return "single-user"
    raise BindingRefused(
        f"refusing to serve on {host}, which other machines can reach, without an account: "
        f"add one with `ragspec users add NAME` (the first user is the owner), or pass "
        f"--no-auth to serve without sign-in")
