import re

from einsora.common.ids import is_id, new_id


def test_ids_are_prefixed_lowercase_dns_labels() -> None:
    wid = new_id("workload")
    assert wid.startswith("w-")
    assert re.fullmatch(r"[a-z0-9-]{1,63}", wid)
    assert is_id(wid, "workload")
    assert not is_id(wid, "machine")
    assert new_id("machine").startswith("m-")


def test_ids_sort_by_creation_time() -> None:
    ids = [new_id("workload", now_ms=ms) for ms in (1, 1000, 10**12, 2 * 10**12)]
    assert ids == sorted(ids)


def test_ids_are_unique_within_one_millisecond() -> None:
    ids = {new_id("workload", now_ms=42) for _ in range(10_000)}
    assert len(ids) == 10_000


def test_is_id_refuses_non_canonical_forms() -> None:
    wid = new_id("workload")
    assert not is_id(wid.upper(), "workload")
    assert not is_id(wid + ".", "workload")
    assert not is_id(" " + wid, "workload")
    assert not is_id(wid[:-1], "workload")
