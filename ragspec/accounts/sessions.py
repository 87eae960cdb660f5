"""Sign-in sessions: a random token in the browser, its SHA-256 and expiry on the server.

Contract:
  * `create(name)` makes a session for a user and returns its token (32 random bytes, hex)
    once; `$RAGSPEC_HOME/sessions.json` (0600) keeps only the token's SHA-256, the user's name
    and when it expires. A copied sessions file signs nobody in.
  * `user_for(token, accounts)` is the user the token signs in, or None when the token is
    unknown, revoked or expired, or its user no longer exists. Expired sessions are dropped.
  * `revoke(token)` ends one session (sign-out); `revoke_user(name)` ends all of a user's
    (a new password, a removed account): a session cannot outlive the reason it was granted.
  * Lifetime: RAGSPEC_SESSION_HOURS (default 168, one week), counted from sign-in.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path

from ragspec import paths
from ragspec.accounts.files import locked, read_json, write_private
from ragspec.accounts.users import AccountStore, User

FILE_NAME = "sessions.json"
LIFETIME_ENV = "RAGSPEC_SESSION_HOURS"
DEFAULT_HOURS = 168.0


def lifetime_seconds(environ=os.environ) -> float:
    raw = environ.get(LIFETIME_ENV)
    if not raw:
        return DEFAULT_HOURS * 3600
    try:
        hours = float(raw)
    except ValueError:
        raise ValueError(f"{LIFETIME_ENV}={raw!r} is not a number of hours") from None
    if hours <= 0:
        raise ValueError(f"{LIFETIME_ENV} must be > 0 hours, got {raw}")
    return hours * 3600


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class SessionStore:
    """See the module docstring. `clock` (seconds since the epoch) is replaceable for tests."""

    def __init__(self, path: str | Path | None = None, clock=time.time) -> None:
        self.path = Path(path) if path is not None else paths.home() / FILE_NAME
        self.clock = clock

    def _sessions(self) -> dict:
        return read_json(self.path, {}).get("sessions", {})

    def _change(self, change) -> object:
        with locked(self.path):
            sessions = self._sessions()
            now = self.clock()
            for key in [k for k, s in sessions.items() if s.get("expires_at", 0) <= now]:
                del sessions[key]
            result = change(sessions)
            write_private(self.path, {"format": "ragspec-sessions", "version": 1,
                                      "sessions": sessions})
        return result

    def create(self, name: str, lifetime: float | None = None) -> tuple[str, float]:
        """(token, seconds until it expires) for a new session of user `name`."""
        seconds = lifetime_seconds() if lifetime is None else lifetime
        token = secrets.token_hex(32)
        now = self.clock()
        self._change(lambda s: s.__setitem__(_digest(token), {
            "user": name, "created_at": now, "expires_at": now + seconds}))
        return token, seconds

    def user_for(self, token: str | None, accounts: AccountStore) -> User | None:
        if not token or not isinstance(token, str) or len(token) > 128:
            return None
        entry = self._sessions().get(_digest(token))
        if entry is None:
            return None
        if entry.get("expires_at", 0) <= self.clock():
            self.revoke(token)
            return None
        return accounts.get(entry.get("user"))

    def revoke(self, token: str) -> None:
        self._change(lambda s: s.pop(_digest(token), None))

    def revoke_user(self, name: str) -> int:
        def revoke(sessions: dict) -> int:
            mine = [k for k, s in sessions.items() if s.get("user") == name]
            for key in mine:
                del sessions[key]
            return len(mine)

        return self._change(revoke)
