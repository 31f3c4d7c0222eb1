"""Einsora proxy service."""
