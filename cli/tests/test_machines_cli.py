"""`einsora machines lend` and `einsora machines invite --user`, as real subprocesses against a
real api: what the owner lends reaches the machine's enrolment, and an invited user accepts
their own invitation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from einsora.api.testing import (
    RunningApi,
    cli_env,
    einsora,
    join_machine,
    new_member,
    new_tenant,
)

EINSORA = str(Path(sys.executable).parent / "einsora")


async def _einsora(api: RunningApi, token: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    """`einsora ARGS` as `token`: its exit code, and all it printed."""
    code, out, err = await einsora(cli_env(api, tmp_path, token), *args)
    return code, out + err


async def test_the_owner_lends_part_of_a_machine_and_invites_one_user(
    api: RunningApi, tmp_path: Path
) -> None:
    _, lab = await new_tenant(api, "lab", "lab-admin")
    studio_id, studio = await new_tenant(api, "studio", "studio-admin")
    ada = await new_member(api, studio_id, "ada", by=studio)
    machine = await join_machine(api, lab)
    assert lab.token is not None
    assert ada.token is not None

    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "lend", machine, "--cpus", "4",
        "--memory-gib", "16", "--gpus", "none",
    )  # fmt: skip
    assert code == 0, out
    assert f"machine {machine} lends Einsora: 4 cores, 16 GiB, 0 GPUs" in out
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "--json")
    (shown,) = json.loads(out)
    assert shown["enrolment"]["lend"] == {"cpus": 4, "memory_mib": 16384, "gpus": []}
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "lend", machine)
    assert code == 1
    assert "say what to lend" in out
    code, out = await _einsora(api, lab.token, tmp_path, "machines", "lend", machine, "--all")
    assert (code, f"machine {machine} lends Einsora: all" in out) == (0, True)

    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "invite", machine, "--tenant", "studio",
        "--user", "ada",
    )  # fmt: skip
    assert code == 2  # one guest per invitation
    code, out = await _einsora(
        api, lab.token, tmp_path, "machines", "invite", machine, "--user", "ada"
    )
    assert code == 0, out
    assert "user ada accepts it with: einsora machines accept mi-" in out
    invitation = out.split("einsora machines accept ")[1].split()[0]
    code, out = await _einsora(api, ada.token, tmp_path, "machines", "invitations")
    assert invitation in out
    code, out = await _einsora(api, ada.token, tmp_path, "machines", "accept", invitation)
    assert code == 0, out
    assert f"user ada is now a guest of {machine}, owned by lab" in out
