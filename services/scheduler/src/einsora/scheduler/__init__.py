"""Einsora scheduler: admission, placement, queue and reconcile for one region."""
