"""The bounded buffer between the rollout workers and the trainer.

Rollout batches are numbered: batch ``i`` is what training step ``i + 1`` learns from. Samplers claim
the next number to sample (:meth:`ReplayBuffer.claim`), and a claim waits while ``capacity`` batches
are already ahead of the one the trainer takes next: memory is bounded, and so is how far sampling
runs ahead of training. Samplers may finish out of order; the trainer takes batches in order
(:meth:`ReplayBuffer.take`), each exactly once. A sampler that fails for good hands its error to
:meth:`ReplayBuffer.fail`, and the trainer's next ``take`` raises it instead of waiting forever.
"""

from __future__ import annotations

import threading

from marin.errors import MarinError
from marin.rl.rollouts import RolloutBatch


class RolloutFailedError(MarinError, RuntimeError):
    """The rollout workers could not produce a batch the trainer needs."""


class ReplayBuffer:
    """Numbered rollout batches, at most ``capacity`` ahead of training (see the module docstring)."""

    def __init__(self, capacity: int, end: int):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.end = end  # one past the last batch a run trains on
        self._cond = threading.Condition()
        self._ready: dict[int, RolloutBatch] = {}
        self._next_claim: int | None = None  # None until the trainer says where it starts
        self._next_take = 0
        self._error: BaseException | None = None
        self._closed = False

    def open(self, first_to_sample: int, first_to_take: int) -> None:
        """Start handing out batch numbers from ``first_to_sample``; the trainer takes from ``first_to_take``."""
        with self._cond:
            self._next_claim, self._next_take = first_to_sample, first_to_take
            self._cond.notify_all()

    def claim(self) -> int | None:
        """The next batch number to sample, once it is within ``capacity`` of training; None when there is none."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or (
                self._next_claim is not None and (self._next_claim >= self.end or self._next_claim < self._next_take + self.capacity)))
            if self._closed or self._next_claim >= self.end:
                return None
            index = self._next_claim
            self._next_claim += 1
            return index

    def put(self, batch: RolloutBatch) -> None:
        with self._cond:
            self._ready[batch.index] = batch
            self._cond.notify_all()

    def take(self, index: int, timeout: float | None = None) -> RolloutBatch:
        """Batch ``index``, once sampled; the trainer's next take is ``index + 1``."""
        with self._cond:
            if not self._cond.wait_for(lambda: index in self._ready or self._error is not None or self._closed, timeout):
                raise RolloutFailedError(f"rollout batch {index} was not sampled within {timeout:g} s")
            if index not in self._ready:
                if self._error is not None:
                    raise RolloutFailedError(f"the rollout workers failed: {self._error}") from self._error
                raise RolloutFailedError(f"the run stopped before rollout batch {index} was sampled")
            self._next_take = index + 1
            self._cond.notify_all()
            return self._ready.pop(index)

    def skip_to(self, index: int) -> None:
        """The trainer's next take is ``index`` (it took the batches before it from elsewhere: the log)."""
        with self._cond:
            self._next_take = max(self._next_take, index)
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def held(self) -> int:
        with self._cond:
            return len(self._ready)


__all__ = ["ReplayBuffer", "RolloutFailedError"]
