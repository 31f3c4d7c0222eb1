"""Einsora's user-facing commands: Solo, and the thin client of the REST API."""
