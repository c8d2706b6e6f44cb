"""Shard tasks as Ray tasks, submitted through fray's :class:`~fray.cluster.RayClient`.

The task function and the shared objects are pickled once per stage and put in Ray's object store;
each shard task receives a reference to them plus its own payload, so a large shared object (a
tokenizer, say) is shipped to each node once rather than once per shard.

A shard that fails is submitted again, up to ``max_retries`` times, while the shards already
finished keep their results: retries happen per shard in the driver, so they cover both an
exception raised by user code and a worker that died. Shard writes are atomic, so a failed attempt
leaves nothing half-written behind for the next one to trip over.

Ray is imported only when the backend runs (``pip install 'marin[ray]'``).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Iterator
from typing import Any

import cloudpickle

from fray.cluster.resources import ResourceConfig
from zephyr.backends import Backend, ShardTaskError

logger = logging.getLogger("zephyr")


def _run_shard_task(task_blob: bytes, payload: Any) -> Any:
    fn, shared = cloudpickle.loads(task_blob)
    try:
        return fn(payload, shared)
    except Exception as error:
        # Ray wraps exceptions it cannot pickle into an opaque error; keep the message readable.
        try:
            cloudpickle.dumps(error)
        except Exception:
            raise ShardTaskError(f"{type(error).__name__}: {error}") from None
        raise


class RayBackend(Backend):
    """Runs each shard task as a Ray task.

    ``client``: a fray ``RayClient`` (default: the current fray client when it is a
    ``RayClient``, else ``RayClient("auto")``, or the existing connection if Ray is initialised). ``resources``: what each shard task asks for
    (default one CPU). ``max_retries``: how many times one failed shard is tried again before
    the run fails. Scratch files of multi-stage pipelines (``scratch_url`` of ``execute``) must be
    on storage every Ray node can reach; on a single machine a local folder is enough.
    """

    def __init__(self, client: Any = None, *, resources: ResourceConfig | None = None, max_retries: int = 2):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self._client = client
        self.resources = resources
        self.max_retries = max_retries

    @property
    def client(self) -> Any:
        if self._client is None:
            from fray.cluster import current_client
            from fray.cluster.ray_client import RayClient

            chosen = current_client()
            if isinstance(chosen, RayClient):
                # The client the program chose (use_client, MARIN_CLUSTER=ray..., marin.yaml).
                self._client = chosen
            else:
                import ray

                # An already connected process keeps its connection; otherwise join the cluster.
                self._client = RayClient(address=None if ray.is_initialized() else "auto")
        return self._client

    def run(self, fn, payloads, shared) -> Iterator[tuple[int, Any]]:
        if not payloads:
            return
        client = self.client
        ray = client._connect()
        task_ref = ray.put(cloudpickle.dumps((fn, dict(shared))))

        def submit(index: int) -> cf.Future:
            return client.remote(_run_shard_task, task_ref, payloads[index], resources=self.resources)

        futures = {submit(index): index for index in range(len(payloads))}
        attempts = dict.fromkeys(range(len(payloads)), 1)
        finished = False
        try:
            while futures:
                done, _ = cf.wait(list(futures), return_when=cf.FIRST_COMPLETED)
                for future in done:
                    index = futures.pop(future)
                    try:
                        result = future.result()
                    except Exception as error:
                        if attempts[index] > self.max_retries:
                            raise _unwrap(error) from error
                        attempts[index] += 1
                        logger.warning("zephyr: shard task %d failed (%s: %s); retrying, attempt %d of %d",
                                       index, type(error).__name__, _first_line(error), attempts[index],
                                       self.max_retries + 1)
                        futures[submit(index)] = index
                        continue
                    yield index, result
            finished = True
        finally:
            if not finished:
                # One shard failed for good: stop the others rather than let them run to the end.
                for future in futures:
                    future.cancel()

    def __repr__(self) -> str:
        return f"RayBackend(client={self._client!r}, max_retries={self.max_retries})"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else ""


def _unwrap(error: BaseException) -> BaseException:
    """The user's own exception where Ray wrapped it (``RayTaskError`` subclasses it)."""
    cause = getattr(error, "cause", None)
    return cause if isinstance(cause, BaseException) else error
