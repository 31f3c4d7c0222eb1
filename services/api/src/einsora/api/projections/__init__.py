"""Projections: tables of the api's store kept on the bus for the services that read them there.

Each projection is a `KvProjection` (kv.py), repaired by one `RepairLoop`
(`einsora.common.repair`):

- `quotas`: tenant quotas → `usage/quota.*`, for the scheduler;
- `gateway_keys`: live gateway keys → `gateway_keys`, for the gateway;
- `enrolments`: machines' enrolments → `enrolments`, for the scheduler, the proxy and agents;
- `model_fallbacks`: endpoints' model steps → `model_fallbacks`, for the gateway.
"""
