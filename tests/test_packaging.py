"""The agent installs alone on a GPU host: its dependency closure has no server library."""

import re
from importlib.metadata import PackageNotFoundError, requires

SERVER_ONLY = {"sqlalchemy", "starlette", "uvicorn", "alembic", "asyncpg", "aiosqlite"}


def _closure(name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            reqs = requires(current) or []
        except PackageNotFoundError:
            continue
        for req in reqs:
            if "extra ==" in req:
                continue  # optional extras are not installed by a plain install
            match = re.match(r"[A-Za-z0-9_.-]+", req)
            assert match is not None
            todo.append(match.group(0).lower().replace("_", "-"))
    return seen


def test_the_agent_pulls_no_server_dependency() -> None:
    closure = _closure("einsora-agent")
    assert "einsora-common" in closure
    assert "nats-py" in closure
    assert closure.isdisjoint(SERVER_ONLY), closure & SERVER_ONLY


def test_the_api_does_pull_the_store() -> None:
    # The same walk finds server dependencies where they belong, so the check above can fail.
    assert "sqlalchemy" in _closure("einsora-api")


def test_the_agent_ships_no_test_machinery() -> None:
    """Test machinery lives in einsora-testing, for the workspace only (issue 37): an agent
    installed on a machine registers no pytest plugin and carries no testing module."""
    import pkgutil
    from importlib.metadata import distribution

    import einsora.agent

    plugins = [e.name for e in distribution("einsora-agent").entry_points if e.group == "pytest11"]
    assert plugins == []
    modules = {m.name for m in pkgutil.walk_packages(einsora.agent.__path__)}
    assert not {name for name in modules if "testing" in name or "pytest" in name}
    assert any(e.group == "pytest11" for e in distribution("einsora-testing").entry_points)
