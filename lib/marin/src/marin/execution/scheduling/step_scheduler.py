"""Starting a run's steps as their dependencies finish, at most ``workers`` at a time.

:func:`schedule_steps` submits each step to the run's thread pool once every dependency has
finished, in plan order among the steps ready; a failed (or DEP_FAILED) step makes every step
waiting on it DEP_FAILED without running it, while independent branches still finish. Once the
run is interrupted nothing new starts, and the outcomes of the steps still stopping are collected.
Each finished step gets a progress line with the run's count and an ETA.

A step whose lease another live runner holds is not waited for while other work is ready: the run
takes that work and comes back to the step after ``poll_s``, then at doubling intervals up to
:data:`_HELD_RECHECK_MAX_S` (it is cached here once the other runner commits it; it is run here if
that runner dies, since its lease is then taken over). So
several runners started on one prefix share a sweep, each step run once.
"""

from __future__ import annotations

import heapq
import queue
import time
from concurrent import futures

from rigging.log import get_logger

from marin.execution.records.run_report import Outcome, StepOutcome
from marin.execution.scheduling.step_attempt import HeldElsewhere, RunSession, attempt_step, record_dep_failed
from marin.execution.planning.step_plan import PlannedStep

# The runner's log lines keep one logger name however its code is split, so log filters keep working.
logger = get_logger("marin.execution.step_runner")

# How often the scheduler looks for an interrupt while long steps run.
_WAIT_POLL_S = 0.5
# A step another runner holds is looked at again after poll_s, then twice as long each time, up to
# this: a worker of a large sweep on an object store must not spend its requests polling leases.
_HELD_RECHECK_MAX_S = 10.0


def schedule_steps(
    session: RunSession,
    pool: futures.ThreadPoolExecutor,
    pending: list[PlannedStep],
    running: dict[futures.Future, PlannedStep],
    outcomes: dict[str, StepOutcome],
    paths: dict[str, str],
    workers: int,
) -> None:
    """Submit steps as their dependencies finish, in plan order among those ready; mark the
    dependents of failures DEP_FAILED.

    Each step counts its dependencies still to finish, and a finished step visits only its own
    dependents: a run of n steps costs time in proportion to its steps and edges, where rescanning
    every waiting step after each finished one would grow with n squared (minutes at 10,000 steps).
    """
    total = len(pending)
    position = {item.spec.identity: index for index, item in enumerate(pending)}
    waiting: dict[str, int] = {}  # identity -> dependencies not finished yet
    dependents: dict[str, list[PlannedStep]] = {}
    ready: list[tuple[int, PlannedStep]] = []  # a heap by position in the plan
    started: set[str] = set()
    stopping = False

    def block(item: PlannedStep) -> None:
        """Record ``item`` DEP_FAILED, and so every step waiting on it (iteratively: chains may be deep)."""
        stack = [item]
        while stack:
            step = stack.pop()
            if step.spec.identity in outcomes:
                continue
            states = (outcomes.get(dep.identity) for dep in step.spec.deps)
            culprits = [o.name for o in states if o is not None and o.outcome.blocks_dependents]
            outcomes[step.spec.identity] = record_dep_failed(session, step.spec, step.output_path, culprits)
            stack.extend(reversed(dependents.pop(step.spec.identity, [])))

    def settle(item: PlannedStep, outcome: StepOutcome) -> None:
        outcomes[item.spec.identity] = outcome
        if stopping:
            return  # interrupted: nothing new starts, and the steps never started keep their status
        for dependent in dependents.pop(item.spec.identity, []):
            if dependent.spec.identity in outcomes:
                continue
            if outcome.outcome.blocks_dependents:
                block(dependent)
                continue
            waiting[dependent.spec.identity] -= 1
            if waiting[dependent.spec.identity] == 0:
                heapq.heappush(ready, (position[dependent.spec.identity], dependent))

    for item in pending:  # dependencies come first in the plan, so their outcomes are known here if settled
        states = [outcomes.get(dep.identity) for dep in item.spec.deps]
        if any(o is not None and o.outcome.blocks_dependents for o in states):
            block(item)
            continue
        unfinished = [dep for dep, o in zip(item.spec.deps, states) if o is None]
        waiting[item.spec.identity] = len(unfinished)
        for dep in unfinished:
            dependents.setdefault(dep.identity, []).append(item)
        if not unfinished:
            heapq.heappush(ready, (position[item.spec.identity], item))

    finished = 0
    run_seconds = 0.0
    # Steps another live runner holds: (when to look again, position, step). Coming back to them is
    # cheap (one lease try and one status read), and learning that one finished there unblocks its
    # dependents here, so a due one goes before new work.
    held: list[tuple[float, int, PlannedStep]] = []
    looks: dict[str, int] = {}  # identity -> how many times it was found held
    # Each attempt puts its future here as it finishes: waiting on one queue costs the same however
    # many steps run, where waiting on the running futures themselves costs a lock of each, each time.
    finishing: queue.SimpleQueue[futures.Future] = queue.SimpleQueue()
    while True:
        if session.cancelled.is_set() and not stopping:
            # Interrupted: start nothing new, but collect the outcomes of the steps still stopping.
            stopping = True
            never = [i for i in pending if i.spec.identity not in outcomes and i.spec.identity not in started]
            if never:
                logger.warning("Interrupted: %d step(s) not started: %s", len(never), ", ".join(i.spec.name for i in never))
            ready.clear()
            held.clear()
        while len(running) < workers:
            if held and held[0][0] <= time.monotonic():
                _, _, item = heapq.heappop(held)
            elif ready:
                _, item = heapq.heappop(ready)
            else:
                break
            started.add(item.spec.identity)
            dep_paths = {dep.identity: paths[dep.identity] for dep in item.spec.deps}
            future = pool.submit(attempt_step, session, item.spec, item.output_path, dep_paths, wait_for_others=False)
            running[future] = item
            future.add_done_callback(finishing.put)
        if not running:
            if not held:
                break  # done (or, with an invalid plan, nothing left that can start)
            # Every step left is another runner's for now: look again when the first is due.
            session.cancelled.wait(max(0.0, min(held[0][0] - time.monotonic(), _WAIT_POLL_S)))
            continue
        # A timeout keeps the loop noticing an interrupt while long steps run, and due held steps.
        try:
            done = [finishing.get(timeout=_WAIT_POLL_S)]
        except queue.Empty:
            continue
        while not finishing.empty():
            done.append(finishing.get_nowait())
        for future in done:
            item = running.pop(future)
            outcome = future.result()
            if isinstance(outcome, HeldElsewhere):
                identity = item.spec.identity
                started.discard(identity)  # not started here (yet): an interrupt lists it so
                looks[identity] = looks.get(identity, 0) + 1
                if looks[identity] == 1:
                    logger.info("Step %s is being run by another runner (%s); this run takes other work and comes "
                                "back to it: %s", item.spec.name, outcome.holder, item.output_path)
                delay = min(session.poll_s * 2 ** (looks[identity] - 1), max(session.poll_s, _HELD_RECHECK_MAX_S))
                heapq.heappush(held, (time.monotonic() + delay, position[identity], item))
                continue
            finished += 1
            run_seconds += outcome.seconds
            _log_progress(outcome, finished, total, run_seconds, workers)
            settle(item, outcome)


def _log_progress(outcome: StepOutcome, finished: int, total: int, run_seconds: float, workers: int) -> None:
    remaining = total - finished
    eta = run_seconds / finished * remaining / max(1, min(workers, remaining or 1))
    verb = _PROGRESS_VERBS.get(outcome.outcome, outcome.outcome)
    level = logger.error if outcome.outcome == Outcome.FAILED else logger.info
    level(f"Step %s {verb} in %.1fs: %s [%d/%d run, ETA %.0fs]", outcome.name, outcome.seconds, outcome.output_path, finished, total, eta)


_PROGRESS_VERBS = {Outcome.RAN: "finished", Outcome.CACHED: "was completed by another runner", Outcome.FAILED: "FAILED"}
