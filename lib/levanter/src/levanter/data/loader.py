"""The training data loader: shuffled, mixed, epoch-wrapping windows, prefetched on a background thread.

Everything a batch contains is a pure function of ``(seed, step)``: step ``s`` holds global
sequences ``s * batch_size .. (s + 1) * batch_size - 1``; the mixture schedule says which dataset
each comes from and its position ``k`` in that dataset's stream; position ``k`` is window
``perm_epoch(k mod n)`` of epoch ``k // n``, with a fresh seeded permutation per epoch. Restarting
at step k therefore yields exactly the batches an uninterrupted run yields from k, with no replay.

With several processes (hosts), each loader yields only its own contiguous rows of every global
batch: process ``p`` of ``P`` gets rows ``[p * B / P, (p + 1) * B / P)``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np

from levanter.data.batch import Batch
from levanter.data.mixture import DEFAULT_BLOCK_SIZE, MixtureSchedule
from levanter.data.permutation import FeistelPermutation
from levanter.data.windows import TokenWindows

logger = logging.getLogger(__name__)


def _rows_of_process(batch_size: int, process_index: int, process_count: int) -> range:
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must be in [0, process_count={process_count})")
    if batch_size % process_count:
        raise ValueError(
            f"global batch_size={batch_size} must be divisible by process_count={process_count} so every "
            "process gets the same number of rows"
        )
    per = batch_size // process_count
    return range(process_index * per, (process_index + 1) * per)


class EpochShuffle:
    """Position ``k`` of an endless stream over ``n`` windows: epoch ``k // n``, shuffled per epoch."""

    def __init__(self, n: int, seed: int, stream: int, shuffle: bool = True):
        self.n, self.seed, self.stream, self.shuffle = n, seed, stream, shuffle
        self._perm = lru_cache(maxsize=2)(lambda epoch: FeistelPermutation(n, (seed, stream, epoch)))

    def __call__(self, k: int) -> tuple[int, int]:
        """(epoch, window index) of stream position ``k``."""
        epoch, offset = divmod(k, self.n)
        if not self.shuffle:
            return epoch, offset
        return epoch, int(self._perm(epoch)(offset))


class DataLoader:
    """Batches of windows from one or more datasets mixed by weight; see the module docstring."""

    def __init__(
        self,
        datasets: Sequence[TokenWindows],
        weights: Sequence[float] | None = None,
        *,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        process_index: int = 0,
        process_count: int = 1,
        prefetch: int = 4,
        mixture_block_size: int = DEFAULT_BLOCK_SIZE,
    ):
        if not datasets:
            raise ValueError("DataLoader needs at least one dataset")
        seq_lens = {d.seq_len for d in datasets}
        if len(seq_lens) != 1:
            raise ValueError(f"all datasets of a loader must use one seq_len, got {sorted(seq_lens)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.datasets = list(datasets)
        self.seq_len = seq_lens.pop()
        self.batch_size = batch_size
        self.seed = seed
        self.rows = _rows_of_process(batch_size, process_index, process_count)
        self.prefetch = max(1, prefetch)
        self.schedule = MixtureSchedule(weights or [1.0] * len(datasets), seed, mixture_block_size)
        if self.schedule.num_datasets != len(self.datasets):
            raise ValueError(f"{len(self.datasets)} datasets but {self.schedule.num_datasets} weights")
        self._streams = [EpochShuffle(len(d), seed, i, shuffle) for i, d in enumerate(self.datasets)]
        self._epochs_seen = [0] * len(self.datasets)
        self.wait_seconds = 0.0  # time consumers spent waiting for a batch: > 0 means the loader stalled

    def source_of(self, sequence_index: int) -> int:
        """Which dataset global sequence ``sequence_index`` comes from."""
        return self.schedule.lookup(sequence_index)[0]

    def _window_of(self, sequence_index: int) -> tuple[TokenWindows, int]:
        d, k = self.schedule.lookup(sequence_index)
        epoch, window = self._streams[d](k)
        if epoch > self._epochs_seen[d]:
            self._epochs_seen[d] = epoch
            logger.info("dataset %s: starting epoch %d (wrapped around its %d windows)", self.datasets[d].name, epoch, len(self.datasets[d]))
        return self.datasets[d], window

    def sequence(self, sequence_index: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and segment ids of global sequence ``sequence_index``."""
        windows, window = self._window_of(sequence_index)
        return windows.tokens_and_segments(window)

    def batch_at(self, step: int) -> Batch:
        """This process's rows of global batch ``step``, each with its cache's loss mask."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        base = step * self.batch_size
        tokens, segments, masks = [], [], []
        for r in self.rows:
            windows, window = self._window_of(base + r)
            row_tokens, row_segments = windows.tokens_and_segments(window)
            tokens.append(row_tokens)
            segments.append(row_segments)
            masks.append(windows.loss_mask(window))
        return Batch(
            tokens=np.stack(tokens).astype(np.int32, copy=False), loss_mask=np.stack(masks), segment_ids=np.stack(segments)
        )

    def iter_from(self, start_step: int = 0, stop_step: int | None = None) -> Iterator[Batch]:
        """Batches for steps ``start_step, start_step + 1, ...`` (until ``stop_step``, exclusive).

        A background thread keeps up to ``prefetch`` batches ready; an exception there is raised here,
        in the consumer. Closing the iterator (or dropping it) stops the thread.
        """
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        return self._prefetched(start_step, stop_step)

    def _prefetched(self, start_step: int, stop_step: int | None) -> Iterator[Batch]:
        # The thread starts on the first next(), inside the generator, so that an iterator that is
        # never consumed never leaves a producer blocked on a full queue.
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def produce() -> None:
            step = start_step
            try:
                while not stop.is_set() and (stop_step is None or step < stop_step):
                    _put_until_stopped(ready, self.batch_at(step), stop)
                    step += 1
                _put_until_stopped(ready, _END, stop)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, who re-raises it
                _put_until_stopped(ready, _Failure(exc), stop)

        worker = threading.Thread(target=produce, name="levanter-data-prefetch", daemon=True)
        worker.start()
        yield from self._consume(ready, stop, worker)

    def _consume(self, ready: queue.Queue, stop: threading.Event, worker: threading.Thread) -> Iterator[Batch]:
        try:
            while True:
                began = time.perf_counter()
                item = ready.get()
                self.wait_seconds += time.perf_counter() - began
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            worker.join(timeout=5)


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


def _put_until_stopped(ready: queue.Queue, item: object, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return
        except queue.Full:
            continue


class EvalBatches:
    """A validation set as the trainer wants it: calling it gives one ordered pass of batches.

    Every window is used exactly once, in order, with no shuffle; the last batch is padded with rows
    whose loss mask is all zero, so every batch keeps the compiled shape and padding never counts.
    """

    def __init__(self, windows: TokenWindows, *, batch_size: int, process_index: int = 0, process_count: int = 1):
        self.windows = windows
        self.batch_size = batch_size
        self.rows = _rows_of_process(batch_size, process_index, process_count)

    def __len__(self) -> int:
        return -(-len(self.windows) // self.batch_size)

    def __call__(self) -> Iterator[Batch]:
        seq_len = self.windows.seq_len
        for step in range(len(self)):
            tokens = np.zeros((len(self.rows), seq_len), dtype=np.int32)
            segments = np.zeros((len(self.rows), seq_len), dtype=np.int32)
            mask = np.zeros((len(self.rows), seq_len), dtype=np.float32)
            for out_row, row in enumerate(self.rows):
                index = step * self.batch_size + row
                if index < len(self.windows):
                    tokens[out_row], segments[out_row] = self.windows.tokens_and_segments(index)
                    mask[out_row] = self.windows.loss_mask(index)
            yield Batch(tokens=tokens, loss_mask=mask, segment_ids=segments)
