#!/usr/bin/env bash
# System packages the test suite needs beyond Python's (none yet; the browser tests will add
# Debian's chromium here). Idempotent and quiet when everything is present.
set -euo pipefail
exit 0
