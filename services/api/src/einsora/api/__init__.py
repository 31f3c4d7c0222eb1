"""Einsora's control API: tenants, users, API tokens, workloads and their timeline.

It owns the store. State-changing calls write their intent through a transactional outbox that
a relay publishes to INTENTS; workload events from EVENTS come back into the timeline. Solo and
`einsora api` run it as `ApiService`.
"""
