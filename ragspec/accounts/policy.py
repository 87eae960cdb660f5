"""Who may do what: roles, personal collections and quotas, checked where the action happens.

Contract:
  * A `Principal` is whoever a request acts for: a signed-in user, or `Principal.single_user()`
    when the chat runs without accounts (loopback, or `--no-auth`), which may do everything.
  * Roles: an owner manages the shared documents (upload, remove), the users and the models;
    a member asks questions, sees only their own chats, may use the first offered model and any
    model already loaded (loading another is the owner's), and uploads into a personal
    collection only when the owner granted an upload quota (`ragspec users set NAME
    --upload-mb N`). Every check raises `Denied` with a message a user can act on.
  * Quotas (ragspec.accounts.users.Quotas) are checked by `check_upload`, `check_queue` and
    `check_answer_tokens` with the numbers the caller counted; a request over a limit is
    refused with `QuotaExceeded`, which says the limit and who sets it.
  * These functions import no web framework: the chat page, the CLI and the HTTP server call
    the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ragspec import paths
from ragspec.accounts.users import Quotas, User
from ragspec.retrieval.readers.limits import size_text

SHARED = "shared"  # the owner's collection: $RAGSPEC_HOME/index and uploads/


class Denied(ValueError):
    """The principal may not do this; the message says why."""


class QuotaExceeded(Denied):
    """The request is over one of the principal's quotas; the message says which."""


@dataclass(frozen=True)
class Principal:
    """name None: the single-user mode (no accounts), which is an owner without limits."""

    name: str | None
    role: str = "owner"
    quotas: Quotas = field(default_factory=Quotas)

    @classmethod
    def single_user(cls) -> Principal:
        return cls(None)

    @classmethod
    def of(cls, user: User) -> Principal:
        return cls(user.name, user.role, user.quotas)

    @property
    def is_owner(self) -> bool:
        return self.role == "owner"

    @property
    def label(self) -> str:
        """How the audit log names this principal."""
        return self.name or "(single-user)"

    @property
    def may_upload_personal(self) -> bool:
        return self.name is not None and not self.is_owner and self.quotas.upload_mb != 0


def collections(principal: Principal) -> list[str]:
    """The collections this principal may ask: the shared one, and their own if granted."""
    return [SHARED, principal.name] if principal.may_upload_personal else [SHARED]


def collection_dirs(collection: str, index_override: str | None = None) -> tuple[Path, Path]:
    """(index folder, uploads folder) of a collection."""
    if collection == SHARED:
        from ragspec.loading import index_location  # a folder, or a Milvus location

        return index_location(index_override), paths.home() / "uploads"
    base = paths.home() / "users" / collection
    return base / "index", base / "uploads"


def require_manage(principal: Principal, collection: str) -> None:
    """Uploading into or removing from `collection`."""
    if collection == SHARED:
        if not principal.is_owner:
            raise Denied("only an owner can add or remove shared documents")
    elif collection != principal.name or not principal.may_upload_personal:
        raise Denied("you can add or remove documents only in your own collection, when the "
                     "owner has given you an upload quota")


def require_owner(principal: Principal, what: str) -> None:
    if not principal.is_owner:
        raise Denied(f"only an owner can {what}")


def may_use_model(principal: Principal, name: str, first: str, loaded: list[str]) -> bool:
    return principal.is_owner or name == first or name in loaded


def require_model(principal: Principal, name: str, first: str, loaded: list[str]) -> None:
    if not may_use_model(principal, name, first, loaded):
        raise Denied(f"the model {name} is not loaded, and only an owner can load one; choose "
                     f"{first} or a loaded model")


def may_see_chat(principal: Principal, chat_user: str | None) -> bool:
    """Single-user mode sees every chat; a user sees theirs, and owners also the chats written
    before there were accounts (which have no user)."""
    if principal.name is None:
        return True
    return chat_user == principal.name or (chat_user is None and principal.is_owner)


def check_upload(principal: Principal, used_bytes: int, new_bytes: int) -> None:
    limit = principal.quotas.upload_bytes
    if limit is not None and used_bytes + new_bytes > limit:
        room = max(0, limit - used_bytes)
        raise QuotaExceeded(f"over your upload quota of {size_text(limit)} ({size_text(room)} "
                            f"left); remove documents from your collection or ask the owner "
                            f"for more")


def check_queue(principal: Principal, queued: int) -> None:
    limit = principal.quotas.queued
    if limit is not None and queued >= limit:
        raise QuotaExceeded(f"you already have {queued} answer{'s' if queued != 1 else ''} "
                            f"waiting or being written (your limit is {limit}); wait for one "
                            f"to finish or press Stop")


def check_answer_tokens(principal: Principal, tokens: int) -> None:
    limit = principal.quotas.answer_tokens
    if limit is not None and tokens > limit:
        raise QuotaExceeded(f"answers are limited to {limit} tokens for you (the owner sets "
                            f"this); ask for {limit} or fewer")


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under `folder` (0 when it does not exist)."""
    if not folder.is_dir():
        return 0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
