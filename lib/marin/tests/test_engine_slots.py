"""EngineSlots: at most N threads do engine work at once; a slot is given up while a step's function runs."""

import threading
import time

from marin.execution.scheduling.engine_slots import EngineSlots


def _peak_inside(slots: EngineSlots, threads: int, body) -> int:
    inside, peak, lock = 0, 0, threading.Lock()

    def work():
        nonlocal inside, peak
        with slots.held():
            with lock:
                inside += 1
                peak = max(peak, inside)
            body()
            with lock:
                inside -= 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert not any(worker.is_alive() for worker in workers)
    return peak


def test_no_more_than_count_threads_hold_a_slot():
    assert _peak_inside(EngineSlots(2), 8, lambda: time.sleep(0.02)) == 2


def test_no_limit_without_a_count():
    barrier = threading.Barrier(6, timeout=10)
    assert _peak_inside(EngineSlots(None), 6, barrier.wait) == 6  # all six inside at once


def test_a_slot_given_up_lets_every_step_function_run_at_once():
    slots = EngineSlots(1)
    barrier = threading.Barrier(4, timeout=10)  # only passes if four functions run at the same time
    done = []

    def attempt():
        with slots.held():
            with slots.given_up():
                barrier.wait()
            done.append(True)

    workers = [threading.Thread(target=attempt) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=30)
    assert len(done) == 4


def test_holding_again_in_the_same_thread_does_not_wait_for_itself():
    slots = EngineSlots(1)
    with slots.held():
        with slots.held():
            pass
        slots.sleep(0.001)
    with slots.held():  # the slot was given back whole
        pass
