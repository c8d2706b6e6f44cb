"""The built-in offline stand-in for ``roneneldan/TinyStories``, materialised by a cached step.

The project builds this corpus itself, so building it is a step of the DAG (DESIGN §1): a lazy step
that writes ``train.jsonl`` and ``validation.jsonl`` (``{"text": ...}`` per line) into its output
folder. Its identity is the generator's name and version, the seed and the split sizes, never the
hub dataset's, so nothing derived from it can be mistaken for the real thing.

Train stories are indices ``0 .. train_count-1`` of the seed's stream and validation stories start
at a far-away index, so the two splits never share a story index.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field

from rigging import filesystem as fsx

from storygen import GENERATOR_NAME, GENERATOR_VERSION, iter_stories
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.running.step_context import StepContext

logger = logging.getLogger(__name__)

DEFAULT_SEED = 0
DEFAULT_TRAIN_COUNT = 10_000
DEFAULT_VALIDATION_COUNT = 500
VALIDATION_START_INDEX = 1_000_000_000
SPLIT_FILES = {"train": "train.jsonl", "validation": "validation.jsonl"}
STEP_NAME = "datasets/builtin-tinystories"

_PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class BuiltinCorpusConfig:
    """Everything that decides the corpus's content; it is the step's hash attributes."""

    stands_in_for: str = "roneneldan/TinyStories"
    generator: str = GENERATOR_NAME
    generator_version: str = GENERATOR_VERSION
    seed: int = DEFAULT_SEED
    train_count: int = DEFAULT_TRAIN_COUNT
    validation_count: int = DEFAULT_VALIDATION_COUNT

    def identity(self) -> dict:
        return {"kind": "builtin", **asdict(self)}

    def split_range(self, split: str) -> tuple[int, int]:
        """(first story index, count) of a split."""
        if split == "train":
            return 0, self.train_count
        if split == "validation":
            return VALIDATION_START_INDEX, self.validation_count
        raise KeyError(f"the built-in corpus has splits {sorted(SPLIT_FILES)}, not {split!r}")


@dataclass(frozen=True)
class BuiltinCorpus:
    """The step's artifact result: where each split's jsonl lies and how many stories it holds."""

    path: str
    split_files: dict[str, str] = field(default_factory=dict)  # split -> file name inside ``path``
    documents: dict[str, int] = field(default_factory=dict)
    words: dict[str, int] = field(default_factory=dict)
    identity: dict = field(default_factory=dict)
    # Says, for every step that reads this result, that the text is the project's own stand-in.
    builtin: bool = True


def corpus_config_for(sample_count: int | None) -> BuiltinCorpusConfig:
    """The corpus to use when ``sample_count`` training documents are asked for.

    The default size covers the tutorial; a larger request grows the train split so it is never
    silently smaller than asked. Requests at or under the default share one corpus (and one cache).
    """
    train_count = DEFAULT_TRAIN_COUNT if sample_count is None else max(DEFAULT_TRAIN_COUNT, int(sample_count))
    return BuiltinCorpusConfig(train_count=train_count)


def builtin_tinystories(config: BuiltinCorpusConfig | None = None) -> LazyStep:
    """The lazy step that writes the built-in corpus; deterministic, so it runs once per prefix."""
    config = config or BuiltinCorpusConfig()
    return lazy_step(STEP_NAME, write_builtin_corpus, hash_attrs={"corpus": config}, version=GENERATOR_VERSION)


def write_builtin_corpus(ctx: StepContext) -> BuiltinCorpus:
    config: BuiltinCorpusConfig = _config_of(ctx)
    documents: dict[str, int] = {}
    words: dict[str, int] = {}
    for split, file_name in SPLIT_FILES.items():
        start, count = config.split_range(split)
        url = fsx.join(ctx.output_path, file_name)
        documents[split], words[split] = _write_split(url, config.seed, start, count, split)
    return BuiltinCorpus(ctx.output_path, dict(SPLIT_FILES), documents, words, config.identity())


def _config_of(ctx: StepContext) -> BuiltinCorpusConfig:
    attrs = ctx.step.hash_attrs["corpus"]
    if isinstance(attrs, BuiltinCorpusConfig):
        return attrs
    return BuiltinCorpusConfig(**{k: v for k, v in dict(attrs).items() if k in BuiltinCorpusConfig.__dataclass_fields__})


def _write_split(url: str, seed: int, start: int, count: int, split: str) -> tuple[int, int]:
    began = last_report = time.monotonic()
    written = words = 0
    # atomic_open: a crash leaves no half-written split that a later reader could take for whole.
    with fsx.atomic_open(url, "wb") as out:
        for story in iter_stories(count, seed=seed, start=start):
            out.write(json.dumps({"text": story.text}, ensure_ascii=False).encode("utf-8") + b"\n")
            written += 1
            words += story.word_count
            now = time.monotonic()
            if now - last_report >= _PROGRESS_EVERY_S:
                last_report = now
                rate = written / (now - began)
                logger.info("built-in corpus %s: %d/%d stories (%.0f/s, ETA %.0fs)", split, written, count, rate,
                            (count - written) / rate)
    elapsed = time.monotonic() - began
    logger.info("built-in corpus %s: wrote %d stories (%d words) in %.1fs to %s", split, written, words, elapsed, url)
    return written, words
