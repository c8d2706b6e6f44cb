"""zephyr: lazy, sharded data pipelines.

Owns the ``Dataset`` abstraction (sources, fused element-wise transforms, shuffles such as
group-by and dedup), readers and writers (jsonl, parquet, the token cache) and the plan that turns
a dataset into stages of shard tasks. The shard tasks run through a fray client (in-process,
threads, local processes or Ray; ``backend=`` picks one). It builds on fray and rigging.
"""

from zephyr.dataset import Dataset
from zephyr.execute import ExecutionResult, execute
from zephyr.worker_context import WorkerContext, current_worker_context

__all__ = [
    "Dataset",
    "ExecutionResult",
    "WorkerContext",
    "current_worker_context",
    "execute",
]
