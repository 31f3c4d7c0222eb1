"""Einsora's access proxy: each running workload's web UI at its own site.

A workload `w-<id>` is served at `w-<id>.<domain>:<port>`, another origin than the dashboard and
than every other workload. A one-time access ticket becomes a host-only cookie for that site
alone; the proxy then forwards HTTP and WebSocket traffic, adding the workload's own token itself
so that the token never reaches a URL, a page, a log line or the browser.
"""
