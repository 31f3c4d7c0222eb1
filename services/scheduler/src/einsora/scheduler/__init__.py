"""Einsora scheduler service."""
