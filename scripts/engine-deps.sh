#!/usr/bin/env bash
# System packages the engines tier (`make test-engines`, pytest -m engines) needs: qemu and
# libvirt for the libvirt driver's TCG guests, libvirt-dev for libvirt-python, Docker's engine
# for the docker driver, busybox-static and dropbear for the tiny guest the tests build, and the
# tools that unpack a Debian kernel (`apt-get download` + `dpkg-deb`). Idempotent, and quiet when
# everything is present. Without root or apt it says so, and the engine tests skip with that
# reason.
set -euo pipefail
PACKAGES=(qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-dev docker.io
          busybox-static dropbear-bin pkg-config gcc cpio)
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
  echo "installing Debian packages for the engines tier: ${missing[*]}..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
else
  echo "note: ${missing[*]} missing and cannot be installed here (needs root and apt);" \
       "the engines tier will skip" >&2
fi
