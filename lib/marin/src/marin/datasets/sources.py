"""Resolving a data source named by the user into exactly what will be read, and its identity.

A source is a Hugging Face dataset id, or local/remote files (a file, a folder, a glob, any fsspec
URL). :func:`resolve_source` turns it into a :class:`ResolvedSource`: what kind it turned out to
be, the identity that goes into the tokenize step's hash, how to find each split's files when the
step runs, and a one-line description for the log.

Hub ids resolve to the hub's current commit (one quick metadata request), else to the local
Hugging Face cache, else, only for ids with a built-in offline default, to that default, with a
WARNING that says so. The identity always records what was actually resolved, so a run on the
built-in corpus never shares a hash, a cache or an output folder with a run on the real dataset.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rigging import filesystem as fsx

from marin.datasets.builtin_corpus import SPLIT_FILES, BuiltinCorpusConfig, builtin_tinystories, corpus_config_for
from marin.datasets.hub import HubClient, HubRefusedError, hub_offline, resolve_revision
from marin.errors import MarinError
from marin.execution.lazy import LazyStep

logger = logging.getLogger(__name__)

SourceKind = Literal["hub", "files", "builtin"]
DEFAULT_SPLITS = ("train", "validation")

# Hub ids that have a built-in offline default, and how to build that default for a sample count.
OFFLINE_DEFAULTS: dict[str, Callable[[int | None], BuiltinCorpusConfig]] = {
    "roneneldan/TinyStories": corpus_config_for,
}

# Files above this size are identified by a digest of their size, head and tail instead of their
# whole content, so that declaring an experiment over a huge file stays quick.
FULL_DIGEST_MAX_BYTES = 256 * 1024 * 1024
_SAMPLE_BYTES = 8 * 1024 * 1024

_SPLIT_ALIASES = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev", "eval"),
    "test": ("test",),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DATA_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".txt", ".text", ".md")
_COMPRESSION_SUFFIXES = ("", ".gz", ".zst")


class SourceError(MarinError, ValueError):
    """A source that cannot be used; the message says what to do."""


class SourceUnavailableError(SourceError):
    """A hub dataset that can be neither fetched nor found in the local cache, and has no offline default."""


@dataclass(frozen=True)
class ResolvedSource:
    """What a source resolved to.

    ``identity``: JSON-like; goes into the tokenize step's hash.
    ``files``: for ``files`` sources, each split's concrete file paths/URLs.
    ``repo_id``/``revision``: for ``hub`` sources.
    ``step``: for ``builtin`` sources, the step that materialises the corpus; the tokenize step
    must depend on it (see :attr:`deps`).
    """

    kind: SourceKind
    requested: str
    identity: Mapping[str, Any]
    description: str
    splits: tuple[str, ...]
    files: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    repo_id: str | None = None
    revision: str | None = None
    step: LazyStep | None = None

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"

    @property
    def deps(self) -> tuple[LazyStep, ...]:
        """Steps a consumer of this source must depend on."""
        return () if self.step is None else (self.step,)

    def split_files(self, ctx: Any = None) -> dict[str, list[str]]:
        """Each split's files, ready for a reader; call it inside the consuming step.

        ``ctx`` (the consuming step's StepContext) is needed for ``builtin`` sources, whose files
        live in the output folder of :attr:`step`. For ``hub`` sources this downloads the data files
        at the pinned revision (or finds them in the local cache).
        """
        if self.kind == "files":
            return {split: list(paths) for split, paths in self.files.items()}
        if self.kind == "builtin":
            if ctx is None:
                raise SourceError(f"{self.requested}: the built-in corpus's files are only known inside a step; pass its StepContext")
            folder = ctx.dep_output_path(self.step)
            return {split: [fsx.join(folder, SPLIT_FILES[split])] for split in self.splits}
        from zephyr.readers import resolve_hub_dataset

        dataset = resolve_hub_dataset(self.repo_id, revision=self.revision)
        return {split: list(dataset.splits[split]) for split in self.splits if split in dataset.splits}


def resolve_source(
    source: str | os.PathLike[str],
    *,
    sample_count: int | None = None,
    splits: Sequence[str] = DEFAULT_SPLITS,
    hub: HubClient | None = None,
) -> ResolvedSource:
    """Resolve ``source`` (hub id, file, folder, glob or URL); see the module docstring.

    ``sample_count`` sizes the built-in corpus (at least that many training documents); for other
    kinds it does not affect resolution (the consumer takes the first documents itself).
    """
    spec = os.fspath(source)
    splits = tuple(splits)
    if "train" not in splits:
        raise SourceError(f"splits={splits!r} must include 'train'")
    if _looks_like_hub_id(spec):
        resolved = _resolve_hub(spec, sample_count, splits, hub)
    else:
        resolved = _resolve_files(spec, splits)
    log = logger.warning if resolved.is_builtin else logger.info
    log("%s", resolved.description)
    return resolved


def _looks_like_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.match(spec)) and not fsx.exists(spec)


# -- hub ---------------------------------------------------------------------------------------


def _resolve_hub(repo_id: str, sample_count: int | None, splits: tuple[str, ...], hub: HubClient | None) -> ResolvedSource:
    try:
        revision, why_not_hub = resolve_revision(repo_id, "dataset", hub=hub)
    except HubRefusedError as error:
        raise SourceUnavailableError(
            f"Dataset {repo_id!r}: {error}. Check the id on https://huggingface.co/datasets, log in for gated "
            "datasets (`hf auth login`), or pass a local path."
        ) from error
    if revision is not None:
        where = "the Hugging Face hub" if revision.origin == "hub" else f"the local Hugging Face cache ({revision.local_path})"
        return ResolvedSource(
            kind="hub",
            requested=repo_id,
            identity={"kind": "hub", "repo_id": repo_id, "revision": revision.revision},
            description=f"Source {repo_id}: Hugging Face dataset at revision {revision.revision} from {where}.",
            splits=splits,
            repo_id=repo_id,
            revision=revision.revision,
        )
    make_config = OFFLINE_DEFAULTS.get(repo_id)
    reason = "HF_HUB_OFFLINE is set" if hub_offline() else f"the hub is unreachable ({why_not_hub})"
    if make_config is None:
        raise SourceUnavailableError(
            f"Dataset {repo_id!r} cannot be resolved: {reason} and it is not in the local Hugging Face cache. "
            f"Connect to the network and rerun (unset HF_HUB_OFFLINE), pre-download it with "
            f"`hf download {repo_id} --repo-type dataset` while online, or pass a local file, folder or glob "
            "of jsonl/parquet/text files. (If you meant a local path, it does not exist.)"
        )
    config = make_config(sample_count)
    wanted = tuple(s for s in splits if s in SPLIT_FILES)
    return ResolvedSource(
        kind="builtin",
        requested=repo_id,
        identity=config.identity(),
        description=(
            f"Source {repo_id}: {reason} and the dataset is not in the local Hugging Face cache, so the BUILT-IN "
            f"OFFLINE CORPUS is used instead of the hub dataset: synthetic TinyStories-style stories from "
            f"{config.generator} v{config.generator_version} (seed {config.seed}, {config.train_count:,} train / "
            f"{config.validation_count:,} validation). Results are not comparable with runs on the real dataset."
        ),
        splits=wanted,
        step=builtin_tinystories(config),
    )


# -- files -------------------------------------------------------------------------------------


def _resolve_files(spec: str, splits: tuple[str, ...]) -> ResolvedSource:
    fs, path = fsx.filesystem(spec)
    if any(ch in path for ch in "*?["):
        root = path[: min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        paths = sorted(p for p in fs.glob(path) if fs.isfile(p))
        by_name = True
    elif fs.isdir(path):
        root = path
        paths = sorted(p for p in fs.find(path) if _is_data_file(p))
        by_name = True
    elif fs.exists(path):
        root = path.rsplit("/", 1)[0] if "/" in path else ""
        paths = [path]
        by_name = False  # one file named explicitly is the training data, whatever it is called
    else:
        raise SourceError(
            f"Source {spec!r} does not exist (as a file, folder, glob or URL), and is not a Hugging Face dataset id "
            "(owner/name). Check the path, relative to the current directory."
        )
    if not paths:
        raise SourceError(f"Source {spec!r} matches no data files ({', '.join(_DATA_SUFFIXES)}, optionally .gz/.zst).")
    files = _assign_splits(paths, root, splits, by_name)
    if "train" not in files:
        raise SourceError(
            f"Source {spec!r} has no training files: every file's name marks it as another split "
            f"({', '.join(sorted(files))}). Name the training files, e.g. train.jsonl, or pass them directly."
        )
    protocol = _protocol(spec)
    urls = {split: tuple(protocol + p for p in ps) for split, ps in files.items()}
    identity = {
        "kind": "files",
        "splits": {split: [_file_identity(fs, p, root, protocol) for p in ps] for split, ps in files.items()},
    }
    counts = ", ".join(f"{split}: {len(ps)} file{'s' * (len(ps) != 1)}" for split, ps in files.items())
    return ResolvedSource(
        kind="files",
        requested=spec,
        identity=identity,
        description=f"Source {spec}: local/remote files ({counts}).",
        splits=tuple(files),
        files=urls,
    )


def _is_data_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1].lower()
    if name.startswith((".", "_")) or name.startswith("readme"):
        return False
    return any(name.endswith(s + c) for s in _DATA_SUFFIXES for c in _COMPRESSION_SUFFIXES)


def split_of(relative_path: str) -> str | None:
    """The split a file's name or folder marks it as ('train', 'validation', 'test'), or None."""
    words = re.split(r"[^a-z]+", relative_path.lower())
    for split, aliases in _SPLIT_ALIASES.items():
        if any(alias in words for alias in aliases):
            return split
    return None


def _assign_splits(paths: list[str], root: str, splits: tuple[str, ...], by_name: bool) -> dict[str, list[str]]:
    if not by_name:
        return {"train": paths}
    named = {p: split_of(_relative(p, root)) for p in paths}
    if not any(s not in (None, "train") for s in named.values()):
        return {"train": paths}  # no file names another split: everything is training data
    files: dict[str, list[str]] = {}
    for p, split in named.items():
        split = split or "train"
        if split in splits:
            files.setdefault(split, []).append(p)
    return {s: files[s] for s in splits if s in files}


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/")
    return path[len(root) + 1 :] if root and path.startswith(root + "/") else path.rsplit("/", 1)[-1]


def _protocol(spec: str) -> str:
    return spec.split("://", 1)[0] + "://" if "://" in spec else ""


def _file_identity(fs: Any, path: str, root: str, protocol: str) -> dict[str, Any]:
    """Content identity of one file; the location is left out for local files (placement, not content)."""
    info = fs.info(path)
    size = int(info.get("size") or 0)
    record: dict[str, Any] = {"name": _relative(path, root), "size": size}
    if protocol in ("", "file://", "local://"):
        record.update(_content_digest(fs, path, size))
    else:
        # Remote objects are identified by what the store reports, without downloading them.
        record["url"] = protocol + path
        for key in ("etag", "ETag", "md5Hash", "crc32c", "mtime", "LastModified", "updated", "generation"):
            if info.get(key) is not None:
                record[key.lower()] = str(info[key])
    return record


def _content_digest(fs: Any, path: str, size: int) -> dict[str, str]:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        if size <= FULL_DIGEST_MAX_BYTES:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
            return {"sha256": digest.hexdigest()}
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(size - _SAMPLE_BYTES)
        digest.update(handle.read(_SAMPLE_BYTES))
    return {"sampled_sha256": digest.hexdigest()}
