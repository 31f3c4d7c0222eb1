"""The filters of admission: each asks one question of one machine for one workload's target,
and says in one sentence why the answer is no (ADR-0030).

In the order admission asks them:

1. `region`: is the machine of this region, still enrolled, and (now) reporting and settled?
2. `health`: are enough of its devices of the class healthy (not quarantined)?
3. `lend`: does it offer the class and runtime, and does its owner lend enough of it?
4. `trust`: may it take this tenant's workload, with the isolation the workload needs?
5. `quota` (of the workload, not the machine): does the tenant's quota let it start?
6. `capacity` (now): has the machine room for it now?

Then the fallback step (`chain.py`): a workload whose targets here have no room goes on to
its next target. The machines that pass the lasting filters (1 to 4, without liveness) are the
workload's **usable** machines: the ones it waits for and, while it waits, holds back from the
workloads behind it (`admission.py`). The order among waiting workloads is `order.py`'s, and the
choice among machines that pass every filter is `score.py`'s.
"""
