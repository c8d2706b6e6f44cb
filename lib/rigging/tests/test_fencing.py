"""Fencing tokens: a generation handed out once, and a superseded owner that can no longer write; a
record held by its owner on local disk, so that nothing claims it until the owner has written."""

from __future__ import annotations

import threading

import pytest

from rigging.conditional_writes import CannotHoldError
from rigging.fencing import FencedOff, claim, read_snapshot


@pytest.fixture(params=["local", "memory"])
def record_url(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "record.json")
    return f"memory://fencing-{tmp_path.name}/record.json"


def test_a_claim_over_a_stale_snapshot_writes_nothing(record_url):
    first = claim(record_url, {"status": "RUNNING"}, read_snapshot(record_url))
    assert first is not None and first.generation == 1
    stale = read_snapshot(record_url)
    second = claim(record_url, {"status": "RUNNING"}, stale)
    assert second is not None and second.generation == 2
    # A claimer that decided on the record before the second claim loses, and writes nothing.
    assert claim(record_url, {"status": "RUNNING"}, stale) is None
    assert read_snapshot(record_url).data["owner"] == second.owner


def test_the_superseded_owner_can_neither_update_nor_check(record_url):
    old = claim(record_url, {"n": 0}, read_snapshot(record_url))
    assert old.update({"n": 1})["n"] == 1
    new = claim(record_url, {"n": 0}, read_snapshot(record_url))
    with pytest.raises(FencedOff, match="generation 2"):
        old.update({"n": 99})
    with pytest.raises(FencedOff):
        old.check()
    assert read_snapshot(record_url).data["n"] == 0 and new.check().data["generation"] == 2


def test_a_refusing_condition_stops_the_update(record_url):
    fence = claim(record_url, {"status": "FAILED"}, read_snapshot(record_url))
    with pytest.raises(FencedOff, match="ended"):
        fence.update({"status": "SUCCESS"}, condition=lambda data: "ended" if data["status"] != "RUNNING" else None)
    assert read_snapshot(record_url).data["status"] == "FAILED"


def test_of_many_racing_claimers_exactly_one_wins_each_generation(tmp_path):
    url = str(tmp_path / "record.json")
    claim(url, {}, read_snapshot(url))
    start = threading.Barrier(8)
    winners = []

    def race():
        snapshot = read_snapshot(url)
        start.wait(timeout=30)
        fence = claim(url, {}, snapshot)
        if fence is not None:
            winners.append(fence)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Every racer read generation 1 before any claim: one of them gets generation 2.
    assert [fence.generation for fence in winners] == [2]


def test_a_claim_made_while_the_owner_holds_the_record_waits_and_then_finds_it_changed(tmp_path):
    url = str(tmp_path / "record.json")
    fence = claim(url, {"status": "RUNNING"}, read_snapshot(url))
    decided = read_snapshot(url)  # a rival decided to take the work over on this version
    claiming, claimed = threading.Event(), []

    def rival():
        claiming.set()
        claimed.append(claim(url, {"status": "RUNNING"}, decided))

    with fence.held() as write:
        thread = threading.Thread(target=rival)
        thread.start()
        assert claiming.wait(timeout=30)
        thread.join(timeout=0.5)
        assert thread.is_alive(), "the rival's claim landed while the owner held the record"
        (tmp_path / "result.txt").write_text("written while no one else could take the work")
        assert write({"status": "SUCCESS"})["generation"] == 1
    thread.join(timeout=30)
    assert claimed == [None] and read_snapshot(url).data["status"] == "SUCCESS"


def test_a_superseded_owner_cannot_hold_the_record_and_memory_cannot_hold_one_at_all(tmp_path):
    url = str(tmp_path / "record.json")
    old = claim(url, {"status": "RUNNING"}, read_snapshot(url))
    claim(url, {"status": "RUNNING"}, read_snapshot(url))
    with pytest.raises(FencedOff, match="generation 2"):
        with old.held():
            raise AssertionError("the block ran for a superseded owner")
    memory = f"memory://fencing-held-{tmp_path.name}/record.json"
    fence = claim(memory, {"status": "RUNNING"}, read_snapshot(memory))
    with pytest.raises(CannotHoldError):
        with fence.held():
            raise AssertionError("the block ran where the record cannot be held")
    assert read_snapshot(memory).data["status"] == "RUNNING"


def test_a_held_record_is_written_once(tmp_path):
    url = str(tmp_path / "record.json")
    fence = claim(url, {"n": 0}, read_snapshot(url))
    with fence.held() as write:
        write({"n": 1})
        with pytest.raises(RuntimeError, match="replaced already"):
            write({"n": 2})
    assert read_snapshot(url).data["n"] == 1
