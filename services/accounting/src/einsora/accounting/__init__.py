"""Einsora accounting service."""
