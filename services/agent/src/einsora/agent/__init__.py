"""Einsora agent service."""
