"""The rollout workers of a run, placed by a fray client, each fed by a driver thread in the trainer's process.

A driver claims the next batch number from the replay buffer, waits until weights recent enough for
it are published (at most ``max_staleness`` steps older than the weights that will train on it),
sends the worker those weights if it has older ones, asks it for the batch and puts the batch in the
buffer. The client decides where workers live: ``LocalClient()`` keeps them in threads of this
process, ``LocalClient(processes=True)`` gives each its own process, a Ray client puts them on the
cluster (fray's actors, the same calls everywhere).

A worker that dies or fails (its process killed, its machine gone, an error inside it) loses only
the batch it was sampling: its driver starts a new worker, sends it the latest weights and samples
that batch again, with the same seeds. Nothing it sampled reached the buffer, so nothing is trained
twice. After ``max_restarts`` such failures in one run the drivers give up and the trainer's next
batch raises the last failure; a reward that keeps hanging (``RewardHangError``) stops the run at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fray.cluster import ActorHandle, ResourceConfig

from marin.rl.policy_weights import WeightBoard, WeightsClosedError
from marin.rl.replay_buffer import ReplayBuffer
from marin.rl.rewards import RewardHangError
from marin.rl.rollout_worker import RolloutWorker, RolloutWorkerConfig

logger = logging.getLogger(__name__)


class RolloutFleet:
    def __init__(
        self,
        client: Any,
        config: RolloutWorkerConfig,
        *,
        count: int,
        buffer: ReplayBuffer,
        weights: WeightBoard,
        problems_of: Callable[[int], Sequence[int]],
        max_staleness: int,
        resources: ResourceConfig | None = None,
        max_restarts: int = 3,
        call_timeout_s: float = 1800.0,
    ):
        self.client = client
        self.config = config
        self.count = count
        self.buffer = buffer
        self.weights = weights
        self.problems_of = problems_of
        self.max_staleness = max_staleness
        self.resources = resources
        self.max_restarts = max_restarts
        self.call_timeout_s = call_timeout_s
        self.restarts = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> RolloutFleet:
        for slot in range(self.count):
            thread = threading.Thread(target=self._drive, args=(slot,), name=f"rollout-driver-{slot}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the drivers (the buffer and the weights must be closed first, so none of them waits) and their workers."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout)
            if thread.is_alive():
                logger.warning("Rollout driver %s still runs %g s after the run stopped (a worker call in flight).",
                               thread.name, timeout)

    def _drive(self, slot: int) -> None:
        worker: ActorHandle | None = None
        version: int | None = None
        try:
            while (index := self.buffer.claim()) is not None:
                while True:
                    try:
                        latest, arrays = self.weights.wait_for(index - self.max_staleness)
                        if worker is None:
                            worker = self.client.create_actor(RolloutWorker, self.config, resources=self.resources)
                        if version != latest:
                            worker.set_weights.remote(latest, arrays).result(timeout=self.call_timeout_s)
                            version = latest
                        batch = worker.rollout.remote(index, list(self.problems_of(index))).result(timeout=self.call_timeout_s)
                        break
                    except WeightsClosedError:
                        return
                    except RewardHangError:
                        raise  # the environment's reward is broken: a new worker would hang the same way
                    except Exception as error:  # noqa: BLE001 - any other failure of a worker is handled by replacing it
                        if self._stopping.is_set():
                            return
                        self._count_restart(slot, index, error)
                        _stop_worker(worker)
                        worker, version = None, None
                self.buffer.put(batch)
        except BaseException as error:  # noqa: BLE001 - the trainer's next take raises it
            self.buffer.fail(error)
        finally:
            _stop_worker(worker)

    def _count_restart(self, slot: int, index: int, error: BaseException) -> None:
        with self._lock:
            self.restarts += 1
            restarts = self.restarts
        if restarts > self.max_restarts:
            raise RuntimeError(f"rollout worker {slot} failed on batch {index} after {self.max_restarts} restarts in this "
                               f"run: {type(error).__name__}: {error}") from error
        logger.warning("Rollout worker %d failed on batch %d (%s: %s); starting a new one and sampling the batch again "
                       "(restart %d of at most %d).", slot, index, type(error).__name__, error, restarts, self.max_restarts)


def _stop_worker(worker: ActorHandle | None) -> None:
    if worker is None:
        return
    try:
        worker.close.remote().result(timeout=30)
    except Exception:  # noqa: BLE001 - a dead worker has nothing left to close
        pass
    worker.terminate()


__all__ = ["RolloutFleet"]
