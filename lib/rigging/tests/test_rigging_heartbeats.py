"""One thread keeps the time of many heartbeats: each beats until stopped, and a slow one delays no other."""

from __future__ import annotations

import threading
import time

from rigging.heartbeats import Heartbeats

WAIT_S = 10.0  # a bound on every wait, never a measure of speed


def wait_until(condition, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_each_beat_repeats_until_stopped_and_then_never_again():
    heartbeats = Heartbeats()
    counts = [0, 0]
    stops = [threading.Event(), threading.Event()]
    for index in range(2):
        heartbeats.every(0.01, lambda index=index: counts.__setitem__(index, counts[index] + 1) or True, stops[index])
    assert wait_until(lambda: min(counts) >= 3)
    stops[0].set()
    seen = counts[1]
    assert wait_until(lambda: counts[1] >= seen + 3)  # meanwhile a beat begun before the stop has ended
    stopped_at, seen = counts[0], counts[1]
    assert wait_until(lambda: counts[1] >= seen + 5)
    assert counts[0] == stopped_at


def test_a_beat_that_answers_false_ends_and_one_that_raises_goes_on():
    heartbeats = Heartbeats()
    calls = {"ends": 0, "raises": 0}

    def ends() -> bool:
        calls["ends"] += 1
        return False

    def raises() -> bool:
        calls["raises"] += 1
        raise OSError("flaky disk")

    stop = threading.Event()
    heartbeats.every(0.01, ends, stop)
    heartbeats.every(0.01, raises, stop)
    try:
        assert wait_until(lambda: calls["raises"] >= 5)
        assert calls["ends"] == 1
    finally:
        stop.set()


def test_a_slow_beat_delays_no_other():
    heartbeats = Heartbeats()
    release, fast = threading.Event(), []
    stop = threading.Event()
    heartbeats.every(0.01, lambda: release.wait(WAIT_S), stop)  # hangs, like a write to a dead disk
    heartbeats.every(0.01, lambda: fast.append(1) or True, stop)
    try:
        assert wait_until(lambda: len(fast) >= 5)
    finally:
        stop.set()
        release.set()


def test_a_beat_due_sooner_than_the_one_waited_for_is_not_kept_waiting():
    heartbeats = Heartbeats()
    stop, soon = threading.Event(), threading.Event()
    heartbeats.every(3600, lambda: True, stop)  # the thread now waits an hour for this one
    heartbeats.every(0.01, lambda: soon.set() or False, stop)
    try:
        assert soon.wait(WAIT_S)
    finally:
        stop.set()
