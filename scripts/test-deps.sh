#!/usr/bin/env bash
# System packages the test suite needs beyond Python's: Debian's Chromium for the browser tests
# (Playwright drives /usr/bin/chromium; it never downloads a browser of its own).
# Idempotent, and quiet when everything is present. Without root or apt, the browser tests skip
# with that reason.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  echo "installing Debian's chromium for the browser tests..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "note: /usr/bin/chromium is missing and cannot be installed here (needs root and apt);" \
       "browser tests will be skipped" >&2
fi
