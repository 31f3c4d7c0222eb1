"""Views: what the api keeps in memory from the bus, so a route answers without a round trip.

`machines`: every machine's inventory, observed state and enrolment (KV mirrors). `regions`:
each region's scheduler and its free capacity (ADR-0022).
"""
