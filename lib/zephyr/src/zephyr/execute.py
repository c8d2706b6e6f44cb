"""Running a dataset: stage after stage, each stage's shards as one ``map`` of a fray client, with
progress and skip-existing. Where the shards run (in-process, threads, local processes, Ray) is the
client's business; see :func:`fray.cluster.client_for` for the settings ``backend=`` accepts."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fray.cluster import DistributedClient, ResourceConfig, client_for
from rigging.progress import terminal_bar

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


# Without a bar, a stage logs one progress line when it ends and at most one per this many seconds
# before: a line per shard made most of a small pipeline's log, and a stage of thousands of shards
# still says how it is doing twice a minute.
PROGRESS_LOG_INTERVAL_S = 30.0


class _Progress:
    def __init__(self, stage_label: str, total: int):
        self.stage_label = stage_label
        self.total = total
        self.done = 0
        self.items = 0
        self.started = time.perf_counter()
        self.last_logged = self.started
        self.bar = terminal_bar(total, stage_label, unit="shard")  # on a terminal; else the log lines below

    def shard_finished(self, result: ShardResult) -> None:
        self.done += 1
        self.items += result.items
        if self.bar is not None:
            self.bar.set_postfix(items=self.items, refresh=False)
            self.bar.update(1)
            return
        now = time.perf_counter()
        if self.done < self.total and now - self.last_logged < PROGRESS_LOG_INTERVAL_S:
            return
        self.last_logged = now
        elapsed = now - self.started
        rate = self.items / elapsed if elapsed > 0 else 0.0
        if self.done == self.total:
            logger.info("%s: %d/%d shards done, %d items in %.1fs (%.0f items/s)",
                        self.stage_label, self.done, self.total, self.items, elapsed, rate)
            return
        eta = elapsed / self.done * (self.total - self.done)
        logger.info("%s: %d/%d shards, %d items, %.0f items/s, ETA %s",
                    self.stage_label, self.done, self.total, self.items, rate, _format_eta(eta))


@dataclass(frozen=True)
class _ShardTask:
    """A stage's shard function with the run's shared objects: shipped to each worker once."""

    runner: StageRunner
    shared: Mapping[str, Any]

    @property
    def __name__(self) -> str:
        return f"zephyr stage {self.runner.stage.index + 1}/{self.runner.num_stages}"

    def __call__(self, shard_index: int) -> ShardResult:
        return self.runner(shard_index, self.shared)


def _run_stage(client: DistributedClient, task: _ShardTask, shard_indices: list[int], label: str,
               counters: Counter, resources: ResourceConfig | None) -> list[ShardResult]:
    progress = _Progress(label, len(shard_indices))

    def shard_finished(position: int, result: ShardResult) -> None:
        counters.update(result.counters)
        progress.shard_finished(result)

    try:
        return client.map(task, shard_indices, resources=resources, on_result=shard_finished)
    finally:
        if progress.bar is not None:
            progress.bar.close()


def execute(
    dataset: Any,
    sink: Sink,
    *,
    backend: DistributedClient | str | None = None,
    shared: Mapping[str, Any] | None = None,
    skip_existing: bool = False,
    scratch_url: str | None = None,
    resources: ResourceConfig | None = None,
) -> ExecutionResult:
    """Run ``dataset`` into ``sink``.

    ``backend``: where shards run: ``"processes"`` (default: local worker processes, one per core),
    ``"inline"`` (this thread, shard after shard), ``"threads"``, ``"ray"``, or a fray client (for
    example ``LocalClient(processes=True, max_workers=2)`` or ``RayClient(task_retries=1)``).
    ``shared``: read-only objects every task can reach through its ``WorkerContext``.
    ``skip_existing``: shards whose output the sink reports as complete are not recomputed.
    ``scratch_url``: where shuffles put intermediate files (default: a local temporary folder,
    removed afterwards; a remote backend needs a URL every worker can reach).
    ``resources``: what each shard task asks of a cluster (default: one CPU); a cluster refuses
    at once what none of its nodes has, a local client runs shards on this machine regardless.
    """
    client = client_for("processes" if backend is None else backend, what="zephyr backend")
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
                results = _run_stage(client, _ShardTask(task_fn, shared), shard_indices, label, counters, resources)
                if is_final:
                    for shard_index, result in zip(shard_indices, results):
                        outputs[shard_index] = result.output
                previous_num_shards = stage.num_shards
    finally:
        if own_scratch is not None:
            shutil.rmtree(own_scratch, ignore_errors=True)
    result = ExecutionResult(outputs=outputs, counters=dict(counters), skipped_shards=skipped)
    result.finalized = sink.finalize(outputs)
    return result
