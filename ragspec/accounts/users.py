"""The accounts of one ragspec installation: names, roles, quotas, password hashes, API keys.

Contract:
  * Stored in `$RAGSPEC_HOME/accounts.json` (0600, see ragspec.accounts.files):
        {"format": "ragspec-accounts", "version": 1,
         "users": {NAME: {"role", "created_at", "quotas": {...}, "password": ARGON2_HASH,
                          "keys": [{"id", "sha256", "created_at"}]}}}
  * Passwords are hashed with argon2id (argon2-cffi's defaults, which follow RFC 9106's
    recommendation); an old hash is upgraded on the next successful sign-in. A name that does
    not exist costs a sign-in as much time as a wrong password, so timing does not tell which
    names exist.
  * API keys look like `rsk_<id>_<secret>`: 8 hex digits that name the key, then 32 random
    bytes. Only the SHA-256 of the whole key is stored: a key carries 256 random bits, so a
    slow hash adds nothing but time to every request (the reason passwords get argon2).
    `create_key` returns the key once; nothing can show it again.
  * `User` objects carry no secret: listing, logging or rendering one cannot leak a hash.
  * Every change is a read-modify-write under the file's lock.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ragspec import paths
from ragspec.accounts.files import AccountError, locked, read_json, write_private

FORMAT, VERSION = "ragspec-accounts", 1
FILE_NAME = "accounts.json"
ROLES = ("owner", "member")
MIN_PASSWORD = 8
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")
KEY_PREFIX = "rsk_"
_KEY = re.compile(r"^rsk_([0-9a-f]{8})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class Quotas:
    """Per-user limits; None means no limit.

    upload_mb: megabytes the user's personal collection may hold (0: no personal uploads).
    queued: answers the user may have waiting or being written at once.
    answer_tokens: the longest answer the user may ask for.
    """

    upload_mb: float | None = None
    queued: int | None = None
    answer_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.upload_mb is not None and self.upload_mb < 0:
            raise ValueError(f"the upload quota must be >= 0 MB, got {self.upload_mb}")
        if self.queued is not None and self.queued < 1:
            raise ValueError(f"the queued-answers quota must be >= 1, got {self.queued}")
        if self.answer_tokens is not None and self.answer_tokens < 8:
            raise ValueError(f"the answer-length quota must be >= 8 tokens, "
                             f"got {self.answer_tokens}")

    @property
    def upload_bytes(self) -> int | None:
        return None if self.upload_mb is None else int(self.upload_mb * 2**20)


# An owner has no limits; a member may have two answers queued at once, 512 tokens each, and
# uploads nothing until the owner grants an upload quota.
DEFAULT_QUOTAS = {"owner": Quotas(), "member": Quotas(upload_mb=0, queued=2, answer_tokens=512)}


@dataclass(frozen=True)
class User:
    """An account as the rest of ragspec sees it: no password hash, no key."""

    name: str
    role: str
    quotas: Quotas = field(default_factory=Quotas)
    created_at: str = ""
    keys: int = 0

    @property
    def is_owner(self) -> bool:
        return self.role == "owner"

    def to_dict(self) -> dict:
        return {"name": self.name, "role": self.role, "quotas": asdict(self.quotas),
                "created_at": self.created_at, "keys": self.keys}


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise AccountError(f"{name!r} is not a valid user name: 1-40 letters, digits, '.', "
                           f"'_' or '-', starting with a letter or digit")
    return name


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD:
        raise AccountError(f"the password is too short: use at least {MIN_PASSWORD} characters")
    return password


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _hasher():
    from argon2 import PasswordHasher

    return PasswordHasher()


def _key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class AccountStore:
    """See the module docstring. `path` defaults to $RAGSPEC_HOME/accounts.json."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else paths.home() / FILE_NAME
        self._dummy_hash: str | None = None

    # -- reading --------------------------------------------------------------------------------

    def _data(self) -> dict:
        data = read_json(self.path, {"format": FORMAT, "version": VERSION, "users": {}})
        if data.get("format") != FORMAT or not isinstance(data.get("users"), dict):
            raise AccountError(f"{self.path.name} in the data directory is not a ragspec "
                               f"accounts file")
        if data.get("version") != VERSION:
            raise AccountError(f"{self.path.name} has version {data.get('version')!r}; this "
                               f"ragspec reads version {VERSION}")
        return data

    @staticmethod
    def _user(name: str, entry: dict) -> User:
        quotas = Quotas(**{k: v for k, v in (entry.get("quotas") or {}).items()
                           if k in ("upload_mb", "queued", "answer_tokens")})
        return User(name, entry["role"], quotas, entry.get("created_at", ""),
                    len(entry.get("keys") or []))

    def users(self) -> list[User]:
        return [self._user(n, e) for n, e in sorted(self._data()["users"].items())]

    def get(self, name: str | None) -> User | None:
        entry = self._data()["users"].get(name) if name else None
        return self._user(name, entry) if entry else None

    def has_accounts(self) -> bool:
        return bool(self._data()["users"])

    # -- changing -------------------------------------------------------------------------------

    def _change(self, change) -> object:
        with locked(self.path):
            data = self._data()
            result = change(data["users"])
            write_private(self.path, data)
        return result

    def add(self, name: str, password: str, role: str | None = None,
            quotas: Quotas | None = None) -> User:
        """A new account. role None: "owner" for the first account, "member" after that."""
        check_name(name)
        check_password(password)
        if role is not None and role not in ROLES:
            raise AccountError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
        hashed = _hasher().hash(password)

        def add(users: dict) -> User:
            if name in users:
                raise AccountError(f"there is already a user {name!r}")
            chosen = role or ("member" if users else "owner")
            entry = {"role": chosen, "created_at": _now(),
                     "quotas": asdict(quotas or DEFAULT_QUOTAS[chosen]), "password": hashed,
                     "keys": []}
            users[name] = entry
            return self._user(name, entry)

        return self._change(add)

    def update(self, name: str, *, role: str | None = None, quotas: Quotas | None = None) -> User:
        """Change a user's role and/or quotas; the last owner cannot become a member."""
        if role is not None and role not in ROLES:
            raise AccountError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")

        def update(users: dict) -> User:
            entry = self._entry(users, name)
            if role == "member" and entry["role"] == "owner":
                self._keep_an_owner(users, name)
            if role is not None:
                entry["role"] = role
            if quotas is not None:
                entry["quotas"] = asdict(quotas)
            return self._user(name, entry)

        return self._change(update)

    def set_password(self, name: str, password: str) -> None:
        check_password(password)
        hashed = _hasher().hash(password)
        self._change(lambda users: self._entry(users, name).update(password=hashed))

    def remove(self, name: str) -> None:
        """Remove an account (its keys with it). The last owner stays while others remain."""
        def remove(users: dict) -> None:
            entry = self._entry(users, name)
            if entry["role"] == "owner" and len(users) > 1:
                self._keep_an_owner(users, name)
            del users[name]

        self._change(remove)

    @staticmethod
    def _entry(users: dict, name: str) -> dict:
        if name not in users:
            raise AccountError(f"no user {name!r} (`ragspec users list` shows them)")
        return users[name]

    @staticmethod
    def _keep_an_owner(users: dict, name: str) -> None:
        if not [n for n, e in users.items() if e["role"] == "owner" and n != name]:
            raise AccountError(f"{name} is the only owner; make another user an owner first "
                               f"(`ragspec users set OTHER --role owner`)")

    # -- checking -------------------------------------------------------------------------------

    def verify_password(self, name: str, password: str) -> User | None:
        """The user when `password` is theirs, else None (unknown names cost the same time)."""
        from argon2.exceptions import InvalidHashError, VerificationError

        hasher = _hasher()
        entry = self._data()["users"].get(name) if isinstance(name, str) else None
        if entry is None:
            if self._dummy_hash is None:
                self._dummy_hash = hasher.hash(secrets.token_hex(16))
            try:
                hasher.verify(self._dummy_hash, password)
            except VerificationError:
                pass
            return None
        try:
            hasher.verify(entry["password"], password)
        except (VerificationError, InvalidHashError):
            return None
        if hasher.check_needs_rehash(entry["password"]):
            fresh = hasher.hash(password)
            self._change(lambda users: users.get(name, {}).update(password=fresh))
        return self._user(name, entry)

    # -- API keys -------------------------------------------------------------------------------

    def create_key(self, name: str) -> str:
        """A new API key for `name`, returned once (only its SHA-256 is kept)."""
        key_id = secrets.token_hex(4)
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        digest = _key_digest(key)
        self._change(lambda users: self._entry(users, name)["keys"].append(
            {"id": key_id, "sha256": digest, "created_at": _now()}))
        return key

    def revoke_keys(self, name: str) -> int:
        """Remove every API key of `name`; returns how many there were."""
        def revoke(users: dict) -> int:
            entry = self._entry(users, name)
            count = len(entry.get("keys") or [])
            entry["keys"] = []
            return count

        return self._change(revoke)

    def verify_key(self, key: str) -> User | None:
        """The user whose API key this is, else None."""
        match = _KEY.match(key or "")
        if not match:
            return None
        digest = _key_digest(key)
        for name, entry in self._data()["users"].items():
            for stored in entry.get("keys") or []:
                if stored.get("id") == match.group(1) and hmac.compare_digest(
                        stored.get("sha256", ""), digest):
                    return self._user(name, entry)
        return None

