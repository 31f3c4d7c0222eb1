"""Site names from Settings: the link the api mints names a site the proxy recognises."""

from urllib.parse import urlsplit

import pytest

from einsora.common.ids import new_id
from einsora.common.settings import Settings
from einsora.common.sites import ENTER_PATH, SiteConfig

W = new_id("workload")


@pytest.mark.parametrize(
    ("domain", "tls", "port", "origin"),
    [
        ("localhost", False, 8081, f"http://{W}.localhost:8081"),
        ("lab.example", True, 8443, f"https://{W}.lab.example:8443"),
        ("lab.example", True, 443, f"https://{W}.lab.example"),
        ("lab.example", False, 80, f"http://{W}.lab.example"),
    ],
)
def test_an_enter_link_names_a_site_of_the_same_settings(
    domain: str, tls: bool, port: int, origin: str
) -> None:
    settings = Settings(proxy_domain=domain, proxy_tls=tls, proxy_port=port)
    sites = SiteConfig.from_settings(settings)
    link = urlsplit(sites.enter_url(W, "abc-_123"))
    assert f"{link.scheme}://{link.netloc}" == origin
    assert link.path == ENTER_PATH
    assert link.query == "ticket=abc-_123"
    assert sites.workload_of(link.netloc) == W
    # Another domain's proxy does not answer for it.
    assert SiteConfig(domain="other.example", port=port, tls=tls).workload_of(link.netloc) is None


def test_site_cookies_are_host_only_and_secure_under_tls() -> None:
    secure = SiteConfig.from_settings(Settings(proxy_tls=True))
    plain = SiteConfig.from_settings(Settings())
    assert (secure.cookie_name, secure.cookie_secure) == ("__Host-einsora-site", True)
    assert (plain.cookie_name, plain.cookie_secure) == ("einsora-site", False)


def test_a_proxy_given_port_0_names_the_port_it_got() -> None:
    sites = SiteConfig.from_settings(Settings(proxy_domain="lab.example", proxy_port=0))
    assert sites.on_port(40123).host_of(W) == f"{W}.lab.example:40123"
