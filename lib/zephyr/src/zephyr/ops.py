"""Operations of a dataset chain.

Element-wise operations transform a shard's iterator lazily (``apply``), so a chain of them is a
single generator pipeline: one pass, one element at a time, no intermediate lists. Shuffle
operations (``Reshard``, ``GroupBy``) end a stage: their input is partitioned to scratch files and
read back by the shards of the next stage.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def identity(item: Any) -> Any:
    return item


def first_of_group(key: Any, items: Iterator[Any]) -> Any:
    return next(items)


def stable_hash(value: Any) -> int:
    """A hash that is the same in every process (``hash()`` of a str is salted per process)."""
    try:
        encoded = json.dumps(value, sort_keys=True, default=repr).encode()
    except (TypeError, ValueError):
        encoded = repr(value).encode()
    return int.from_bytes(hashlib.blake2b(encoded, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class Map:
    fn: Callable[[Any], Any]

    def apply(self, items: Iterator[Any]) -> Iterator[Any]:
        return map(self.fn, items)

    def describe(self) -> str:
        return f"map({_name(self.fn)})"


@dataclass(frozen=True)
class Filter:
    predicate: Callable[[Any], bool]

    def apply(self, items: Iterator[Any]) -> Iterator[Any]:
        return filter(self.predicate, items)

    def describe(self) -> str:
        return f"filter({_name(self.predicate)})"


@dataclass(frozen=True)
class FlatMap:
    fn: Callable[[Any], Iterable[Any]]

    def apply(self, items: Iterator[Any]) -> Iterator[Any]:
        return itertools.chain.from_iterable(map(self.fn, items))

    def describe(self) -> str:
        return f"flat_map({_name(self.fn)})"


@dataclass(frozen=True)
class MapShard:
    fn: Callable[[Iterator[Any]], Iterable[Any]]

    def apply(self, items: Iterator[Any]) -> Iterator[Any]:
        return iter(self.fn(items))

    def describe(self) -> str:
        return f"map_shard({_name(self.fn)})"


@dataclass(frozen=True)
class TakePerShard:
    count: int

    def apply(self, items: Iterator[Any]) -> Iterator[Any]:
        return itertools.islice(items, self.count)

    def describe(self) -> str:
        return f"take_per_shard({self.count})"


@dataclass(frozen=True)
class Reshard:
    num_shards: int

    def describe(self) -> str:
        return f"reshard({self.num_shards})"


@dataclass(frozen=True)
class GroupBy:
    key: Callable[[Any], Any]
    reducer: Callable[[Any, Iterator[Any]], Any]
    num_shards: int | None = None

    def describe(self) -> str:
        if self.reducer is first_of_group:
            return f"deduplicate({_name(self.key)})"
        return f"group_by({_name(self.key)}, {_name(self.reducer)})"


ELEMENT_WISE = (Map, Filter, FlatMap, MapShard, TakePerShard)
SHUFFLES = (Reshard, GroupBy)
