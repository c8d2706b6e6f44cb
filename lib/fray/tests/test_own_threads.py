"""Calls each in a thread of their own: idle threads are reused, calls never wait for each other."""

import contextvars
import threading

from fray.cluster.own_threads import call_in_own_thread

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("_seen", default="fresh")


def test_a_thread_that_finished_a_call_takes_the_next_one():
    first = call_in_own_thread(lambda: threading.current_thread())
    thread = first.result(timeout=10)
    second = call_in_own_thread(lambda: threading.current_thread())
    assert second.result(timeout=10) is thread
    assert thread.name.startswith("fray-local-")


def test_calls_never_wait_for_each_other():
    release = threading.Event()
    blocked = [call_in_own_thread(release.wait, 10) for _ in range(8)]
    # Every blocked call has a thread: one more call finishes while they all still wait.
    assert call_in_own_thread(lambda: 42).result(timeout=10) == 42
    assert not any(future.done() for future in blocked)
    release.set()
    assert all(future.result(timeout=10) for future in blocked)


def test_each_call_starts_from_a_fresh_context():
    def set_and_read():
        before = _seen.get()
        _seen.set("set by an earlier call")
        return before, threading.current_thread()

    first, thread = call_in_own_thread(set_and_read).result(timeout=10)
    second, again = call_in_own_thread(set_and_read).result(timeout=10)
    assert again is thread and first == second == "fresh"


def test_a_call_that_raises_gives_its_exception_and_the_thread_serves_on():
    def fail():
        raise ValueError("from the call")

    future = call_in_own_thread(fail)
    error = future.exception(timeout=10)
    assert isinstance(error, ValueError) and str(error) == "from the call"
    assert call_in_own_thread(lambda: "still serving").result(timeout=10) == "still serving"
