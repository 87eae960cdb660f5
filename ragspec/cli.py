"""The `ragspec` command line: one click group, subcommands registered from ragspec.commands.

A file that cannot be written (ragspec.fileio.WriteFailed) or a filesystem that refuses writes
(full, quota, read-only, I/O error), wherever a command meets it, ends the command with that one
line and exit status 1 (click.ClickException), never a traceback."""

from __future__ import annotations

import click


class _Group(click.Group):
    def invoke(self, ctx):
        from ragspec import fileio

        try:
            return super().invoke(ctx)
        except OSError as exc:
            if not fileio.is_disk_error(exc):
                raise
            raise click.ClickException(fileio.describe(exc)) from exc


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ragspec")
def main() -> None:
    """Ask questions about your own documents, fast.

    ragspec retrieves passages from an index of your files and answers with a small language
    model whose output is sped up by copying from those passages (n-gram speculative decoding),
    without changing what the model writes.

    Data (index, converted models) lives in $RAGSPEC_HOME (default ~/.ragspec).
    """


# Modules under ragspec/commands whose COMMANDS lists make up the CLI.
COMMAND_MODULES = ("generate", "index", "bench", "bench_engine", "calibrate", "ask", "ui", "chats",
                   "pull", "users", "serve", "eval", "models")


def _register() -> None:
    # Commands import their heavy dependencies lazily, so `ragspec --help` stays fast.
    import importlib

    for name in COMMAND_MODULES:
        for command in importlib.import_module(f"ragspec.commands.{name}").COMMANDS:
            main.add_command(command)


_register()
