"""`python -m einsora.agent [options]`: the same as `einsora agent [options]`.

For hosts where the `einsora` script is not on PATH (and it loads no other package's commands).
"""

from __future__ import annotations

import argparse
import sys

from einsora.agent.command import register
from einsora.common.errors import EinsoraError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m einsora.agent")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.func(args)
    except EinsoraError as exc:
        print(f"einsora agent: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
