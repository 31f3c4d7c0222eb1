import os
import re
import threading

from einsora.common.ids import derived_id, is_id, new_id


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


def test_an_id_spells_its_millisecond_in_its_first_ten_characters() -> None:
    # 1,764,800,000,000 ms is 0x19aea21a800, five bits a digit.
    assert new_id("workload", now_ms=1_764_800_000_000).startswith("w-01kbk4dw00")
    assert new_id("workload", now_ms=0).startswith("w-0000000000")


def test_a_derived_id_is_the_same_in_every_version() -> None:
    # A scheduler republishing an intent after an upgrade must give it the id it had.
    assert derived_id("intent", "w-1", "create") == "in-pt2a2mnypt5h95nzns6f"


def test_ids_are_unique_within_one_millisecond() -> None:
    ids = {new_id("workload", now_ms=42) for _ in range(10_000)}
    assert len(ids) == 10_000


def test_is_id_refuses_non_canonical_forms() -> None:
    wid = new_id("workload")
    assert not is_id(wid.upper(), "workload")
    assert not is_id(wid + ".", "workload")
    assert not is_id(" " + wid, "workload")
    assert not is_id(wid[:-1], "workload")


def test_ids_made_at_once_on_many_threads_are_all_different() -> None:
    made: list[list[str]] = [[] for _ in range(8)]

    def make(into: list[str]) -> None:
        into.extend(new_id("workload", now_ms=42) for _ in range(5_000))

    threads = [threading.Thread(target=make, args=(each,)) for each in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for each in made for i in each]
    assert len(set(every)) == len(every) == 40_000


def test_a_forked_child_does_not_make_its_parents_next_ids() -> None:
    new_id("workload")  # the parent's randomness is drawn, and would be copied into a child
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, " ".join(new_id("workload", now_ms=42) for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split())
    os.waitpid(pid, 0)
    parent = {new_id("workload", now_ms=42) for _ in range(100)}
    assert len(child) == 100
    assert not child & parent
