#!/usr/bin/env bash
# System packages the test suite needs beyond Python's, from Debian:
# - chromium for the browser tests (Playwright drives /usr/bin/chromium; it never downloads a
#   browser of its own);
# - prometheus for `promtool`, which checks every service's /metrics and the dashboard's queries;
# - docker-compose (v1), whose `config` validates deploy/compose without a Docker engine.
# Idempotent, and quiet when everything is present. Without root or apt, the tests that need
# them skip with that reason.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  echo "installing Debian's ${missing[*]} for the tests..."
  apt-get update -qq >/dev/null
  # policy-rc.d or not, nothing here is a service the tests want started.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "note: ${missing[*]} missing and cannot be installed here (needs root and apt);" \
       "the tests that need them will be skipped" >&2
fi
