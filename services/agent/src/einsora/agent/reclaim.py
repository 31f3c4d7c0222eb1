"""The owner's reclaim on the machine itself: `einsora agent reclaim` and `release`.

The owner takes the machine back even while the control plane is unreachable (ADR-0017). The
command writes `<data_dir>/agent/reclaim.json` (0600: when, the grace, guests' minimum
runtime); `release` removes it. The running agent reads it every tick: after the grace it
parks its guests' workloads itself (a guest: a workload whose tenant is not its enrolment's
owner; an agent without an enrolment, Solo's own, has no guests), and it reports the reclaim
in its inventory (`reclaimed_at`), so the scheduler, when it hears from the machine again,
preempts them there too. It never stops the owner's own workloads.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from einsora.common.schemas import DesiredWorkload, utcnow

log = logging.getLogger("einsora.agent.reclaim")

FILE = "reclaim.json"
GRACE_S = 120.0
GUEST_MIN_RUNTIME_S = 600.0


@dataclass(frozen=True)
class LocalReclaim:
    """A reclaim made on the machine: since when, and how long guests are given."""

    at: datetime
    grace_s: float = GRACE_S
    guest_min_runtime_s: float = GUEST_MIN_RUNTIME_S

    def stops(self, started_at: datetime | None, now: datetime) -> bool:
        """Whether a guest's workload that started at `started_at` (None: not running) is
        stopped by now: its grace passed and, when it runs, its minimum runtime."""
        at = self.at + timedelta(seconds=self.grace_s)
        if started_at is not None:
            at = max(at, started_at + timedelta(seconds=self.guest_min_runtime_s))
        return now >= at


def path(data_dir: Path) -> Path:
    return data_dir / "agent" / FILE


def reclaim(
    data_dir: Path,
    *,
    grace_s: float = GRACE_S,
    guest_min_runtime_s: float = GUEST_MIN_RUNTIME_S,
    now: datetime | None = None,
) -> LocalReclaim:
    """Reclaim the machine (again: it stays reclaimed from the first time, with its terms)."""
    found = read(data_dir)
    if found is not None:
        return found
    made = LocalReclaim(now or utcnow(), grace_s, guest_min_runtime_s)
    target = path(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "at": made.at.isoformat(),
        "grace_s": grace_s,
        "guest_min_runtime_s": made.guest_min_runtime_s,
    }
    scratch = target.with_suffix(".tmp")
    # Written whole, then renamed: a running agent never reads half of it.
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(body, out)
    os.replace(scratch, target)
    return made


def release(data_dir: Path) -> bool:
    """End the machine's own reclaim; False: it was not reclaimed here."""
    try:
        path(data_dir).unlink()
    except FileNotFoundError:
        return False
    return True


def read(data_dir: Path) -> LocalReclaim | None:
    """The machine's own reclaim, None when there is none. An unreadable file counts as a
    reclaim made now with the default terms: the owner asked for the machine back."""
    target = path(data_dir)
    try:
        text = target.read_text()
    except FileNotFoundError:
        return None
    try:
        body = json.loads(text)
        return LocalReclaim(
            datetime.fromisoformat(body["at"]),
            float(body.get("grace_s", GRACE_S)),
            float(body.get("guest_min_runtime_s", GUEST_MIN_RUNTIME_S)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning(
            "the reclaim file is unreadable; the machine counts as reclaimed now",
            extra={"path": str(target), "error": str(exc)},
        )
        return LocalReclaim(datetime.fromtimestamp(target.stat().st_mtime, UTC))


def is_guest(workload: DesiredWorkload | None, owner_tenant_id: str | None) -> bool:
    """A workload of another tenant than the machine's owner's (None: no enrolment, no guests)."""
    return (
        owner_tenant_id is not None
        and workload is not None
        and workload.tenant_id != owner_tenant_id
    )
