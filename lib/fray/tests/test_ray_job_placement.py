"""A Ray job whose node goes away: placed again before it started, LOST after; with a fake Ray.

Ray counts a node as alive for some seconds after its machine is gone, so the retry of a preempted
replica can be placed on that very node and lose its actor before it starts. That is no failure of
the job (nothing of it ran), so the handle places it again instead of giving up.
"""

from __future__ import annotations

from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")

from ray.exceptions import ActorDiedError  # noqa: E402

from fray.cluster import JobRequest, JobStatus  # noqa: E402
from fray.cluster.ray_job import RayJob  # noqa: E402


class _Actor:
    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.call = self  # actor.call.remote(method, *args)

    def remote(self, method: str, *args: Any) -> tuple:
        return self, method


class FakeRay:
    """Each actor created answers from the next dictionary; an exception in it is raised by ``get``."""

    def __init__(self, *actors: dict[str, Any]) -> None:
        self.actors = list(actors)
        self.created = 0
        self.killed = 0

    def remote(self, **options: Any):
        fake = self

        class _Class:
            def __init__(self, cls: type) -> None:
                pass

            def remote(self, *args: Any) -> _Actor:
                fake.created += 1
                return _Actor(fake.actors.pop(0))

        return _Class

    def get(self, ref: tuple) -> Any:
        actor, method = ref
        answer = actor.answers.get(method)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def kill(self, actor: _Actor) -> None:
        self.killed += 1


def _job(fake: FakeRay, **kwargs: Any) -> tuple[RayJob, list]:
    log: list = []
    job = RayJob(fake, JobRequest("train", ["true"]), "train-1", {"num_cpus": 1}, start=False,
                 plan=lambda: log.append("plan") or len(log), placed=lambda job, planned: log.append(("placed", planned)),
                 **kwargs)
    return job, log


def test_a_job_whose_node_went_away_before_it_started_is_placed_again():
    fake = FakeRay({"free_address": ActorDiedError()}, {"free_address": "10.0.0.7:8476", "status": JobStatus.PENDING})
    job, log = _job(fake)
    assert job.free_address() == "10.0.0.7:8476"
    assert fake.created == 2 and job.placements == 2
    # Each placement is planned first (the client's check, its scale-up deadline) and reported after.
    assert log == ["plan", ("placed", 1), "plan", ("placed", 3)]
    assert job.status() is JobStatus.PENDING


def test_a_job_that_keeps_losing_its_node_gives_up_after_three_placements():
    fake = FakeRay(*[{"free_address": ActorDiedError()} for _ in range(3)])
    job, _ = _job(fake)
    with pytest.raises(RuntimeError, match=r"lost its Ray actor before it started \(3 placement\(s\)\)"):
        job.free_address()


def test_a_started_job_whose_node_goes_away_is_lost_not_placed_again():
    fake = FakeRay({"free_address": "10.0.0.7:8476", "start": None, "status": ActorDiedError()})
    job, _ = _job(fake)
    job.free_address()
    job.start({})
    assert job.status() is JobStatus.LOST  # iris counts this as a preemption and retries the attempt
    assert fake.created == 1


def test_a_job_never_placed_in_time_fails_with_the_reason():
    fake = FakeRay({"free_address": ActorDiedError()})
    job, _ = _job(fake)
    job.expire(TimeoutError("waited 15 min for a node with GPU:1"))
    assert job.status() is JobStatus.FAILED and job.over and fake.killed == 1
    with pytest.raises(TimeoutError, match="GPU:1"):
        job.free_address()
    assert fake.created == 1  # not placed again
