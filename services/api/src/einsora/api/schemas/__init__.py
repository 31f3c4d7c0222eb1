"""Request and response bodies (pydantic): they validate requests and generate /openapi.json."""
