"""Running a dataset: stage after stage on a backend, with progress and skip-existing."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from zephyr.backends import Backend, resolve_backend
from zephyr.plan import ShardResult, StageRunner, compile_plan
from zephyr.sinks import Sink

logger = logging.getLogger("zephyr")


@dataclass
class ExecutionResult:
    """``outputs[i]`` is what the sink returned for final shard i; counters are summed over all shards."""

    outputs: list[Any]
    counters: dict[str, int]
    skipped_shards: list[int] = field(default_factory=list)
    finalized: Any = None


def _format_eta(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}min"
    return f"{seconds / 3600:.1f}h"


class _Progress:
    def __init__(self, stage_label: str, total: int):
        self.stage_label = stage_label
        self.total = total
        self.done = 0
        self.items = 0
        self.started = time.perf_counter()

    def shard_finished(self, result: ShardResult) -> None:
        self.done += 1
        self.items += result.items
        elapsed = time.perf_counter() - self.started
        shard_rate = result.items / result.seconds if result.seconds > 0 else 0.0
        eta = elapsed / self.done * (self.total - self.done)
        logger.info(
            "%s: shard %d done (%d items, %.1fs, %.0f items/s); %d/%d shards, %d items, %.0f items/s overall, ETA %s",
            self.stage_label, result.shard_index, result.items, result.seconds, shard_rate,
            self.done, self.total, self.items, self.items / elapsed if elapsed > 0 else 0.0, _format_eta(eta),
        )


def execute(
    dataset: Any,
    sink: Sink,
    *,
    backend: Backend | str | None = None,
    shared: Mapping[str, Any] | None = None,
    skip_existing: bool = False,
    scratch_url: str | None = None,
) -> ExecutionResult:
    """Run ``dataset`` into ``sink``.

    ``backend``: a :class:`~zephyr.backends.Backend`, ``"processes"`` (default) or ``"inline"``.
    ``shared``: read-only objects every task can reach through its ``WorkerContext``.
    ``skip_existing``: shards whose output the sink reports as complete are not recomputed.
    ``scratch_url``: where shuffles put intermediate files (default: a local temporary folder,
    removed afterwards; a remote backend needs a URL every worker can reach).
    """
    runner_backend = resolve_backend(backend)
    shared = dict(shared or {})
    stages = compile_plan(dataset)
    final = stages[-1]
    to_run = list(range(final.num_shards))
    skipped: list[int] = []
    if skip_existing:
        skipped = [i for i in to_run if sink.output_exists(i, final.num_shards)]
        to_run = [i for i in to_run if i not in set(skipped)]
        if skipped:
            logger.info("zephyr: %d of %d output shards already exist; skipping them", len(skipped), final.num_shards)

    outputs: list[Any] = [None] * final.num_shards
    for index in skipped:
        outputs[index] = sink.existing_output(index, final.num_shards)
    counters: Counter = Counter()

    own_scratch = None
    if len(stages) > 1 and to_run and scratch_url is None:
        own_scratch = scratch_url = tempfile.mkdtemp(prefix="zephyr-scratch-")
    try:
        if to_run:
            previous_num_shards = len(dataset.source)
            for stage in stages:
                is_final = stage is final
                task_fn = StageRunner(
                    stage=stage,
                    num_stages=len(stages),
                    source=dataset.source if stage.index == 0 else None,
                    previous_num_shards=previous_num_shards,
                    scratch_url=scratch_url,
                    sink=sink if is_final else None,
                )
                shard_indices = to_run if is_final else list(range(stage.num_shards))
                label = f"zephyr stage {stage.index + 1}/{len(stages)} [{stage.describe().split(': ', 1)[1]}"
                label += f" → {sink.describe()}]" if is_final else "]"
                progress = _Progress(label, len(shard_indices))
                for position, result in runner_backend.run(task_fn, shard_indices, shared):
                    counters.update(result.counters)
                    progress.shard_finished(result)
                    if is_final:
                        outputs[shard_indices[position]] = result.output
                previous_num_shards = stage.num_shards
    finally:
        if own_scratch is not None:
            shutil.rmtree(own_scratch, ignore_errors=True)
    result = ExecutionResult(outputs=outputs, counters=dict(counters), skipped_shards=skipped)
    result.finalized = sink.finalize(outputs)
    return result
