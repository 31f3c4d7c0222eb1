"""Einsora scheduler: admission, placement, queue and reconcile for one region."""

from einsora.scheduler.service import SchedulerService

__all__ = ["SchedulerService"]
