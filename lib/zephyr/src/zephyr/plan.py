"""Compiling a dataset chain into stages, and running one shard of a stage.

A stage is a source (the dataset's source shards, or the previous stage's shuffle output) plus
every element-wise operation up to the next shuffle, applied as one generator chain. Its end is
either a partition into the next stage's shards (written to scratch files) or the final sink.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephyr import ops
from zephyr._fs import atomic_open, join_url, url_to_fs
from zephyr.worker_context import WorkerContext, active_worker_context

# Elements are pickled to scratch files in chunks of this many, so a shuffle streams.
_SCRATCH_CHUNK = 1000


@dataclass(frozen=True)
class GroupReduce:
    """First operation of the stage after a ``group_by``: groups ``(key, item)`` pairs of the shard."""

    reducer: Callable[[Any, Iterator[Any]], Any]

    def apply(self, pairs: Iterator[tuple[Any, Any]]) -> Iterator[Any]:
        groups: dict[Any, list] = {}
        for key, item in pairs:
            groups.setdefault(key, []).append(item)
        # Groups come out in order of first appearance, which is deterministic for a given input.
        for key, items in groups.items():
            yield self.reducer(key, iter(items))

    def describe(self) -> str:
        return "reduce_groups" if self.reducer is ops.first_of_group else f"reduce_groups({ops._name(self.reducer)})"


@dataclass(frozen=True)
class Partition:
    """How a stage's output is split among the next stage's shards."""

    num_shards: int
    key: Callable[[Any], Any] | None = None  # None: round-robin (reshard); else hash of the key

    def describe(self) -> str:
        return f"reshard({self.num_shards})" if self.key is None else f"partition_by_key({self.num_shards})"


@dataclass(frozen=True)
class Stage:
    index: int
    num_shards: int
    operations: tuple
    partition: Partition | None

    def describe(self) -> str:
        steps = [op.describe() for op in self.operations]
        if self.partition is not None:
            steps.append(self.partition.describe())
        return f"stage {self.index} ({self.num_shards} shards): " + (" → ".join(steps) or "read")


def compile_plan(dataset: Any) -> list[Stage]:
    stages: list[Stage] = []
    num_shards = len(dataset.source)
    current: list = []
    for operation in dataset.operations:
        if isinstance(operation, ops.ELEMENT_WISE):
            current.append(operation)
            continue
        if isinstance(operation, ops.Reshard):
            partition, next_ops = Partition(operation.num_shards), []
        elif isinstance(operation, ops.GroupBy):
            partition = Partition(operation.num_shards or num_shards, operation.key)
            next_ops = [GroupReduce(operation.reducer)]
        else:
            raise TypeError(f"unknown dataset operation {operation!r}")
        stages.append(Stage(len(stages), num_shards, tuple(current), partition))
        num_shards, current = partition.num_shards, next_ops
    stages.append(Stage(len(stages), num_shards, tuple(current), None))
    return stages


def scratch_file(scratch_url: str, stage_index: int, source_shard: int, target_shard: int) -> str:
    return join_url(scratch_url, f"stage-{stage_index:03d}", f"part-{source_shard:05d}-to-{target_shard:05d}.pkl")


def _write_partitions(items: Iterator[Any], partition: Partition, stage: Stage, shard_index: int, scratch_url: str) -> int:
    buffers: list[list] = [[] for _ in range(partition.num_shards)]
    handles: dict[int, Any] = {}
    managers: dict[int, Any] = {}
    written = 0

    def flush(target: int) -> None:
        if target not in handles:
            managers[target] = atomic_open(scratch_file(scratch_url, stage.index, shard_index, target), "wb")
            handles[target] = managers[target].__enter__()
        pickle.dump(buffers[target], handles[target], protocol=pickle.HIGHEST_PROTOCOL)
        buffers[target] = []

    try:
        for position, item in enumerate(items):
            if partition.key is None:
                target = (shard_index + position) % partition.num_shards
                buffers[target].append(item)
            else:
                key = partition.key(item)
                target = ops.stable_hash(key) % partition.num_shards
                buffers[target].append((key, item))
            written += 1
            if len(buffers[target]) >= _SCRATCH_CHUNK:
                flush(target)
        for target, buffer in enumerate(buffers):
            if buffer:
                flush(target)
    except BaseException as error:
        for manager in managers.values():
            try:
                manager.__exit__(type(error), error, None)
            except BaseException:
                pass
        raise
    for manager in managers.values():
        manager.__exit__(None, None, None)
    return written


def _read_partition(scratch_url: str, stage_index: int, num_source_shards: int, target: int) -> Iterator[Any]:
    for source in range(num_source_shards):
        fs, path = url_to_fs(scratch_file(scratch_url, stage_index, source, target))
        if not fs.exists(path):
            continue  # that source shard sent nothing here
        with fs.open(path, "rb") as handle:
            while True:
                try:
                    chunk = pickle.load(handle)
                except EOFError:
                    break
                yield from chunk


def _counted(items: Iterable[Any], tally: list[int]) -> Iterator[Any]:
    for item in items:
        tally[0] += 1
        yield item


@dataclass
class ShardResult:
    stage_index: int
    shard_index: int
    output: Any
    items: int
    seconds: float
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StageRunner:
    """The task function of one stage: shipped once per worker, called with a shard index."""

    stage: Stage
    num_stages: int
    source: Sequence[Callable[[], Iterable[Any]]] | None  # the dataset's shards, for stage 0
    previous_num_shards: int
    scratch_url: str | None
    sink: Any | None

    def __call__(self, shard_index: int, shared: Any) -> ShardResult:
        started = time.perf_counter()
        stage = self.stage
        context = WorkerContext(shard_index, stage.num_shards, stage.index, self.num_stages, shared)
        tally = [0]
        try:
            output = self._run(shard_index, context, tally)
        except Exception as error:
            error.add_note(f"zephyr: raised in shard {shard_index} of stage {stage.index} ({stage.describe()})")
            raise
        return ShardResult(stage.index, shard_index, output, tally[0], time.perf_counter() - started, dict(context.counters))

    def _run(self, shard_index: int, context: WorkerContext, tally: list[int]) -> Any:
        stage = self.stage
        with active_worker_context(context):
            if self.source is not None:
                items: Iterator[Any] = iter(self.source[shard_index]())
            else:
                items = _read_partition(self.scratch_url, stage.index - 1, self.previous_num_shards, shard_index)
            for operation in stage.operations:
                items = operation.apply(items)
            items = _counted(items, tally)
            if stage.partition is not None:
                _write_partitions(items, stage.partition, stage, shard_index, self.scratch_url)
                return None
            return self.sink.write_shard(shard_index, stage.num_shards, items)
