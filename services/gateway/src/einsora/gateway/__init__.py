"""Einsora's inference gateway: OpenAI's API in front of every tenant's model endpoints.

Clients send `Authorization: Bearer esk_…` and a `model` (an endpoint's name); the gateway
routes to a running replica with failover, holds each key to its requests and tokens per minute
(reserved at admission, settled with the real count, shared by every gateway replica), passes
streams through as they arrive, and publishes every request's token counts with their source.
"""
