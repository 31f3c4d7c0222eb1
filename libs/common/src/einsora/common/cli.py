"""The `einsora` command: one entry point, whose subcommands come from the installed packages.

Each package registers its subcommands under the `einsora.commands` entry-point group, so an
agent-only install (`pip install ./libs/common ./services/agent`) has `einsora agent` and
nothing that needs a server dependency.

Building the parser imports every package's `register` module, so those modules import only
argparse and light modules; a command's servers load inside the function that runs it. That
keeps `einsora --help` and `einsora ls` fast (a test checks which modules they load).
`einsora completion` is common's own command, registered here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from einsora.common import completion
from einsora.common.errors import EinsoraError

GROUP = "einsora.commands"

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
"""What a package's `einsora.commands` entry point is: it adds its subparsers.

Each subparser sets `func` (via `set_defaults`) to a callable taking the parsed namespace and
returning the exit code.
"""


def build_parser() -> argparse.ArgumentParser:
    """The `einsora` parser with every installed package's subcommands."""
    parser = argparse.ArgumentParser(
        prog="einsora",
        description="Einsora: a self-hosted control plane for sharing GPUs and other compute.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for _name, target in sorted(command_entry_points().items()):
        load(target)(subparsers)
    completion.register(subparsers, parser)
    return parser


def command_entry_points() -> dict[str, str]:
    """Every installed `einsora.commands` entry point: name -> `module:attr`.

    Read from each distribution's `entry_points.txt` on `sys.path`, as `importlib.metadata`
    finds them (the first distribution of a name wins), without importing it: its imports
    (zipfile, email, csv) were a third of `einsora --help`. Distributions inside zip files are
    not looked at; Einsora's packages are installed as directories.
    """
    found: dict[str, str] = {}
    seen: set[str] = set()
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            dist = re.sub(r"[-_.]+", "_", name.rsplit(".", 1)[0].split("-", 1)[0]).lower()
            if dist in seen:
                continue
            seen.add(dist)
            for command, target in _group(Path(entry or ".", name, "entry_points.txt")).items():
                found.setdefault(command, target)
    return found


def _group(path: Path) -> dict[str, str]:
    """The `einsora.commands` section of one `entry_points.txt` (an INI file)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    section = ""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == GROUP and "=" in line:
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return found


def load(target: str) -> Register:
    """The object an entry point's `module:attr` names."""
    module_name, _, attr = target.partition(":")
    obj: object = importlib.import_module(module_name.strip())
    for part in attr.strip().split(".") if attr.strip() else []:
        obj = getattr(obj, part)
    return cast("Register", obj)


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
