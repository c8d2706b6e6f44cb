"""zephyr: lazy, sharded data pipelines.

Owns the ``Dataset`` abstraction (sources, fused element-wise transforms, shuffles such as
group-by and dedup), readers and writers (jsonl, parquet, the token cache) and shard execution on
a backend (in-process, local processes, and fray clients). It builds on fray and rigging.
"""

from zephyr.backends import Backend, InProcessBackend, ProcessPoolBackend
from zephyr.dataset import Dataset
from zephyr.execute import ExecutionResult, execute
from zephyr.worker_context import WorkerContext, current_worker_context

__all__ = [
    "Backend",
    "Dataset",
    "ExecutionResult",
    "InProcessBackend",
    "ProcessPoolBackend",
    "WorkerContext",
    "current_worker_context",
    "execute",
]
