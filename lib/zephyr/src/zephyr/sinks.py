"""Where the last stage's shards go. A sink writes one shard per task and is told about all of them at the end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class Sink:
    """Base class: ``write_shard`` runs in the worker; ``output_exists``/``finalize`` run in the driver."""

    def write_shard(self, shard_index: int, num_shards: int, items: Iterator[Any]) -> Any:
        raise NotImplementedError

    def output_exists(self, shard_index: int, num_shards: int) -> bool:
        """True when shard ``shard_index`` was already written completely (for ``skip_existing``)."""
        return False

    def existing_output(self, shard_index: int, num_shards: int) -> Any:
        """What ``write_shard`` would have returned for a shard that is skipped because it exists."""
        return None

    def finalize(self, outputs: list[Any]) -> Any:
        return outputs

    def describe(self) -> str:
        return type(self).__name__


class CollectSink(Sink):
    """Brings every element back to the driver (for tests and small results)."""

    def write_shard(self, shard_index, num_shards, items):
        return list(items)

    def describe(self) -> str:
        return "collect"
