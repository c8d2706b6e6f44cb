"""Moving host batches onto the devices ahead of the step that needs them."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Iterable, Iterator

import jax
import numpy as np

from levanter.data.batch import Batch
from levanter.errors import LevanterError
from levanter.trainer.step import DeviceBatch

logger = logging.getLogger(__name__)


class DataSourceError(LevanterError, RuntimeError):
    """The data source ended early or produced batches of the wrong shape."""


def to_device(batch: Batch, sharding: Any) -> DeviceBatch:
    """Place a host batch on the devices. With several processes (multi-host), each one passes
    its own rows (as ``levanter.data.DataLoader(process_index=...)`` yields them) and together
    they form the global batch."""
    multi_process = jax.process_count() > 1

    def put(x, dtype):
        if x is None:
            return None
        x = np.asarray(x, dtype=dtype)
        if sharding is None:
            return jax.device_put(x)
        if multi_process:
            return jax.make_array_from_process_local_data(sharding, x)
        return jax.device_put(x, sharding)

    return DeviceBatch(
        tokens=put(batch.tokens, np.int32),
        loss_mask=put(batch.loss_mask, np.float32),
        segment_ids=put(batch.segment_ids, np.int32),
        extras={name: put(values, np.float32) for name, values in batch.extras.items()} or None,
    )


class Prefetcher:
    """Pulls batches from ``batches`` in a background thread and places them on device, keeping
    ``depth`` ready, so reading and host-to-device copies overlap with the running step."""

    _DONE = object()

    def __init__(self, batches: Iterable[Batch], sharding: Any, *, depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._sharding = sharding
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iter(batches),), daemon=True, name="batch-prefetch")
        self._thread.start()

    def _run(self, it: Iterator[Batch]) -> None:
        try:
            for batch in it:
                if self._stop.is_set():
                    return
                self._put((batch, to_device(batch, self._sharding)))
            self._put(self._DONE)
        except BaseException as e:  # surfaced in the training thread
            self._put(e)
        finally:
            # Stop the source's own threads (a loader's read-ahead) now rather than whenever the
            # generator is collected: see close().
            close_source = getattr(it, "close", None)
            if close_source is not None:
                close_source()

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def next(self) -> tuple[Batch, DeviceBatch]:
        item = self._queue.get()
        if item is self._DONE:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop reading ahead and wait for the thread (and the source's threads) to end.

        Waiting matters: a daemon thread still inside a device copy when the interpreter exits is
        ended mid-call by the C++ runtime, which aborts the whole process ("terminate called after
        throwing an instance of ''"), turning a clean stop (a preemption, an error) into a crash.
        """
        self._stop.set()
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            logger.warning(
                "The batch prefetch thread is still busy 30s after training stopped (in the data source's next() "
                "or a device copy); if it still is when Python exits, the process aborts."
            )
