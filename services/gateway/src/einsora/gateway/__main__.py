"""`python -m einsora.gateway [options]`: the same as `einsora gateway [options]`.

For hosts where the `einsora` script is not on PATH (and it loads no other package's commands).
"""

from __future__ import annotations

import sys

from einsora.common.cli import main_of
from einsora.gateway.command import register

if __name__ == "__main__":
    sys.exit(main_of("gateway", register))
