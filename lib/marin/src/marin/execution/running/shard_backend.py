"""The zephyr backend a data step uses when its declaration names none.

Starting worker processes costs about a second per pipeline stage; for a few megabytes of input
that is more than the work itself. So a step with several shards and at least
``PROCESS_POOL_MIN_BYTES`` of input runs them on the local process pool (one per core), and
anything smaller runs in this process. A script whose top level is not guarded by
``if __name__ == "__main__":`` cannot start worker processes (each would run the script again),
so it gets this process too, with a warning saying how to get the parallel version. A step told
``backend=`` (``"ray"``, a fray client, ...) never comes here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from fray.cluster.main_guard import unguarded_top_level_line
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

# Below this much input, starting worker processes costs more than it saves.
PROCESS_POOL_MIN_BYTES = 64 << 20


def default_backend(shard_count: int, files: Iterable[str], what: str = "shards") -> str:
    """``"processes"`` or ``"inline"`` for ``shard_count`` shards reading ``files`` (``what`` names them in the warning)."""
    if shard_count < 2:
        return "inline"
    total = 0
    for url in files:
        fs, path = fsx.filesystem(url)
        total += int(fs.size(path) or 0)
        if total >= PROCESS_POOL_MIN_BYTES:
            break
    if total < PROCESS_POOL_MIN_BYTES:
        return "inline"
    unguarded = unguarded_top_level_line()
    if unguarded is not None:
        script, line = unguarded
        logger.warning(
            "Running %d %s in this process: %s, line %d runs outside 'if __name__ == \"__main__\":', so "
            "worker processes cannot be started (each would run the script again). Add that guard to run "
            "them with one process per core.",
            shard_count, what, script, line,
        )
        return "inline"
    return "processes"
