"""Writing a curation step's shards: passed-on and removed documents, then the shard's counts.

Each shard is three files (``data/``, ``removed/``, ``stats/``); the counts are written last, so a
shard whose ``stats`` file exists is complete and a rerun skips it. Counts from all shards merge
into the step's summary.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx
from rigging.filesystem import atomic_open
from zephyr.sinks import Sink

from marin.curation.damaged_input import DamagedFile, damage_summary

EXTENSIONS = {"jsonl": ".jsonl.zst", "parquet": ".parquet"}
_PARQUET_BATCH_ROWS = 4096


class _ShardWriter:
    """One output file, written a record at a time, atomically (it appears only when complete)."""

    def __init__(self, path: str, output_format: str):
        self.path, self.format = path, output_format
        self._context = atomic_open(path, "wb")
        self._handle = self._context.__enter__()
        if output_format == "jsonl":
            import zstandard

            # A content checksum in the frame, so a decompressor notices changed bytes on its own.
            self._stream = zstandard.ZstdCompressor(write_checksum=True).stream_writer(self._handle, closefd=False)
            self._text = io.TextIOWrapper(self._stream, encoding="utf-8", newline="\n")
        else:
            self._batch: list[dict] = []
            self._parquet = None

    def write(self, record: dict) -> None:
        if self.format == "jsonl":
            self._text.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
        else:
            self._batch.append(record)
            if len(self._batch) >= _PARQUET_BATCH_ROWS:
                self._flush_parquet()

    def _flush_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(self._batch, schema=self._parquet.schema if self._parquet else None)
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(self._handle, table.schema)
        self._parquet.write_table(table)
        self._batch = []

    def close(self) -> None:
        if self.format == "jsonl":
            self._text.flush()
            self._text.detach()
            self._stream.close()
        else:
            if self._batch:
                self._flush_parquet()
            if self._parquet is None:
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.table({}), self._handle)
            else:
                self._parquet.close()
        self._context.__exit__(None, None, None)

    def abort(self, error: BaseException) -> None:
        self._context.__exit__(type(error), error, error.__traceback__)


def shard_name(index: int, num_shards: int) -> str:
    return f"part-{index:05d}-of-{num_shards:05d}"


@dataclass(frozen=True)
class CurationSink(Sink):
    """Writes each shard's passed-on and removed documents, then its counts (the completion mark)."""

    output_path: str
    output_format: str
    mode: str
    text_field: str

    def paths(self, index: int, num_shards: int) -> dict[str, str]:
        name = shard_name(index, num_shards)
        extension = EXTENSIONS[self.output_format]
        return {
            "data": fsx.join(self.output_path, "data", name + extension),
            "removed": fsx.join(self.output_path, "removed", name + extension),
            "stats": fsx.join(self.output_path, "stats", name + ".json"),
        }

    def write_shard(self, shard_index, num_shards, items):
        paths = self.paths(shard_index, num_shards)
        stats = empty_stats()
        writers = {"data": _ShardWriter(paths["data"], self.output_format),
                   "removed": _ShardWriter(paths["removed"], self.output_format)}
        try:
            for record, hits, size_in in items:
                if isinstance(record, DamagedFile):
                    stats.setdefault("damaged", []).append(dataclasses.asdict(record))
                    continue
                size = len(record[self.text_field].encode("utf-8"))
                stats["documents_in"] += 1
                stats["bytes_in"] += size_in
                for hit in hits:
                    stats["hits"][hit] = stats["hits"].get(hit, 0) + 1
                if record.get("kept", True):
                    stats["documents_out"] += 1
                    stats["bytes_out"] += size
                    writers["data"].write(record)
                    continue
                removed = self.mode == "remove"
                bucket = stats["removed" if removed else "marked"].setdefault(record["reason"], {"documents": 0, "bytes": 0})
                bucket["documents"] += 1
                bucket["bytes"] += size_in
                writers["removed" if removed else "data"].write(record)
        except BaseException as error:
            for writer in writers.values():
                writer.abort(error)
            raise
        for writer in writers.values():
            writer.close()
        fsx.atomic_write(paths["stats"], json.dumps(stats, sort_keys=True))
        return stats

    def output_exists(self, shard_index, num_shards):
        return fsx.exists(self.paths(shard_index, num_shards)["stats"])

    def existing_output(self, shard_index, num_shards):
        with fsx.open_url(self.paths(shard_index, num_shards)["stats"], "rb") as handle:
            return json.loads(handle.read())

    def describe(self) -> str:
        return f"curate({self.output_path})"


def empty_stats() -> dict[str, Any]:
    return {"documents_in": 0, "bytes_in": 0, "documents_out": 0, "bytes_out": 0, "removed": {}, "marked": {}, "hits": {}}


def count_documents(by_reason: Mapping[str, Mapping[str, int]]) -> int:
    return sum(bucket["documents"] for bucket in by_reason.values())


def merge_stats(shards: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    total = empty_stats()
    hits: Counter = Counter()
    for stats in shards:
        for key in ("documents_in", "bytes_in", "documents_out", "bytes_out"):
            total[key] += stats[key]
        for kind in ("removed", "marked"):
            for reason, bucket in stats[kind].items():
                into = total[kind].setdefault(reason, {"documents": 0, "bytes": 0})
                into["documents"] += bucket["documents"]
                into["bytes"] += bucket["bytes"]
        hits.update(stats["hits"])
    total["removed"] = dict(sorted(total["removed"].items()))
    total["marked"] = dict(sorted(total["marked"].items()))
    total["hits"] = dict(sorted(hits.items()))
    damaged = [entry for stats in shards for entry in stats.get("damaged", ())]
    if damaged:
        total["damaged"] = damage_summary(damaged)
    return total
