"""A VM's NoCloud seed: cloud-init's `user-data` and `meta-data` on an ISO 9660 volume labelled
`cidata`, written with pycdlib (no host tool needed).

`meta-data` names the instance (its workload id, so cloud-init runs its first-boot modules once
per workload, not once per boot) and the user's SSH public key (`public-keys`); `user-data` is
the user's own, or an empty `#cloud-config` with the key in `ssh_authorized_keys` too.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pycdlib

LABEL = "cidata"


def meta_data(workload_id: str, hostname: str, ssh_key: str | None) -> str:
    # JSON is YAML, and it quotes whatever the user's key comment holds.
    data: dict[str, object] = {"instance-id": workload_id, "local-hostname": hostname}
    if ssh_key is not None:
        data["public-keys"] = [ssh_key.strip()]
    return json.dumps(data, indent=1) + "\n"


def user_data(given: str | None, ssh_key: str | None) -> str:
    if given is not None:
        return given
    if ssh_key is None:
        return "#cloud-config\n{}\n"
    return "#cloud-config\n" + json.dumps({"ssh_authorized_keys": [ssh_key.strip()]}) + "\n"


def write_seed(
    path: Path, *, workload_id: str, hostname: str, ssh_key: str | None, given: str | None
) -> None:
    """Write the seed ISO to `path` (0644: qemu, as its own user, reads it)."""
    files = {
        "meta-data": meta_data(workload_id, hostname, ssh_key),
        "user-data": user_data(given, ssh_key),
    }
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, vol_ident=LABEL, joliet=3, rock_ridge="1.09")
    try:
        for name, text in files.items():
            data = text.encode()
            iso.add_fp(
                io.BytesIO(data),
                len(data),
                f"/{name.upper().replace('-', '_')}.;1",
                rr_name=name,
                joliet_path=f"/{name}",
            )
        partial = path.with_suffix(".partial")
        iso.write(str(partial))
    finally:
        iso.close()
    partial.chmod(0o644)
    partial.replace(path)


def read_seed(path: Path) -> dict[str, str]:
    """The seed's files by name (for tests and for a person checking what a VM was given)."""
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    try:
        found = {}
        for name in ("meta-data", "user-data"):
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            found[name] = out.getvalue().decode()
        return found
    finally:
        iso.close()
