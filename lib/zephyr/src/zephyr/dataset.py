"""The lazy, sharded ``Dataset``.

A dataset is a list of source shards plus a chain of operations; nothing runs until a terminal
call (``collect``, a writer). Element-wise operations (map, filter, flat_map, map_shard,
take_per_shard) fuse into one streaming pass per shard; ``reshard``, ``group_by`` and
``deduplicate`` move elements between shards and so start a new stage (see ``zephyr.plan``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephyr import ops
from zephyr._fs import is_temporary_name, url_to_fs
from zephyr.errors import InputNotFoundError


@dataclass(frozen=True)
class ListShard:
    """A source shard held in memory (shipped to the worker with the task)."""

    items: tuple

    def __call__(self) -> Iterable[Any]:
        return iter(self.items)


def _split_evenly(items: Sequence[Any], num_shards: int) -> list[tuple]:
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    size, extra = divmod(len(items), num_shards)
    shards, start = [], 0
    for index in range(num_shards):
        stop = start + size + (1 if index < extra else 0)
        shards.append(tuple(items[start:stop]))
        start = stop
    return shards


def expand_glob(pattern: str | Sequence[str], *, folder_filter: Callable[[str], bool] | None = None,
                wanted: str = "files") -> list[str]:
    """Sorted URLs of the files a glob, a folder (recursively) or a file names; several may be given.

    ``folder_filter`` keeps only some of a folder's files (a glob or an explicit file is taken as
    asked); ``wanted`` names them in the error for a folder holding none.
    """
    patterns = [os.fspath(pattern)] if isinstance(pattern, str | os.PathLike) else [os.fspath(p) for p in pattern]
    urls: list[str] = []
    for item in patterns:
        fs, path = url_to_fs(item)
        if any(char in path for char in "*?["):
            matches = sorted(p for p in fs.glob(path) if fs.isfile(p))
        elif fs.isdir(path):
            # Hidden files and in-progress atomic writes are never inputs.
            matches = sorted(
                p for p in fs.find(path)
                if not is_temporary_name(p) and not any(part.startswith(".") for part in p[len(path):].split("/") if part)
                and (folder_filter is None or folder_filter(p))
            )
            if not matches:
                raise InputNotFoundError(f"folder {item!r} holds no {wanted}")
        elif fs.exists(path):
            matches = [path]
        else:
            raise InputNotFoundError(f"input path {item!r} does not exist")
        if not matches:
            raise InputNotFoundError(f"no files match {item!r}; check the pattern")
        urls.extend(fs.unstrip_protocol(m) if _has_protocol(item) else m for m in matches)
    return urls


def _has_protocol(url: str) -> bool:
    return "://" in url


class Dataset:
    """A lazy, sharded collection. Build with ``from_list``, ``from_files`` or ``from_iterable``."""

    def __init__(self, source: Sequence[Callable[[], Iterable[Any]]], operations: tuple = ()):
        self.source = tuple(source)
        self.operations = tuple(operations)

    # -- sources ----------------------------------------------------------------------------

    @classmethod
    def from_list(cls, items: Sequence[Any], num_shards: int | None = None) -> Dataset:
        """Items split into ``num_shards`` contiguous shards (default: one)."""
        items = list(items)
        return cls([ListShard(chunk) for chunk in _split_evenly(items, num_shards or 1)])

    @classmethod
    def from_iterable(cls, iterable: Iterable[Any], num_shards: int = 1) -> Dataset:
        """Consumes ``iterable`` now (a generator cannot be shipped to workers) into shards."""
        return cls.from_list(list(iterable), num_shards)

    @classmethod
    def from_files(cls, pattern: str | Sequence[str]) -> Dataset:
        """One shard per file matching the glob(s); each element is the file's URL.

        Follow with ``.flat_map(reader)`` to read records, e.g. ``zephyr.readers.DocumentReader()``.
        """
        return cls([ListShard((url,)) for url in expand_glob(pattern)])

    @classmethod
    def from_shards(cls, shards: Sequence[Callable[[], Iterable[Any]]]) -> Dataset:
        """One shard per picklable zero-argument callable returning that shard's elements."""
        return cls(shards)

    @property
    def num_source_shards(self) -> int:
        return len(self.source)

    def _then(self, operation: Any) -> Dataset:
        return Dataset(self.source, self.operations + (operation,))

    # -- element-wise (fused) -----------------------------------------------------------------

    def map(self, fn: Callable[[Any], Any]) -> Dataset:
        return self._then(ops.Map(fn))

    def filter(self, predicate: Callable[[Any], bool]) -> Dataset:
        return self._then(ops.Filter(predicate))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Dataset:
        return self._then(ops.FlatMap(fn))

    def map_shard(self, fn: Callable[[Iterator[Any]], Iterable[Any]]) -> Dataset:
        """``fn`` receives an iterator over the whole shard and returns the new elements (for batching)."""
        return self._then(ops.MapShard(fn))

    def take_per_shard(self, count: int) -> Dataset:
        if count < 0:
            raise ValueError(f"take_per_shard needs a non-negative count, got {count}")
        return self._then(ops.TakePerShard(count))

    # -- shuffles (new stage) -------------------------------------------------------------------

    def reshard(self, num_shards: int) -> Dataset:
        """Redistribute elements round-robin into ``num_shards`` shards."""
        if num_shards < 1:
            raise ValueError(f"reshard needs at least one shard, got {num_shards}")
        return self._then(ops.Reshard(num_shards))

    def group_by(self, key: Callable[[Any], Any], reducer: Callable[[Any, Iterator[Any]], Any],
                 num_shards: int | None = None) -> Dataset:
        """Elements with equal ``key(x)`` meet in one shard; each group becomes ``reducer(key, items)``."""
        return self._then(ops.GroupBy(key, reducer, num_shards))

    def deduplicate(self, key: Callable[[Any], Any] | None = None, num_shards: int | None = None) -> Dataset:
        """Keep the first element for each key (default: the element itself, which must be hashable)."""
        return self._then(ops.GroupBy(key or ops.identity, ops.first_of_group, num_shards))

    # -- running ------------------------------------------------------------------------------

    def plan(self) -> list:
        """The stages this dataset compiles to (each a fused pass per shard)."""
        from zephyr.plan import compile_plan

        return compile_plan(self)

    def collect(self, *, backend: Any = None, shared: Mapping[str, Any] | None = None, resources: Any = None) -> list:
        """Run the pipeline and return every element, in shard order (``backend``: see ``zephyr.execute``)."""
        from zephyr.execute import execute
        from zephyr.sinks import CollectSink

        result = execute(self, CollectSink(), backend=backend, shared=shared, resources=resources)
        return [item for shard in result.outputs for item in shard]

    def write_jsonl(self, output: str, **kwargs: Any):
        from zephyr.writers import write_jsonl

        return write_jsonl(self, output, **kwargs)

    def write_parquet(self, output: str, **kwargs: Any):
        from zephyr.writers import write_parquet

        return write_parquet(self, output, **kwargs)

    def write_token_cache(self, url: str, vocab_size: int, metadata: Mapping[str, Any] | None = None, **kwargs: Any):
        from zephyr.writers import write_token_cache

        return write_token_cache(self, url, vocab_size=vocab_size, metadata=metadata, **kwargs)

    def __repr__(self) -> str:
        chain = " → ".join(op.describe() for op in self.operations) or "(no operations)"
        return f"Dataset({len(self.source)} source shards: {chain})"
