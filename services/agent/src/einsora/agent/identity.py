"""Which machine this agent is: `--machine-id`, or an id made once and kept in the data dir.

A machine id is a subject token (it names keys and consumers on the bus), so it is checked here,
where a person can be told what is wrong, rather than failing later inside a subject.
"""

from __future__ import annotations

from pathlib import Path

from einsora.common.bus import identities, names
from einsora.common.errors import ConfigError
from einsora.common.ids import new_id

RESERVED = frozenset(
    {*identities.SERVICES, identities.CALLOUT, identities.SYSTEM, identities.ISSUER}
)
"""The control plane's own bus identities: a machine named so would share its seed file in
Solo's credentials dir, and its identity on the bus."""


def check_machine_id(machine_id: str) -> str:
    if not names.is_subject_token(machine_id, max_length=100):
        raise ConfigError(
            f"machine id {machine_id!r} is not valid: use 1 to 100 letters, digits, - or _"
        )
    if machine_id in RESERVED:
        raise ConfigError(
            f"machine id {machine_id!r} is the name of one of the control plane's own bus "
            "identities; choose another"
        )
    return machine_id


def resolve_machine_id(data_dir: Path, machine_id: str | None) -> str:
    """`machine_id` if given; else the one in `<data_dir>/machine-id`, made on first use."""
    if machine_id:
        return check_machine_id(machine_id)
    path = data_dir / "machine-id"
    try:
        if path.exists():
            return check_machine_id(path.read_text().strip())
        made = new_id("machine")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(made + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot read or write the machine id at {path}: {exc}") from exc
    return made


def sim_machine_ids(base: str, count: int) -> list[str]:
    """`[base]` for one machine; `base-0001` … for several."""
    if count < 1:
        raise ConfigError(f"--sim-machines must be at least 1, not {count}")
    if count == 1:
        return [base]
    width = max(4, len(str(count)))
    return [check_machine_id(f"{base}-{i:0{width}d}") for i in range(1, count + 1)]
