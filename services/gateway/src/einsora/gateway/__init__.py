"""Einsora gateway service."""
