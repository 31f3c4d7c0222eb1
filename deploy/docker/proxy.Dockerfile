# The proxy service, from this repository: `docker build -f deploy/docker/proxy.Dockerfile .`
# Its own package and what it depends on, nothing else (uv sync --package), into a virtual
# environment copied into a slim runtime image that runs as an unprivileged user.
FROM python:3.11-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.9 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /src
COPY pyproject.toml uv.lock ./
COPY libs libs
COPY services services
COPY cli/pyproject.toml cli/pyproject.toml
RUN uv sync --frozen --no-dev --no-editable --package einsora-proxy

FROM python:3.11-slim
RUN useradd --uid 10001 --home-dir /var/lib/einsora --create-home einsora \
 && mkdir -p /run/einsora/bus && chown einsora:einsora /run/einsora/bus && chmod 0700 /run/einsora/bus
COPY --from=build /src/.venv /opt/einsora
ENV PATH=/opt/einsora/bin:$PATH EINSORA_DATA_DIR=/var/lib/einsora
USER einsora
ENTRYPOINT ["einsora", "proxy"]
