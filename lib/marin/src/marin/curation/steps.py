"""The machinery every curation step shares: inputs, one verdict per document, explainable outputs.

A curation step reads documents (jsonl, jsonl.gz/.zst, parquet or text files; a folder, glob or
URL of them; or another curation step's output), asks a picklable *annotator* for a
:class:`Verdict` on each, and writes one output shard per input file::

    <out>/data/part-00000-of-00002.jsonl.zst      documents passed on (each with kept/reason/score)
    <out>/removed/part-00000-of-00002.jsonl.zst   documents removed, with the rule that removed them
    <out>/stats/part-00000-of-00002.json          the shard's counts, written last: the shard is done

With ``mode="mark"`` nothing is removed: every document goes to ``data/`` with ``kept: false`` and
its ``reason``, and later steps pass such documents on untouched. The step's result
(:class:`CuratedDataset`) sums the shard counts into a summary: documents and bytes in and out, and
by reason. Outputs depend only on the inputs and the config, never on the backend, so ``inline``
and ``processes`` write identical bytes, and a rerun skips finished shards.

An input file that cannot be read to its end fails the step, naming the file and how far it was
read; with ``on_damaged_input="skip"`` the step keeps what was read before the damage and its
summary counts the damaged files (:mod:`marin.curation.damaged_input`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from rigging import filesystem as fsx
from zephyr.dataset import Dataset, expand_glob
from zephyr.execute import execute
from zephyr.readers import input_format, read_jsonl, read_parquet, read_text

from marin.curation.damaged_input import (
    DamagedFile,
    GuardedReader,
    OnDamagedInput,
    check_on_damaged_input,
    damage_summary,
)
from marin.curation.shard_sink import EXTENSIONS, CurationSink, count_documents, merge_stats
from marin.datasets.sources import _file_identity
from marin.errors import MarinError
from marin.execution.artifact import register_result_type
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.running.shard_backend import default_backend

if TYPE_CHECKING:
    from typing_extensions import Unpack

Mode = Literal["remove", "mark"]
OutputFormat = Literal["jsonl", "parquet"]


class OutputOptions(TypedDict, total=False):
    """The options every curation step built on :func:`curation_step` takes, passed on to it.

    ``mode`` (``"remove"``): or ``"mark"``; ``output_format`` (``"jsonl"``): or ``"parquet"``;
    ``version``: a label that changes the step's identity by hand; ``backend``: where shards run
    (not part of the identity); ``on_damaged_input`` (``"fail"``): or ``"skip"``, see
    :mod:`marin.curation.damaged_input`.
    """

    mode: Mode
    output_format: OutputFormat
    version: str | None
    backend: Any
    on_damaged_input: OnDamagedInput


class StepOptions(OutputOptions, total=False):
    """:class:`OutputOptions` and ``text_field`` (``"text"``): the field holding each document's text."""

    text_field: str


class CurationError(MarinError, ValueError):
    """A curation step was declared or fed with something it cannot use; the message says what."""


@dataclass(frozen=True)
class Verdict:
    """What a step decided about one document.

    ``reason`` names the rule that removed it (``None`` when kept); ``score`` is the step's number
    for the document when it has one; ``attributes`` are written into the record (e.g. the
    language); ``hits`` are counted in the summary (e.g. which evaluation items a document shares
    n-grams with).
    """

    kept: bool
    reason: str | None = None
    score: float | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    hits: tuple[str, ...] = ()


@dataclass(frozen=True)
class FieldRule:
    """An annotator from a rule of ``(record, text_field) -> Verdict`` and the field it reads (picklable)."""

    rule: Any
    text_field: str

    def __call__(self, record: dict) -> Verdict:
        return self.rule(record, self.text_field)


@register_result_type
@dataclass(frozen=True)
class CuratedDataset:
    """A curation step's result (its ``.artifact.json``).

    ``files``: the shards of documents passed on that hold any (what the next step or
    ``tokenized()`` reads; ``splits`` says the same for the tokenize step). ``removed_files``: the
    shards of removed documents, for inspection.
    ``summary``: ``documents_in``, ``bytes_in``, ``documents_out``, ``bytes_out``, ``removed``
    (reason -> documents and bytes), ``marked`` (the same for ``mode="mark"``), ``hits``, and
    with ``on_damaged_input="skip"``, ``damaged`` (files read only in part: how many, the documents
    read from them, the bytes left unread where known, and each file with its problem).
    ``details``: figures particular to the step (a dedup step's bands and rows, lines cut, ...).
    """

    files: list[str]
    removed_files: list[str]
    splits: dict[str, list[str]]
    format: str
    text_field: str
    mode: str
    summary: dict[str, Any]
    details: dict[str, Any] = field(default_factory=dict)


# -- inputs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurationInput:
    """An input as a step sees it: an identity now, the files when the step runs."""

    identity: dict[str, Any]
    files_at_run_time: Callable[[Any], list[str]]
    deps: tuple[LazyStep, ...] = ()
    text_field: str | None = None  # a curation step's output says its own text field


def resolve_input(source: Any, *, accept: Callable[[str], bool] | None = None, what: str = "documents") -> CurationInput:
    """A file, folder, glob, URL (or a list of them), or a lazy step whose result lists its files.

    Files are identified by their content (digest, or what an object store reports), never by
    where they are; a step by its own identity (it becomes a dependency).
    """
    if isinstance(source, LazyStep):
        return CurationInput({"kind": "step"}, lambda ctx: step_files(ctx.load_artifact(source).result), (source,))
    if isinstance(source, (str, os.PathLike)) or (isinstance(source, Sequence) and not isinstance(source, str)):
        specs = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else [os.fspath(s) for s in source]
        files = expand_glob(specs, folder_filter=accept or _readable, wanted=what)
        identity = {"kind": "files", "files": [_identity_of(path) for path in files]}
        return CurationInput(identity, lambda ctx: list(files))
    raise CurationError(f"an input must be a path, folder, glob, URL, a list of them or a lazy step; got {type(source).__name__}")


def _identity_of(path: str) -> dict[str, Any]:
    fs, stripped = fsx.filesystem(path)
    protocol = path.split("://", 1)[0] + "://" if "://" in path else ""
    return _file_identity(fs, stripped, os.path.dirname(stripped), protocol)


def _readable(path: str) -> bool:
    try:
        input_format(path)
    except ValueError:
        return False
    return True


def step_files(result: Any) -> list[str]:
    """The document files a dependency's result names: a curation step's ``files``, or its splits."""
    data = result if isinstance(result, Mapping) else getattr(result, "__dict__", {})
    if data.get("files"):
        return list(data["files"])
    splits = data.get("splits")
    if isinstance(splits, Mapping):
        return [f for value in splits.values() for f in ([value] if isinstance(value, str) else value)]
    raise CurationError(f"a dependency's result lists no 'files' or 'splits' to read (it has: {sorted(data)})")


# -- reading records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordReader:
    """Picklable: a file URL to its records (dicts); text files become ``{text_field: text}``."""

    text_field: str = "text"

    def __call__(self, path: str) -> Iterator[dict]:
        kind, _ = input_format(path)
        if kind == "text":
            records: Iterable[Any] = ({self.text_field: text} for text in read_text(path))
        elif kind == "parquet":
            records = read_parquet(path)
        else:
            records = read_jsonl(path)
        for number, record in enumerate(records, 1):
            if not isinstance(record, dict) or not isinstance(record.get(self.text_field), str):
                raise CurationError(f"{path}, record {number}: expected an object with a string field {self.text_field!r}")
            yield record


# -- annotating and writing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Annotate:
    """Picklable ``map`` function: the annotator's verdict merged into the record.

    A record an earlier step marked ``kept: false`` passes on untouched.
    """

    annotator: Callable[[dict], Verdict]
    text_field: str = "text"

    def __call__(self, record: dict | DamagedFile) -> tuple[dict | DamagedFile, tuple[str, ...], int]:
        if isinstance(record, DamagedFile):  # counted by the sink, with the shard
            return record, (), 0
        size_in = len(record[self.text_field].encode("utf-8"))
        if record.get("kept") is False:
            return record, (), size_in
        verdict = self.annotator(record)
        out = dict(record)
        out.update(verdict.attributes)
        out["kept"] = bool(verdict.kept)
        out["reason"] = None if verdict.kept else verdict.reason or "unspecified"
        out["score"] = verdict.score
        return out, tuple(verdict.hits), size_in


def run_curation(
    files: Sequence[str],
    annotator: Callable[[dict], Verdict],
    output_path: str,
    *,
    reader: Callable[[str], Iterable[dict]],
    text_field: str = "text",
    mode: Mode = "remove",
    output_format: OutputFormat = "jsonl",
    backend: Any = None,
    on_damaged_input: OnDamagedInput = "fail",
) -> CuratedDataset:
    """Annotate every record of ``files`` (one shard per file) into ``output_path``; resumable."""
    check_output_options(mode, output_format)
    check_on_damaged_input(on_damaged_input)
    if not files:
        raise CurationError("a curation step needs at least one input file")
    files = list(files)
    guarded = GuardedReader(reader, on_damaged_input)
    dataset = Dataset.from_list(files, num_shards=len(files)).flat_map(guarded).map(Annotate(annotator, text_field))
    if backend is None:
        backend = default_backend(len(files), files, "curation shards")
    result = write_curated(dataset, CurationSink(output_path, output_format, mode, text_field), backend=backend)
    if on_damaged_input == "skip" and "damaged" not in result.summary:
        # with skip the count is always there: a clean run reads as zero damaged files, not as no count
        result = dataclasses.replace(result, summary={**result.summary, "damaged": damage_summary([])})
    return result


def check_output_options(mode: str, output_format: str) -> None:
    if mode not in ("remove", "mark"):
        raise CurationError(f"mode must be 'remove' or 'mark', not {mode!r}")
    if output_format not in EXTENSIONS:
        raise CurationError(f"output_format must be one of {sorted(EXTENSIONS)}, not {output_format!r}")


def write_curated(
    dataset: Dataset,
    sink: CurationSink,
    *,
    backend: Any,
    details: Callable[[Mapping[str, int]], Mapping[str, Any]] | None = None,
) -> CuratedDataset:
    """Write ``(record, hits, bytes in)`` items through ``sink``, shard by shard; resumable.

    ``details(counters)``: the result's ``details``, from the counters the pipeline's functions kept.
    """
    result = execute(dataset, sink, backend=backend, skip_existing=True)
    num_shards = len(result.outputs)
    # Readers refuse empty files, so the result lists only the shards that hold documents.
    paths = [sink.paths(i, num_shards) for i in range(num_shards)]
    data = [p["data"] for p, stats in zip(paths, result.outputs) if stats["documents_out"] + count_documents(stats["marked"])]
    removed = [p["removed"] for p, stats in zip(paths, result.outputs) if count_documents(stats["removed"])]
    return CuratedDataset(
        files=data,
        removed_files=removed,
        splits={"train": data},
        format=sink.output_format,
        text_field=sink.text_field,
        mode=sink.mode,
        summary=merge_stats(result.outputs),
        details=dict(details(result.counters)) if details else {},
    )


def curation_step(
    name: str,
    kind: str,
    source: Any,
    config: Any,
    make_annotator: Callable[[Any], Callable[[dict], Verdict]],
    *,
    text_field: str = "text",
    mode: Mode = "remove",
    output_format: OutputFormat = "jsonl",
    extra_deps: Sequence[LazyStep] = (),
    reader: Callable[[str], Iterable[dict]] | None = None,
    accept: Callable[[str], bool] | None = None,
    version: str | None = None,
    backend: Any = None,
    on_damaged_input: OnDamagedInput = "fail",
) -> LazyStep:
    """A lazy curation step: ``make_annotator(ctx)`` builds the annotator when the step runs.

    The hash covers ``kind``, the step's ``config`` (a frozen dataclass), the input's identity,
    ``text_field``, ``mode`` and ``output_format``, and ``on_damaged_input`` when it is ``"skip"``
    (an output that may lack the end of a damaged file is not the default's, which fails; the
    default is left out, so identities made before the option existed hold); ``backend`` only
    chooses where shards run.
    """
    check_output_options(mode, output_format)
    check_on_damaged_input(on_damaged_input)
    resolved = resolve_input(source, accept=accept)

    def run(ctx) -> CuratedDataset:
        return run_curation(
            resolved.files_at_run_time(ctx),
            make_annotator(ctx),
            ctx.output_path,
            reader=reader or RecordReader(text_field),
            text_field=text_field,
            mode=mode,
            output_format=output_format,
            backend=backend,
            on_damaged_input=on_damaged_input,
        )

    return lazy_step(
        name,
        run,
        deps=resolved.deps + tuple(extra_deps),
        hash_attrs={
            "curation": kind,
            "config": config,
            "input": resolved.identity,
            "text_field": text_field,
            "mode": mode,
            "output_format": output_format,
            **({"on_damaged_input": on_damaged_input} if on_damaged_input != "fail" else {}),
        },
        version=version,
    )


def rule_step(name: str, kind: str, source: Any, rule: Any, **options: Unpack[StepOptions]) -> LazyStep:
    """A curation step whose annotator is ``rule(record, text_field)``, itself the step's config."""
    text_field = options.get("text_field", "text")
    return curation_step(name, kind, source, rule, lambda ctx: FieldRule(rule, text_field), **options)


def read_records(files: Sequence[str], text_field: str = "text") -> Iterator[dict]:
    """Every record of ``files``, in order, in this process (for training sets and eval sets)."""
    reader = RecordReader(text_field)
    for path in files:
        yield from reader(path)


def read_curated(files: Sequence[str]) -> list[dict]:
    """Every record of a curation step's output files (``result.files`` or ``result.removed_files``)."""
    return [record for path in files for record in (read_parquet(path) if path.endswith(".parquet") else read_jsonl(path))]
