"""Our own chaos suite (issue 35): a Lab cell built of processes, a seeded workload mix, seeded
faults, and the invariants I1–I6 of DESIGN.md checked from the bus's own record.

- `cell`: the cell as `docs/lab.md` builds it, with processes instead of containers;
- `clients`: the workload mix, through the api, from several clients;
- `faults`: the seeded faults, one at a time, each healed before the next;
- `collect`: the bus's record (a mirror of the `machines` bucket, EVENTS), accounting's
  allocations and usage, the api's view;
- `checks`: I1–I6 over that record, as plain functions (`test_checks.py` shows each catching a
  hand-made violation);
- `run`: one run, from nothing to its figures; `bench/chaos.py` and `test_chaos.py` call it.
"""
