"""`python -m einsora.accounting [options]`: the same as `einsora accounting [options]`.

For hosts where the `einsora` script is not on PATH (and it loads no other package's commands).
"""

from __future__ import annotations

import sys

from einsora.accounting.command import register
from einsora.common.cli import main_of

if __name__ == "__main__":
    sys.exit(main_of("accounting", register))
