"""Routing on Host alone: only canonical sites of our domain are served."""

import pytest

from einsora.common.ids import new_id
from einsora.proxy.app import safe_next
from einsora.proxy.forward import Scrubber
from einsora.proxy.sessions import SessionStore
from einsora.proxy.sites import SiteConfig

W = new_id("workload")
SITES = SiteConfig(domain="localhost", port=8081)


def test_a_canonical_host_names_its_workload() -> None:
    assert SITES.workload_of(f"{W}.localhost:8081") == W


@pytest.mark.parametrize(
    "host",
    [
        f"{W}.localhost.:8081",  # trailing dot
        f"{W.upper()}.localhost:8081",  # mixed case
        f"{W}.LOCALHOST:8081",
        f"{W}.localhost.evil.com:8081",
        f"{W}.localhost:8082",  # another port
        f"{W}.localhost",  # no port where one is needed
        "w-unknownbutnotcanonical.localhost:8081",
        f"x{W}.localhost:8081",
        "localhost:8081",
        f" {W}.localhost:8081",
        f"evil.com/{W}.localhost:8081",
        "",
        None,
    ],
)
def test_hostile_hosts_name_no_site(host: str | None) -> None:
    assert SITES.workload_of(host) is None


def test_default_ports_may_be_omitted_under_tls() -> None:
    sites = SiteConfig(domain="apps.example.org", port=443, tls=True)
    assert sites.workload_of(f"{W}.apps.example.org") == W
    assert sites.origin_of(W) == f"https://{W}.apps.example.org"


@pytest.mark.parametrize(
    "target",
    [
        "//evil.com",
        "/\\evil.com",
        "%2F%2Fevil.com",
        "/%2Fevil.com",
        "/%5Cevil.com",
        "/%252F%252Fevil.com",
        "https://evil.com",
        "javascript:alert(1)",
        "/ok\\..\\x",
    ],
)
def test_open_redirects_are_refused(target: str) -> None:
    assert safe_next(target, "/lab") == "/lab"


def test_a_plain_path_is_kept() -> None:
    assert safe_next("/lab/tree/notebook.ipynb?x=1", "/lab") == "/lab/tree/notebook.ipynb?x=1"


def test_sessions_are_bound_to_one_site_and_expire_when_idle() -> None:
    now = [0.0]
    store = SessionStore(idle_s=10, clock=lambda: now[0])
    other = new_id("workload")
    sid = store.create(W, "t-1", "u-1")
    assert store.get(sid, W) is not None
    assert store.get(sid, other) is None  # a cookie of w-A presented to w-B
    now[0] = 9
    assert store.get(sid, W) is not None  # use keeps it alive
    now[0] = 30
    assert store.get(sid, W) is None
    assert len(store) == 0


def test_ending_a_site_ends_its_sessions_and_closes_what_it_holds() -> None:
    store = SessionStore()
    closed: list[str] = []
    sid = store.create(W, None, None)
    session = store.get(sid, W)
    assert session is not None
    session.closers.append(lambda: closed.append("ws"))
    assert store.end_site(W) == 1
    assert closed == ["ws"]
    assert store.get(sid, W) is None


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_the_scrubber_removes_a_secret_split_across_chunks(size: int) -> None:
    secret = "s3cr3t-token-value"
    body = f"<script>{{'token': '{secret}'}}</script>{secret}end".encode()
    scrubber = Scrubber(secret)
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    out = b"".join(scrubber.feed(c) for c in chunks) + scrubber.flush()
    assert secret.encode() not in out
    assert out == body.replace(secret.encode(), b"")
