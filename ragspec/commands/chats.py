"""`ragspec chats list | show | export | delete`: the chats the web chat saved.

Chats live in $RAGSPEC_HOME/chats (one JSON file each, see ragspec/web/chats.py). A chat is named by
its id or a unique prefix of 4+ characters. Human-readable output shows control characters in
questions and answers escaped; `--json` keeps the exact text.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ragspec import paths
from ragspec.commands.common import json_option
from ragspec.terminal import printable


def chat_store():
    from ragspec.web.chats import ChatStore

    return ChatStore(paths.home() / "chats")


def load_chat(ref: str) -> dict:
    """The chat named by ref; a missing or unreadable chat is one clear line (exit 1)."""
    from ragspec.web.chats import ChatError

    store = chat_store()
    try:
        return store.load(store.find(ref))
    except ChatError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group("chats")
def chats() -> None:
    """List, show, export or delete the chats saved by `ragspec ui`."""


@chats.command("list")
@json_option
def list_chats(as_json: bool) -> None:
    """The saved chats, most recently updated first: id, last update, messages, the user whose
    chat it is (with accounts), title. Every user's chats are listed."""
    summaries = chat_store().list()
    if as_json:
        click.echo(json.dumps([s.to_dict() for s in summaries], ensure_ascii=False, indent=1))
        return
    if not summaries:
        click.echo(f"No saved chats in {chat_store().root}.")
    for s in summaries:
        owner = f"  [{printable(s.user)}]" if s.user else ""
        click.echo(f"{s.id}  {s.updated_at}  {s.messages:3d} messages{owner}  "
                   f"{printable(s.title)}")


@chats.command("show")
@click.argument("chat")
@json_option
def show(chat: str, as_json: bool) -> None:
    """One chat's questions and answers (with --json: the whole saved chat, spans included)."""
    data = load_chat(chat)
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, indent=1))
        return
    click.echo(f"{data['id']}  {printable(data.get('title') or '(untitled)')}")
    for message in data["messages"]:
        text = printable(message.get("content", ""), keep_newlines=True)
        if message["role"] == "user":
            click.echo(f"\nQ: {text}")
        else:
            status = message.get("status", "done")
            note = "" if status == "done" else f" [{status}]"
            error = message.get("error")
            click.echo(f"A{note}: {text}" + (f"\n   {printable(error)}" if error else ""))


@chats.command("export")
@click.argument("chat")
@click.option("--out", "-o", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the Markdown to this file (default: stdout).")
@json_option
def export(chat: str, out: str | None, as_json: bool) -> None:
    """A chat as Markdown: each question, its answer, and the passages it cited."""
    from ragspec.web.chat_export import chat_markdown

    data = load_chat(chat)
    text = chat_markdown(data)
    if out:
        try:
            Path(out).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from exc
    if as_json:
        click.echo(json.dumps({"id": data["id"], "title": data.get("title", ""), "out": out,
                               "markdown": None if out else text}, ensure_ascii=False))
    elif out:
        click.echo(f"Wrote {out}", err=True)
    else:
        click.echo(printable(text, keep_newlines=True), nl=False)


@chats.command("delete")
@click.argument("chat")
@json_option
def delete(chat: str, as_json: bool) -> None:
    """Delete a saved chat."""
    from ragspec.web.chats import ChatError

    data = load_chat(chat)
    try:
        chat_store().delete(data["id"])
    except ChatError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps({"deleted": data["id"]}))
    else:
        click.echo(f"Deleted chat {data['id']} ({printable(data.get('title') or '(untitled)')})")


COMMANDS = [chats]
