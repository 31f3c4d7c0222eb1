"""Consumers: what the api reads from and relays to the bus as it runs.

- `outbox`: the relay that publishes committed intents (ADR-0004).
- `timeline`: workload events into the store.
- `key_use`: gateway keys' last use.
- `revocations`: revoked credentials, across replicas.
- `redeemer`: access tickets redeemed by the proxy.
- `streams`: events served as server-sent streams.
"""
