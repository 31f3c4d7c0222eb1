"""Einsora accounting: allocations metered from workload events, token usage, usage reports,
and each tenant's recent usage for fair share (never billing)."""
