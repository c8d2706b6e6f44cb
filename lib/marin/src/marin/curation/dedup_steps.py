"""``exact_deduplicated(...)``, ``fuzzy_deduplicated(...)``, ``line_deduplicated(...)``: dedup as lazy, cached steps.

A handle's identity covers what the output *is*: the input's identity (content digests of files, or
the identity of the curation step that produced them), and the dedup config. ``backend`` and
``num_shards`` only choose where and how finely work runs; outputs are the same bytes either way, so
neither enters the hash.

Every input document is written out (``part-NNNNN.jsonl.zst``) with ``kept``, ``reason`` (None, or
``exact-duplicate-of:<id>`` / ``near-duplicate-of:<id>``) and ``cluster`` (the kept representative's
id); the result (:class:`DedupResult`) counts documents and bytes in and out, by reason. Line dedup
instead cuts boilerplate lines from the text (``lines_removed``, ``reason`` ``duplicate-lines:<n>``,
or ``all-lines-duplicated`` with ``kept: false`` when nothing is left).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rigging.filesystem import filesystem
from rigging.filesystem import join as join_url
from zephyr.readers import expand_input_files

from marin.curation.dedup.lines import AnnotateLines, line_decisions
from marin.curation.dedup.minhash import (
    SIGNATURE_SCHEME,
    MinHashConfig,
    candidate_probability,
    lsh_params,
)
from marin.curation.dedup.passes import exact_decisions, fuzzy_decisions, run_pass
from marin.curation.dedup.records import file_sources
from marin.datasets.sources import resolve_source
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.shard_backend import default_backend

DEDUP_STEP_VERSION = "1"


@dataclass(frozen=True)
class ExactDedupConfig:
    text_field: str = "text"
    id_field: str = "id"
    normalization: str = "nfkc-lower-whitespace"


@dataclass(frozen=True)
class FuzzyDedupConfig:
    """MinHash LSH settings. ``bands``/``rows`` default to :func:`lsh_params` for the threshold."""

    threshold: float = 0.7
    num_perm: int = 128
    ngram: int = 5
    shingle: str = "word"
    seed: int = 1
    bands: int | None = None
    rows: int | None = None
    text_field: str = "text"
    id_field: str = "id"

    def lsh(self) -> tuple[int, int]:
        if self.bands is not None and self.rows is not None:
            return self.bands, self.rows
        return lsh_params(self.threshold, self.num_perm, false_positive_weight=0.25)

    def minhash(self) -> MinHashConfig:
        return MinHashConfig(num_perm=self.num_perm, ngram=self.ngram, shingle=self.shingle, seed=self.seed)


@dataclass(frozen=True)
class LineDedupConfig:
    """A stripped line of at least ``min_chars`` characters found in ``min_documents`` documents is boilerplate.

    ``keep_first`` keeps it in the document with the smallest id and cuts it from the others; when
    False it is cut from all of them.
    """

    min_documents: int = 2
    min_chars: int = 20
    keep_first: bool = True
    text_field: str = "text"
    id_field: str = "id"

    def __post_init__(self):
        if self.min_documents < 2:
            raise ValueError(f"LineDedupConfig.min_documents must be at least 2, got {self.min_documents}")


@dataclass(frozen=True)
class DedupResult:
    """What a dedup step wrote: ``path`` (output folder), ``files``, and the counts by reason."""

    path: str
    files: tuple[str, ...]
    documents_in: int
    documents_out: int
    bytes_in: int
    bytes_out: int
    removed: dict[str, int] = field(default_factory=dict)  # reason kind -> documents
    removed_bytes: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> str:
        reasons = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.removed.items())) or "none"
        return (f"dedup {self.path}: {self.documents_in} documents in, {self.documents_out} kept "
                f"({self.bytes_in} -> {self.bytes_out} bytes); removed: {reasons}")


@dataclass(frozen=True)
class _PassSetup:
    """What every dedup step's run starts from: its input files, shard count, folders and backend."""

    sources: list
    shards: int
    work: str
    output: str
    backend: Any

    @classmethod
    def of(cls, ctx: Any, files_at_run_time: Any, config: Any, num_shards: int | None, backend: Any) -> _PassSetup:
        files = files_at_run_time(ctx)
        sources = file_sources(files, config.text_field, config.id_field)
        shards = num_shards or len(sources)
        if backend is None:
            backend = default_backend(max(shards, len(sources)), files, "dedup shards")
        return cls(sources, shards, join_url(ctx.output_path, ".work"), join_url(ctx.output_path, "documents"), backend)


def exact_deduplicated(name: str, source: Any, *, config: ExactDedupConfig = ExactDedupConfig(),
                       num_shards: int | None = None, backend: Any = None, version: str | None = None) -> LazyStep:
    """A lazy handle: ``source`` with documents whose normalised text repeats marked removed (smallest id kept)."""
    identity, deps, files_at_run_time = _resolve_input(source)

    def run(ctx) -> DedupResult:
        at = _PassSetup.of(ctx, files_at_run_time, config, num_shards, backend)
        files, counters = run_pass(at.sources, exact_decisions(at.sources, at.shards), join_url(at.work, "decisions"),
                                   at.output, at.backend, len(at.sources))
        _clean(at.work)
        return _result(ctx.output_path, at.output, files, counters, {})

    return lazy_step(name, run, deps=deps, version=version,
                     hash_attrs={"input": identity, "exact": asdict(config), "format": DEDUP_STEP_VERSION})


def fuzzy_deduplicated(name: str, source: Any, *, config: FuzzyDedupConfig = FuzzyDedupConfig(),
                       num_shards: int | None = None, backend: Any = None, version: str | None = None) -> LazyStep:
    """A lazy handle: ``source`` with MinHash near duplicates marked removed (each cluster keeps its smallest id)."""
    identity, deps, files_at_run_time = _resolve_input(source)
    bands, rows = config.lsh()

    def run(ctx) -> DedupResult:
        at = _PassSetup.of(ctx, files_at_run_time, config, num_shards, backend)
        decisions, counters = fuzzy_decisions(at.sources, config.minhash(), bands, rows, config.threshold, at.work,
                                              at.backend, at.shards)
        files, written = run_pass(at.sources, decisions, join_url(at.work, "decisions"), at.output, at.backend,
                                  len(at.sources))
        _clean(at.work)
        curve = {f"{s:.1f}": round(float(candidate_probability(s, bands, rows)), 4) for s in (0.5, 0.6, 0.7, 0.8, 0.9)}
        details = {"bands": bands, "rows": rows, "candidate_probability": curve,
                   "rounds": counters.get("components/rounds"),
                   "candidate_buckets": counters.get("fuzzy/candidate_buckets", 0)}
        return _result(ctx.output_path, at.output, files, written, details)

    config_attrs = {**asdict(config), "bands": bands, "rows": rows, "signature": SIGNATURE_SCHEME}
    return lazy_step(name, run, deps=deps, version=version,
                     hash_attrs={"input": identity, "fuzzy": config_attrs, "format": DEDUP_STEP_VERSION})


def line_deduplicated(name: str, source: Any, *, config: LineDedupConfig = LineDedupConfig(),
                      num_shards: int | None = None, backend: Any = None, version: str | None = None) -> LazyStep:
    """A lazy handle: ``source`` with lines repeated across ``config.min_documents`` documents cut from the text."""
    identity, deps, files_at_run_time = _resolve_input(source)

    def run(ctx) -> DedupResult:
        at = _PassSetup.of(ctx, files_at_run_time, config, num_shards, backend)
        decisions = line_decisions(at.sources, config.min_documents, config.min_chars, config.keep_first, at.shards)
        files, counters = run_pass(at.sources, decisions, join_url(at.work, "decisions"), at.output, at.backend,
                                   len(at.sources), AnnotateLines(config.text_field, config.min_chars))
        _clean(at.work)
        result = _result(ctx.output_path, at.output, files, counters, {})
        # Documents that lost some lines are still written out: they are not removed documents.
        removed = {k: v for k, v in result.removed.items() if k != "duplicate-lines"}
        removed_bytes = {k: v for k, v in result.removed_bytes.items() if k != "duplicate-lines"}
        details = {"lines_removed": counters.get("lines/removed", 0),
                   "boilerplate_lines": counters.get("lines/boilerplate", 0),
                   "documents_with_lines_removed": result.removed.get("duplicate-lines", 0)}
        return replace(result, removed=removed, removed_bytes=removed_bytes, details=details)

    return lazy_step(name, run, deps=deps, version=version,
                     hash_attrs={"input": identity, "lines": asdict(config), "format": DEDUP_STEP_VERSION})


# -- helpers ---------------------------------------------------------------------------------------


def _resolve_input(source: Any):
    """(identity, deps, files at run time) for files, a folder, a glob, a URL, or another curation step."""
    if isinstance(source, LazyStep):
        return {"kind": "step"}, (source,), lambda ctx: _files_of(ctx.load_artifact(source).result)
    resolved = resolve_source(os.fspath(source))
    if resolved.kind != "files":
        raise ValueError(f"dedup reads files or a curation step's output, not a {resolved.kind} source: {source!r}")
    files = sorted(f for split_files in resolved.files.values() for f in split_files)
    return dict(resolved.identity), (), lambda ctx: files


def _files_of(result: Any) -> list[str]:
    data = result if isinstance(result, Mapping) else getattr(result, "__dict__", {})
    files = data.get("files")
    if files:
        return list(files)
    if data.get("path"):
        return expand_input_files(str(data["path"]))
    raise ValueError(f"the input step's result names no 'files' or 'path': {sorted(data)}")


def _clean(work: str) -> None:
    fs, path = filesystem(work)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _result(path: str, output: str, files: list[str], counters: Mapping[str, int], details: dict) -> DedupResult:
    removed = {k.split("/", 1)[1]: v for k, v in counters.items()
               if k.startswith("documents/") and k.split("/", 1)[1] not in ("in", "out", "kept")}
    removed_bytes = {k.split("/", 1)[1]: v for k, v in counters.items()
                     if k.startswith("bytes/") and k.split("/", 1)[1] not in ("in", "out", "kept")}
    return DedupResult(path=output, files=tuple(files), documents_in=counters.get("documents/in", 0),
                       documents_out=counters.get("documents/out", 0), bytes_in=counters.get("bytes/in", 0),
                       bytes_out=counters.get("bytes/out", 0), removed=removed, removed_bytes=removed_bytes,
                       details=details)
