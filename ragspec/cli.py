"""The `ragspec` command line: one click group, subcommands registered from ragspec.commands."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
