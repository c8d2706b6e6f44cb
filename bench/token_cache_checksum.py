"""What token-cache checksums cost: hashing while writing, and verifying on open.

    python bench/token_cache_checksum.py                   # a 384 MB cache in a temporary folder
    python bench/token_cache_checksum.py --size-mb 1024 --dir /mnt/disk/tmp

Writes a cache of ``--size-mb`` of token bytes (random uint16 ids, documents of ~1,000 tokens) in
``--shards`` shards on local disk, then reports:

- hash throughput in memory for the candidates (why xxh3-64: the others would be the bottleneck);
- what checksums add to a write: the hashing and largest-id work the writer does per chunk, timed
  alone over the same chunks, and the end-to-end write time per GB with hashing replaced by a
  no-op (that difference is noisy on a shared machine: disk writeback dominates a write);
- ``TokenCache.open`` time per GB with full verification, with the files in the page cache
  ("warm") and after asking the kernel to drop this cache's pages ("cold": read from the disk);
- ``TokenCache.open(verify_checksums=False)`` (sizes only);
- peak Python memory during a verification, to show it streams (independent of the cache size).

Each figure is the median of ``--repeats`` runs. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
import tracemalloc
import zlib

import numpy as np
import xxhash

from zephyr.token_cache import TokenCache, TokenCacheShardWriter, finalize_token_cache, shard_name
from zephyr.token_cache import writer as token_cache_writer

DOC_TOKENS = 1000
VOCAB = 50_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=384, help="token bytes in the cache (uint16: 2 bytes a token)")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="parent folder on the disk to measure (default: the system temp dir)")
    return p.parse_args()


def hash_throughputs(nbytes: int = 64 << 20, chunk: int = 8 << 20) -> dict[str, float]:
    """GB/s of each candidate over an in-memory buffer, fed in verification-sized chunks."""
    data = memoryview(np.random.default_rng(1).integers(0, VOCAB, nbytes // 2, dtype=np.uint16).tobytes())
    candidates = {
        "xxh3_64": lambda: _feed(xxhash.xxh3_64(), data, chunk),
        "crc32": lambda: _crc32(data, chunk),
        "blake2b": lambda: _feed(hashlib.blake2b(), data, chunk),
        "sha256": lambda: _feed(hashlib.sha256(), data, chunk),
    }
    return {name: nbytes / 1e9 / _median_seconds(run, 3) for name, run in candidates.items()}


def _feed(hasher, data: memoryview, chunk: int) -> str:
    for start in range(0, len(data), chunk):
        hasher.update(data[start : start + chunk])
    return hasher.hexdigest()


def _crc32(data: memoryview, chunk: int) -> int:
    value = 0
    for start in range(0, len(data), chunk):
        value = zlib.crc32(data[start : start + chunk], value)
    return value


def _median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def checksum_work_seconds_per_gb(size_bytes: int) -> float:
    """The work the writer adds per chunk: hash the token and offset bytes, take the largest id."""
    chunk_tokens = token_cache_writer._WRITE_CHUNK_TOKENS
    ids = np.random.default_rng(2).integers(0, VOCAB, min(size_bytes // 2, 64 << 20), dtype=np.uint16)
    ends = np.arange(DOC_TOKENS, chunk_tokens + 1, DOC_TOKENS, dtype=np.int64)

    def work() -> None:
        tokens, offsets = xxhash.xxh3_64(), xxhash.xxh3_64()
        for start in range(0, ids.size, chunk_tokens):
            chunk = ids[start : start + chunk_tokens]
            int(chunk.max())
            tokens.update(chunk.tobytes())  # the writer hashes the bytes it is about to write anyway
            offsets.update(ends.tobytes())
        tokens.hexdigest(), offsets.hexdigest()

    def copy_only() -> None:  # what the writer does without checksums, to subtract
        for start in range(0, ids.size, chunk_tokens):
            ids[start : start + chunk_tokens].tobytes()
            ends.tobytes()

    return (_median_seconds(work, 3) - _median_seconds(copy_only, 3)) / (ids.nbytes / 1e9)


class _NoHash:
    """Stands in for the hasher to time a write without checksums."""

    def update(self, data) -> None:
        pass

    def hexdigest(self) -> str:
        return "0" * 16


def write_cache(root: str, size_bytes: int, shards: int) -> None:
    tokens_per_shard = size_bytes // 2 // shards
    rng = np.random.default_rng(0)
    for index in range(shards):
        ids = rng.integers(0, VOCAB, tokens_per_shard, dtype=np.uint16)
        with TokenCacheShardWriter(f"{root}/{shard_name(index)}", np.uint16) as writer:
            writer.write_many(ids[start : start + DOC_TOKENS] for start in range(0, ids.size, DOC_TOKENS))
    finalize_token_cache(root, [shard_name(i) for i in range(shards)], vocab_size=VOCAB)


def timed_write(root: str, size_bytes: int, shards: int, hashing: bool) -> float:
    original = token_cache_writer.new_hasher
    if not hashing:
        token_cache_writer.new_hasher = _NoHash
    try:
        began = time.perf_counter()
        write_cache(root, size_bytes, shards)
        return time.perf_counter() - began
    finally:
        token_cache_writer.new_hasher = original


def cache_files(root: str) -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names]


def drop_from_page_cache(root: str) -> None:
    """Evict only this cache's pages (flushed first), so the next read comes from the disk."""
    for path in cache_files(root):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    args = parse_args()
    size_bytes = args.size_mb << 20
    results: dict[str, float] = {}

    hashes = hash_throughputs()
    print("hash throughput in memory (one core, 8 MiB chunks):")
    for name, rate in hashes.items():
        print(f"  {name:8s} {rate:6.2f} GB/s")
        results[f"hash_{name}_gb_per_s"] = round(rate, 3)

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="token-cache-bench-") as parent:
        # Write once without timing, so every timed write finds the disk and allocator in the same state.
        write_cache(os.path.join(parent, "warmup"), size_bytes, args.shards)
        writes = {True: [], False: []}
        for repeat in range(args.repeats):
            for hashing in (repeat % 2 == 0, repeat % 2 == 1):  # alternate the order against drift
                target = os.path.join(parent, f"w{repeat}-{hashing}")
                writes[hashing].append(timed_write(target, size_bytes, args.shards, hashing))
        root = os.path.join(parent, "w0-True")
        cache_bytes = sum(os.path.getsize(p) for p in cache_files(root) if p.endswith(".bin"))
        gb = cache_bytes / 1e9
        write_with, write_without = statistics.median(writes[True]), statistics.median(writes[False])
        work = checksum_work_seconds_per_gb(size_bytes)

        TokenCache.open(root)  # pages in the page cache
        warm = _median_seconds(lambda: TokenCache.open(root), args.repeats)
        sizes_only = _median_seconds(lambda: TokenCache.open(root, verify_checksums=False), args.repeats)
        cold_times = []
        for _ in range(args.repeats):
            drop_from_page_cache(root)
            cold_times.append(_median_seconds(lambda: TokenCache.open(root), 1))
        cold = statistics.median(cold_times)

        tracemalloc.start()
        TokenCache.open(root)
        peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    print(f"cache: {gb:.3f} GB of .bin files in {args.shards} shards ({args.size_mb} MiB of tokens)")
    print(f"checksum work in a write: {work:6.3f} s/GB ({100 * work / (write_with / gb):.1f}% of a write)")
    runs = {hashing: ", ".join(f"{t / gb:.2f}" for t in times) for hashing, times in writes.items()}
    print(f"write with checksums:     {write_with / gb:6.3f} s/GB  (runs: {runs[True]})")
    print(f"write with hashing off:   {write_without / gb:6.3f} s/GB  (runs: {runs[False]})")
    print(f"verify on open, warm:     {gb / warm:6.2f} GB/s  ({warm / gb:.3f} s per GB)")
    print(f"verify on open, cold:     {gb / cold:6.2f} GB/s  ({cold / gb:.3f} s per GB)")
    print(f"open without checksums:   {sizes_only * 1e3:6.2f} ms for the whole cache (sizes only)")
    print(f"peak Python memory during verification: {peak_bytes / 2**20:.1f} MiB")
    results.update(
        cache_gb=round(gb, 3),
        checksum_work_s_per_gb=round(work, 4),
        write_s_per_gb=round(write_with / gb, 4),
        write_without_checksums_s_per_gb=round(write_without / gb, 4),
        verify_warm_gb_per_s=round(gb / warm, 3),
        verify_warm_s_per_gb=round(warm / gb, 4),
        verify_cold_gb_per_s=round(gb / cold, 3),
        verify_cold_s_per_gb=round(cold / gb, 4),
        open_sizes_only_s=round(sizes_only, 5),
        verify_peak_python_mib=round(peak_bytes / 2**20, 2),
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
