"""``tokenized(...)``: declare a tokenized dataset as a lazy step (nothing is read or tokenized yet).

The handle's identity covers what the data *is*: the resolved source (hub id + revision, content
digests of local files, or the identity of the step that builds the source), the tokenizer's content
digest (or the identity of the step that trains it), and the tokenize settings. Paths never enter it.
"""

from __future__ import annotations

import dataclasses

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from levanter.data import CacheSource
from levanter.tokenization import load_tokenizer
from marin.datasets.sources import ResolvedSource, resolve_source
from marin.datasets.tokenizer_ref import ResolvedTokenizer, TokenizerRef, resolve_tokenizer_ref
from marin.errors import MarinError
from marin.execution.reproducibility.explain import PROVIDED_BY_DEPENDENCY
from marin.execution.lazy import LazyStep, lazy_step
from marin.processing.tokenize import (
    MissingSplitError,
    TokenizeConfig,
    TokenizedDataset,
    TokenizeInputs,
    run_tokenize,
)
from zephyr.readers import expand_input_files

logger = logging.getLogger(__name__)

# Bumped when the tokenize step's output changes meaning, so old caches are never reused for it.
TOKENIZE_STEP_VERSION = "2"


class TokenizerArtifactError(MarinError, ValueError):
    """A tokenizer dependency's artifact does not say where its tokenizer folder is."""


class SourceArtifactError(MarinError, ValueError):
    """A source dependency's artifact does not say which files hold its splits."""


@dataclass(frozen=True)
class DatasetSource:
    """A source as the tokenize step sees it: identity now, files per split when the step runs."""

    identity: dict[str, Any]
    splits: tuple[str, ...]
    description: str
    files_at_run_time: Callable[[Any], Mapping[str, Sequence[str]]]
    deps: tuple[LazyStep, ...] = ()
    builtin: bool = False  # resolved to the project's built-in offline corpus


def tokenized(
    name: str,
    source: str | os.PathLike[str] | LazyStep,
    tokenizer: str | os.PathLike[str] | LazyStep | Any,
    sample_count: int | None = None,
    *,
    validation: str | os.PathLike[str] | None = None,
    text_field: str = "text",
    version: str | None = None,
    prepend_bos: bool = False,
    append_eos: bool = True,
    num_shards: int | None = None,
    output_path: str | None = None,
    resources: Any = None,
    backend: Any = None,
) -> LazyStep:
    """A lazy handle for ``source`` tokenized with ``tokenizer``; its artifact is a :class:`TokenizedDataset`.

    ``source``: a file, folder, glob or fsspec URL of jsonl/parquet/text files; a Hugging Face dataset
    id (resolved to a revision now; offline, the local cache or a built-in substitute); or a lazy step
    whose artifact lists the files of each split. Splits come from the source where it has them;
    ``validation`` names validation files for a file source. ``tokenizer``: a ``tokenizer.json`` path,
    a folder, a hub id, or a lazy step whose artifact has a ``path`` naming a tokenizer folder.
    ``sample_count`` keeps the first N documents of each split. ``backend`` (a zephyr backend or its
    name) only chooses where shards run; it is not part of the identity.
    """
    resolved = resolve_dataset_source(source, sample_count, validation)
    tokenizer_location, tokenizer_revision, tokenizer_identity, tokenizer_dep = resolve_tokenizer(tokenizer)
    config = TokenizeConfig(
        source=resolved.identity,
        tokenizer=tokenizer_identity,
        splits=resolved.splits,
        sample_count=sample_count,
        text_field=text_field,
        prepend_bos=prepend_bos,
        append_eos=append_eos,
        num_shards=num_shards,
    )
    logger.info("tokenized(%r): %s Tokenizer: %s", name, resolved.description, tokenizer_location or tokenizer_dep.name)
    deps = resolved.deps + ((tokenizer_dep,) if tokenizer_dep is not None else ())

    def run(ctx) -> TokenizedDataset:
        inputs, run_config = inputs_at_run_time(ctx, resolved, config, tokenizer_dep, tokenizer_location, tokenizer_revision)
        return run_tokenize(run_config, inputs, ctx.output_path, backend=backend)

    return lazy_step(
        name,
        run,
        deps=deps,
        hash_attrs={"tokenize": config, "format": TOKENIZE_STEP_VERSION},
        version=version,
        resources=resources,
        output_path=output_path,
        # A tokenizer built by a step enters the identity through that dependency, so its attribute is
        # null; `marin explain` says where it comes from (annotations are not hashed).
        annotations={PROVIDED_BY_DEPENDENCY: {"tokenize.tokenizer": tokenizer_dep.name}} if tokenizer_dep else None,
    )


def inputs_at_run_time(ctx: Any, resolved: DatasetSource, config: Any, tokenizer_dep: LazyStep | None,
                       tokenizer_location: str | None, tokenizer_revision: str | None) -> tuple[TokenizeInputs, Any]:
    """What a tokenize step (plain, chat or preference) reads when it runs, and its ``config`` cut to
    the splits the source has: a hub dataset may lack a validation split (the loader then holds out
    a slice of train), but never train."""
    tokenizer_result = None if tokenizer_dep is None else ctx.load_artifact(tokenizer_dep).result
    location = tokenizer_location if tokenizer_result is None else tokenizer_folder(tokenizer_result)
    split_files = {split: tuple(files) for split, files in resolved.files_at_run_time(ctx).items() if files}
    present = tuple(split for split in config.splits if split in split_files)
    if "train" not in present:
        raise MissingSplitError(f"source {resolved.description} has no train files (found: {sorted(split_files)})")
    inputs = TokenizeInputs(
        split_files,
        location,
        tokenizer_revision,
        # What the steps that built the inputs recorded: the result carries it on to training.
        builtin_source=resolved.builtin or any(says_builtin(ctx.load_artifact(dep).result) for dep in resolved.deps),
        builtin_tokenizer=says_builtin(tokenizer_result),
    )
    return inputs, (config if present == config.splits else dataclasses.replace(config, splits=present))


def cache_sources(ctx: Any, datasets: Mapping[LazyStep, float]) -> list[CacheSource]:
    """Inside a step that depends on tokenized handles: a weighted :class:`CacheSource` per handle.

    ``datasets`` is ``{tokenized handle: weight}`` as in the tutorial; validation comes from each
    handle's validation split when it has one (else the loader holds out a slice of train).
    """
    return [cache_source(handle.name, ctx.load_artifact(handle, TokenizedDataset).result, weight)
            for handle, weight in datasets.items()]


def cache_source(name: str, result: TokenizedDataset, weight: float) -> CacheSource:
    """One tokenize step's result (already loaded) as a weighted :class:`CacheSource` named ``name``."""
    validation = result.splits.get("validation")
    return CacheSource(
        name=name,
        train=result.cache_path("train"),
        validation=validation.cache_path if validation is not None else None,
        weight=float(weight),
    )


# -- sources ----------------------------------------------------------------------------------------


def resolve_dataset_source(source: Any, sample_count: int | None, validation: Any) -> DatasetSource:
    if isinstance(source, LazyStep):
        if validation is not None:
            raise ValueError("validation= applies to file sources; a source step's artifact lists its own splits")
        return DatasetSource(
            identity={"kind": "step"},  # the step's own identity enters the hash through deps
            splits=("train", "validation"),
            description=f"the output of step {source.name}",
            files_at_run_time=lambda ctx: _source_files(ctx.load_artifact(source).result),
            deps=(source,),
        )
    resolved = resolve_source(source, sample_count=sample_count)
    if validation is None:
        return _from_resolved(resolved)
    if resolved.kind != "files":
        raise ValueError(f"validation= applies to file sources; {resolved.requested!r} brings its own splits")
    held = resolve_source(validation, splits=("train",))
    if held.kind != "files":
        raise ValueError(f"validation={os.fspath(validation)!r} must be files, not a {held.kind} source")
    files = {"train": resolved.files["train"], "validation": held.files["train"]}
    identity = {"kind": "files", "splits": {"train": resolved.identity["splits"]["train"],
                                            "validation": held.identity["splits"]["train"]}}
    return DatasetSource(
        identity=identity,
        splits=("train", "validation"),
        description=f"{resolved.description} Validation: {held.description}",
        files_at_run_time=lambda ctx: files,
    )


def _from_resolved(resolved: ResolvedSource) -> DatasetSource:
    return DatasetSource(
        identity=dict(resolved.identity),
        splits=tuple(resolved.splits),
        description=resolved.description,
        files_at_run_time=resolved.split_files,
        deps=resolved.deps,
        builtin=resolved.is_builtin,
    )


def _source_files(result: Any) -> dict[str, tuple[str, ...]]:
    data = _as_mapping(result)
    splits = data.get("splits") or data.get("split_files")
    if isinstance(splits, Mapping) and isinstance(data.get("path"), str):
        # File names relative to the step's output folder.
        base = data["path"].rstrip("/")
        splits = {split: [v if "://" in v or v.startswith("/") else f"{base}/{v}" for v in ([value] if isinstance(value, str) else value)]
                  for split, value in splits.items()}
    if isinstance(splits, Mapping):
        files: dict[str, tuple[str, ...]] = {}
        for split, value in splits.items():
            value = _as_mapping(value) if not isinstance(value, (str, list, tuple)) else value
            if isinstance(value, Mapping):
                value = value.get("files") or value.get("path")
            files[split] = tuple(expand_input_files(value if isinstance(value, (list, tuple)) else str(value)))
        return files
    for key in ("files", "path"):
        if data.get(key):
            value = data[key]
            return {"train": tuple(expand_input_files(value if isinstance(value, (list, tuple)) else str(value)))}
    raise SourceArtifactError(
        f"the source step's result has no 'splits' (split -> files) or 'path'/'files' entry: {sorted(data)}"
    )


# -- tokenizers -------------------------------------------------------------------------------------


def resolve_tokenizer(tokenizer: Any) -> tuple[str | None, str | None, str | None, LazyStep | None]:
    """(location, hub revision, content identity, dependency step): loaded now, or a step's output later."""
    revision = None
    if isinstance(tokenizer, TokenizerRef):
        tokenizer = resolve_tokenizer_ref(tokenizer)
    if isinstance(tokenizer, ResolvedTokenizer):
        revision = tokenizer.revision if tokenizer.kind == "hub" else None
        tokenizer = tokenizer.spec
    if isinstance(tokenizer, LazyStep):
        return None, None, None, tokenizer
    if not isinstance(tokenizer, (str, os.PathLike)):
        for attribute in ("path", "name_or_path", "location"):
            candidate = getattr(tokenizer, attribute, None)
            if isinstance(candidate, (str, os.PathLike)):
                tokenizer = candidate
                break
        else:
            raise TypeError(
                f"tokenizer must be a path, a hub id or a lazy step building a tokenizer folder, got {type(tokenizer).__name__}"
            )
    location = os.fspath(tokenizer)
    loaded = load_tokenizer(location, revision=revision)
    return location, revision, loaded.identity, None


def tokenizer_folder(result: Any) -> str:
    data = _as_mapping(result)
    for key in ("path", "folder", "tokenizer_path"):
        if isinstance(data.get(key), str):
            return data[key]
    raise TokenizerArtifactError(
        f"the tokenizer step's result must have a 'path' naming the folder with tokenizer.json; it has {sorted(data)}"
    )


def says_builtin(result: Any) -> bool:
    """Whether a dependency's result says it is one of the project's built-in offline stand-ins."""
    return result is not None and bool(_as_mapping(result).get("builtin", False))


def _as_mapping(result: Any) -> Mapping[str, Any]:
    if isinstance(result, Mapping):
        return result
    if hasattr(result, "__dataclass_fields__"):
        return {name: getattr(result, name) for name in result.__dataclass_fields__}
    raise TypeError(f"expected a dataclass or mapping artifact result, got {type(result).__name__}")
