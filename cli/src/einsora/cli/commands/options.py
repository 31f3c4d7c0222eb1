"""Options every client command takes: `--api URL` and `--json`."""

from __future__ import annotations

import argparse


def common_options(*, nested: bool = False) -> argparse.ArgumentParser:
    """A parent parser with `--api` and `--json`.

    A nested action (`tokens create`) takes them too; its copies default to SUPPRESS so they
    never overwrite a value the outer command already parsed.
    """
    parent = argparse.ArgumentParser(add_help=False)
    default_api = argparse.SUPPRESS if nested else None
    default_json = argparse.SUPPRESS if nested else False
    parent.add_argument(
        "--api", default=default_api, help="API URL (default: $EINSORA_API, else the local Solo)"
    )
    parent.add_argument(
        "--json", action="store_true", default=default_json, help="print JSON for scripts"
    )
    return parent
