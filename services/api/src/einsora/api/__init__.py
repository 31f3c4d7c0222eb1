"""Einsora api service."""
