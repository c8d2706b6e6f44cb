"""The built-in offline tokenizer: byte-level BPE trained by the project on the built-in corpus.

Used when a tokenizer reference's hub tokenizer can be neither fetched nor found in the local
cache. Training it is a cached step, so it happens once per prefix; its identity (the step's and
the content digest in its artifact) differs from any hub tokenizer's.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from levanter.tokenization import save_tokenizer, tokenizer_identity, train_bpe_tokenizer
from rigging import filesystem as fsx

from marin.datasets.builtin_corpus import SPLIT_FILES, BuiltinCorpusConfig, builtin_tinystories
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.running.step_context import StepContext

logger = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 4096
END_OF_TEXT = "<|endoftext|>"
STEP_NAME = "tokenizers/builtin-bpe"
TRAINER_VERSION = "1"


@dataclass(frozen=True)
class BuiltinTokenizerConfig:
    """Everything that decides the trained tokenizer's content (the step's hash attributes)."""

    vocab_size: int = DEFAULT_VOCAB_SIZE
    algorithm: str = "byte-level-bpe"
    special_tokens: tuple[str, ...] = (END_OF_TEXT,)
    eos_token: str = END_OF_TEXT
    min_frequency: int = 2
    trained_on: str = "train"  # the corpus split it learns from


@dataclass(frozen=True)
class TrainedTokenizer:
    """The step's artifact result. ``path`` is a folder holding ``tokenizer.json`` (and the HF configs)."""

    path: str
    vocab_size: int
    identity: str  # sha256 of the canonical tokenizer.json, as levanter.tokenization computes it
    eos_token: str
    documents: int
    # Says, for every step that reads this result, that the tokenizer is the project's own stand-in.
    builtin: bool = True


def builtin_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE, corpus: LazyStep | None = None) -> LazyStep:
    """The lazy step that trains the built-in tokenizer on the built-in corpus (default size)."""
    corpus = corpus or builtin_tinystories(BuiltinCorpusConfig())
    config = BuiltinTokenizerConfig(vocab_size=vocab_size)
    return lazy_step(STEP_NAME, train_builtin_tokenizer, deps=(corpus,), hash_attrs={"tokenizer": config},
                     version=TRAINER_VERSION)


def train_builtin_tokenizer(ctx: StepContext) -> TrainedTokenizer:
    attrs = ctx.step.hash_attrs["tokenizer"]
    config = attrs if isinstance(attrs, BuiltinTokenizerConfig) else BuiltinTokenizerConfig(**dict(attrs))
    (corpus,) = ctx.step.deps
    train_file = fsx.join(ctx.dep_output_path(corpus), SPLIT_FILES[config.trained_on])
    began = time.monotonic()
    texts = list(_read_texts(train_file))
    tok = train_bpe_tokenizer(texts, config.vocab_size, special_tokens=config.special_tokens,
                              min_frequency=config.min_frequency)
    save_tokenizer(tok, ctx.output_path, eos_token=config.eos_token)  # a local folder or the prefix's store
    result = TrainedTokenizer(
        path=ctx.output_path,
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        identity=tokenizer_identity(tok.to_str()),
        eos_token=config.eos_token,
        documents=len(texts),
    )
    logger.info("Trained the built-in BPE tokenizer (vocab %d) on %d built-in stories in %.1fs: %s",
                result.vocab_size, len(texts), time.monotonic() - began, result.path)
    return result


def _read_texts(url: str):
    with fsx.open_url(url, "rb") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)["text"]
