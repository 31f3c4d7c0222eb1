"""The `einsora` command: one entry point, whose subcommands come from the installed packages.

Each package registers its subcommands under the `einsora.commands` entry-point group, so an
agent-only install (`pip install ./libs/common ./services/agent`) has `einsora agent` and
nothing that needs a server dependency.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from einsora.common.errors import EinsoraError

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
"""What a package's `einsora.commands` entry point is: it adds its subparsers.

Each subparser sets `func` (via `set_defaults`) to a callable taking the parsed namespace and
returning the exit code.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="einsora",
        description="Einsora: a self-hosted control plane for sharing GPUs and other compute.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for ep in sorted(entry_points(group="einsora.commands"), key=lambda e: e.name):
        register: Register = ep.load()
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


def main_of(command: str, register: Register, argv: Sequence[str] | None = None) -> int:
    """`python -m <package> ARGS` = `einsora <command> ARGS`, loading no other package's commands
    (for hosts where the `einsora` script is not on PATH)."""
    parser = argparse.ArgumentParser(prog="einsora")
    register(parser.add_subparsers(dest="command"))
    return run(parser, [command, *(sys.argv[1:] if argv is None else argv)])


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse, run the chosen command, and turn what a person should read into an exit code."""
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code: int = func(args)
    except EinsoraError as exc:
        print(f"einsora: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`einsora … | head`): no traceback; 141 as a shell says.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141
    return code


if __name__ == "__main__":
    sys.exit(main())
