import io
import json
import logging

from einsora.common import logs


def test_bound_fields_are_on_every_line_in_the_block() -> None:
    out = io.StringIO()
    logs.configure("INFO", "json", out)
    log = logging.getLogger("einsora.test")
    with logs.bind(request_id="req-1", tenant="t-1", subject="u-1"):
        log.info("inside", extra={"workload": "w-1"})
    log.info("outside")
    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert inside["request_id"] == "req-1"
    assert inside["tenant"] == "t-1"
    assert inside["subject"] == "u-1"
    assert inside["workload"] == "w-1"
    assert inside["message"] == "inside"
    assert "request_id" not in outside
