"""Writers: one output file (or token-cache shard) per dataset shard, each written atomically.

``output`` names the files: a pattern with ``{shard}`` (and optionally ``{num_shards}``), e.g.
``"out/part-{shard:05d}-of-{num_shards:05d}.jsonl.gz"``, or a folder, in which case files are named
``part-{shard:05d}-of-{num_shards:05d}.<ext>``. Compression follows the extension (``.gz``, ``.zst``).
With ``skip_existing=True`` shards whose file already exists are not recomputed: every file is
written through :func:`rigging.filesystem.atomic_open`, so it appears only when complete (on S3 the
upload goes straight to its name, and S3 shows no object before its upload completes), and an
existing file is a finished one.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from rigging.filesystem import atomic_open

from zephyr._fs import exists, join_url
from zephyr.execute import ExecutionResult, execute
from zephyr.sinks import Sink
from zephyr.token_cache import (
    TokenCacheShardWriter,
    dtype_for_vocab,
    finalize_token_cache,
    read_shard_summary,
    shard_name,
)

logger = logging.getLogger(__name__)

_PARQUET_BATCH_ROWS = 8192


def output_path(output: str, shard_index: int, num_shards: int, default_extension: str) -> str:
    """The file for one shard: ``output`` formatted if it has ``{shard``, else a file inside it."""
    if "{shard" in output:
        return output.format(shard=shard_index, num_shards=num_shards)
    return join_url(output, f"part-{shard_index:05d}-of-{num_shards:05d}{default_extension}")


def _compressed_writer(handle: IO[bytes], path: str) -> tuple[IO[bytes], Any]:
    """Wrap ``handle`` in the compressor the extension asks for; returns (stream, closer)."""
    if path.endswith(".gz"):
        # No name and mtime=0 in the header keep the bytes identical across reruns (the handle is a temp file).
        stream = gzip.GzipFile(filename="", fileobj=handle, mode="wb", mtime=0)
        return stream, stream.close
    if path.endswith(".zst"):
        import zstandard

        # A content checksum in the frame: a reader's decompressor then notices changed bytes itself.
        stream = zstandard.ZstdCompressor(write_checksum=True).stream_writer(handle, closefd=False)
        return stream, stream.close
    return handle, lambda: None


def write_jsonl_file(path: str, records: Iterator[Any]) -> int:
    """Write records as JSON lines to ``path`` atomically; returns the number written."""
    count = 0
    with atomic_open(path, "wb") as handle:
        stream, close = _compressed_writer(handle, path)
        text = io.TextIOWrapper(stream, encoding="utf-8", newline="\n", write_through=False)
        for record in records:
            text.write(json.dumps(record, ensure_ascii=False))
            text.write("\n")
            count += 1
        text.flush()
        text.detach()
        close()
    return count


def write_parquet_file(path: str, records: Iterator[Mapping[str, Any]]) -> int:
    """Write dict records to a Parquet file atomically, in row batches; returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = 0
    with atomic_open(path, "wb") as handle:
        writer = None
        batch: list = []

        def flush() -> None:
            nonlocal writer
            table = pa.Table.from_pylist(batch, schema=writer.schema if writer else None)
            if writer is None:
                writer = pq.ParquetWriter(handle, table.schema)
            writer.write_table(table)

        for record in records:
            batch.append(record)
            count += 1
            if len(batch) >= _PARQUET_BATCH_ROWS:
                flush()
                batch = []
        if batch:
            flush()
        if writer is None:
            # An empty shard still gets a valid (schema-less, zero-row) file so reruns skip it.
            pq.write_table(pa.table({}), handle)
        else:
            writer.close()
    return count


@dataclass(frozen=True)
class FileSink(Sink):
    output: str
    format: str  # "jsonl" | "parquet"

    @property
    def _extension(self) -> str:
        return ".jsonl" if self.format == "jsonl" else ".parquet"

    def path(self, shard_index: int, num_shards: int) -> str:
        return output_path(self.output, shard_index, num_shards, self._extension)

    def write_shard(self, shard_index, num_shards, items):
        path = self.path(shard_index, num_shards)
        if self.format == "jsonl":
            write_jsonl_file(path, items)
        else:
            write_parquet_file(path, items)
        return path

    def output_exists(self, shard_index, num_shards):
        return exists(self.path(shard_index, num_shards))

    def existing_output(self, shard_index, num_shards):
        return self.path(shard_index, num_shards)

    def describe(self) -> str:
        return f"write_{self.format}({self.output})"


def _check_pattern(output: str) -> None:
    if "{" in output and "{shard" not in output:
        raise ValueError(f"output pattern {output!r} has a placeholder other than {{shard}}/{{num_shards}}")


def write_jsonl(dataset: Any, output: str, *, skip_existing: bool = False, **execute_options: Any) -> ExecutionResult:
    """Write each shard's elements (JSON-serialisable) as one JSON-lines file; ``outputs`` are the paths."""
    _check_pattern(output)
    return execute(dataset, FileSink(output, "jsonl"), skip_existing=skip_existing, **execute_options)


def write_parquet(dataset: Any, output: str, *, skip_existing: bool = False, **execute_options: Any) -> ExecutionResult:
    """Write each shard's elements (dicts with the same keys) as one Parquet file."""
    _check_pattern(output)
    return execute(dataset, FileSink(output, "parquet"), skip_existing=skip_existing, **execute_options)


@dataclass(frozen=True)
class TokenCacheSink(Sink):
    url: str
    vocab_size: int
    metadata: Mapping[str, Any]
    loss_mask: bool = False

    def _shard_url(self, shard_index: int) -> str:
        return join_url(self.url, shard_name(shard_index))

    def write_shard(self, shard_index, num_shards, items):
        url = self._shard_url(shard_index)
        with TokenCacheShardWriter(url, dtype_for_vocab(self.vocab_size), loss_mask=self.loss_mask) as writer:
            writer.write_many(items)
            return writer.finish()

    def output_exists(self, shard_index, num_shards):
        # A finished shard of the other kind (with or without masks) is not this sink's output.
        summary = read_shard_summary(self._shard_url(shard_index))
        return summary is not None and summary.has_loss_mask == self.loss_mask

    def existing_output(self, shard_index, num_shards):
        return read_shard_summary(self._shard_url(shard_index))

    def finalize(self, outputs):
        return finalize_token_cache(
            self.url,
            [shard_name(i) for i in range(len(outputs))],
            vocab_size=self.vocab_size,
            metadata=dict(self.metadata),
            loss_mask=self.loss_mask,
        )

    def describe(self) -> str:
        return f"write_token_cache({self.url})"


def write_token_cache(
    dataset: Any,
    url: str,
    *,
    vocab_size: int,
    metadata: Mapping[str, Any] | None = None,
    skip_existing: bool = False,
    loss_mask: bool = False,
    **execute_options: Any,
) -> ExecutionResult:
    """Write a token cache (see ``zephyr.token_cache``): each element is one document's token ids,
    or with ``loss_mask=True`` a ``(token ids, loss mask)`` pair, the mask 1 on the tokens to train on.

    One cache shard per dataset shard; ``ledger.json`` is written after all shards are finished
    and is returned as ``result.finalized``. With ``skip_existing`` finished shards (those with a
    ``shard.json``) are kept, so a rerun after a crash only writes the missing ones.
    """
    sink = TokenCacheSink(str(url).rstrip("/"), int(vocab_size), dict(metadata or {}), bool(loss_mask))
    return execute(dataset, sink, skip_existing=skip_existing, **execute_options)
