"""Which site a request is for, from its `Host` header alone.

The naming itself lives in `einsora.common.sites`, shared with the api that mints the links;
this module is the proxy's name for it.
"""

from einsora.common.sites import DASHBOARD_COOKIE, ENTER_PATH, SiteConfig

__all__ = ["DASHBOARD_COOKIE", "ENTER_PATH", "SiteConfig"]
