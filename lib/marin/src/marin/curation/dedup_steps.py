"""``exact_deduplicated(...)``, ``fuzzy_deduplicated(...)``, ``line_deduplicated(...)``: dedup as lazy, cached steps.

A handle's identity covers what the output *is*: the input's identity (content digests of files, or
the identity of the curation step that produced them), the dedup config, ``mode`` and
``output_format``. ``backend``, ``num_shards`` and ``spill`` (a
:class:`~marin.curation.dedup.spill.SpillSettings`: the buffers that bound a worker's memory) only
choose where, how finely and in what pieces work runs; outputs are the same bytes either way, so
none of them enters the hash.

Outputs are laid out as every curation step's (:mod:`marin.curation.steps`): ``data/`` (documents
passed on), ``removed/`` (with ``mode="mark"``, nothing: removed documents stay in ``data/`` with
``kept: false``) and ``stats/``, and the result is a :class:`~marin.curation.steps.CuratedDataset`.
Every document carries ``kept``, ``reason`` (None, ``"exact-duplicate"`` or ``"near-duplicate"``)
and ``cluster`` (the id of its cluster's kept document). Line dedup instead cuts boilerplate lines
from the text (``lines_removed``), removing a document only when nothing is left
(``reason: "all-lines-duplicated"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rigging.filesystem import filesystem
from rigging.filesystem import join as join_url

from marin.curation.dedup.lines import AnnotateLines, line_decisions
from marin.curation.dedup.minhash import (
    SIGNATURE_SCHEMES,
    MinHashConfig,
    candidate_probability,
    lsh_params,
)
from marin.curation.dedup.passes import (
    exact_decisions,
    fuzzy_decisions,
    run_pass,
)
from marin.curation.dedup.records import file_sources
from marin.curation.dedup.spill import SpillSettings
from marin.curation.steps import (
    CuratedDataset,
    CurationInput,
    CurationSink,
    Mode,
    OutputFormat,
    check_output_options,
    resolve_input,
)
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.running.shard_backend import default_backend

# 2: outputs laid out as every curation step's (data/, removed/, stats/), reasons without ids.
# 3: output shard i holds input file i (the streaming passes), where 2 placed files by a hash of their
#    index: the same decisions in other files, so results laid out by 2 are not reused.
DEDUP_STEP_VERSION = "3"


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
class _PassSetup:
    """What every dedup step's run starts from: its input files, shard count, folders and backend."""

    sources: list
    shards: int
    work: str
    output: CurationSink
    backend: Any
    spill: SpillSettings

    @classmethod
    def of(cls, ctx: Any, resolved: CurationInput, config: Any, num_shards: int | None, backend: Any,
           mode: Mode, output_format: OutputFormat, spill: SpillSettings) -> _PassSetup:
        files = resolved.files_at_run_time(ctx)
        sources = file_sources(files, config.text_field, config.id_field)
        shards = num_shards or len(sources)
        if backend is None:
            backend = default_backend(max(shards, len(sources)), files, "dedup shards")
        output = CurationSink(ctx.output_path, output_format, mode, config.text_field)
        return cls(sources, shards, join_url(ctx.output_path, ".work"), output, backend, spill)

    def finish(self, result: CuratedDataset) -> CuratedDataset:
        fs, path = filesystem(self.work)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        return result


def _declare(name: str, source: Any, kind: str, attributes: Mapping[str, Any], run: Any, mode: Mode,
             output_format: OutputFormat, version: str | None) -> LazyStep:
    check_output_options(mode, output_format)
    resolved = resolve_input(source)
    return lazy_step(name, lambda ctx: run(ctx, resolved), deps=resolved.deps, version=version,
                     hash_attrs={"input": resolved.identity, kind: dict(attributes), "mode": mode,
                                 "output_format": output_format, "format": DEDUP_STEP_VERSION})


def exact_deduplicated(name: str, source: Any, *, config: ExactDedupConfig = ExactDedupConfig(),
                       mode: Mode = "remove", output_format: OutputFormat = "jsonl", num_shards: int | None = None,
                       backend: Any = None, version: str | None = None,
                       spill: SpillSettings = SpillSettings()) -> LazyStep:
    """A lazy handle: ``source`` without the documents whose normalised text repeats (each cluster keeps its smallest id)."""

    def run(ctx, resolved: CurationInput) -> CuratedDataset:
        at = _PassSetup.of(ctx, resolved, config, num_shards, backend, mode, output_format, spill)
        decisions, counters = exact_decisions(at.sources, join_url(at.work, "keys"), at.backend, at.shards, at.spill)
        return at.finish(run_pass(at.sources, decisions, join_url(at.work, "decisions"), at.output, at.backend,
                                  at.spill, counters=counters))

    return _declare(name, source, "exact", asdict(config), run, mode, output_format, version)


def fuzzy_deduplicated(name: str, source: Any, *, config: FuzzyDedupConfig = FuzzyDedupConfig(),
                       mode: Mode = "remove", output_format: OutputFormat = "jsonl", num_shards: int | None = None,
                       backend: Any = None, version: str | None = None,
                       spill: SpillSettings = SpillSettings()) -> LazyStep:
    """A lazy handle: ``source`` without MinHash near duplicates (each cluster keeps its smallest id)."""
    bands, rows = config.lsh()

    def details(counters: Mapping[str, int]) -> dict[str, Any]:
        curve = {f"{s:.1f}": round(float(candidate_probability(s, bands, rows)), 4) for s in (0.5, 0.6, 0.7, 0.8, 0.9)}
        return {"bands": bands, "rows": rows, "candidate_probability": curve,
                "rounds": counters.get("components/rounds"),
                "candidate_buckets": counters.get("fuzzy/candidate_buckets", 0)}

    def run(ctx, resolved: CurationInput) -> CuratedDataset:
        at = _PassSetup.of(ctx, resolved, config, num_shards, backend, mode, output_format, spill)
        decisions, counters = fuzzy_decisions(at.sources, config.minhash(), bands, rows, config.threshold, at.work,
                                              at.backend, at.shards, at.spill)
        return at.finish(run_pass(at.sources, decisions, join_url(at.work, "decisions"), at.output, at.backend,
                                  at.spill, details=details, counters=counters))

    attributes = {**asdict(config), "bands": bands, "rows": rows, "signature": SIGNATURE_SCHEMES[config.shingle]}
    return _declare(name, source, "fuzzy", attributes, run, mode, output_format, version)


def line_deduplicated(name: str, source: Any, *, config: LineDedupConfig = LineDedupConfig(),
                      mode: Mode = "remove", output_format: OutputFormat = "jsonl", num_shards: int | None = None,
                      backend: Any = None, version: str | None = None,
                      spill: SpillSettings = SpillSettings()) -> LazyStep:
    """A lazy handle: ``source`` with lines repeated across ``config.min_documents`` documents cut from the text."""

    def details(counters: Mapping[str, int]) -> dict[str, Any]:
        return {"lines_removed": counters.get("lines/removed", 0),
                "boilerplate_lines": counters.get("lines/boilerplate", 0),
                "documents_with_lines_removed": counters.get("lines/documents_changed", 0)}

    def run(ctx, resolved: CurationInput) -> CuratedDataset:
        at = _PassSetup.of(ctx, resolved, config, num_shards, backend, mode, output_format, spill)
        decisions, counters = line_decisions(at.sources, config.min_documents, config.min_chars, config.keep_first,
                                             join_url(at.work, "keys"), at.backend, at.shards, at.spill)
        return at.finish(run_pass(at.sources, decisions, join_url(at.work, "decisions"), at.output, at.backend,
                                  at.spill, AnnotateLines(config.text_field, config.min_chars), details, counters))

    return _declare(name, source, "lines", asdict(config), run, mode, output_format, version)
