"""Data sources for experiments: resolving what a source name means, and the built-in offline defaults.

- :func:`resolve_source`: a hub id, file, folder, glob or URL -> :class:`ResolvedSource` (kind,
  identity for hashing, how to read each split, a log line).
- :func:`builtin_tinystories` / :func:`builtin_tokenizer`: the cached steps that build the offline
  corpus (text from the :mod:`storygen` generator) and the offline BPE tokenizer.
- :class:`TokenizerRef`: a hub tokenizer with an offline default, resolved by :func:`resolve_tokenizer_ref`.
"""

from marin.datasets.builtin_corpus import BuiltinCorpus, BuiltinCorpusConfig, builtin_tinystories
from marin.datasets.builtin_tokenizer import BuiltinTokenizerConfig, TrainedTokenizer, builtin_tokenizer
from marin.datasets.hub import HubClient, HubRefusedError, HubRevision, HubUnreachableError, HuggingFaceHub
from marin.datasets.sources import (
    OFFLINE_DEFAULTS,
    ResolvedSource,
    SourceError,
    SourceUnavailableError,
    resolve_source,
)
from marin.datasets.tokenizer_ref import (
    ResolvedTokenizer,
    TokenizerRef,
    TokenizerUnavailableError,
    as_tokenizer_spec,
    resolve_tokenizer_ref,
)

__all__ = [
    "OFFLINE_DEFAULTS",
    "BuiltinCorpus",
    "BuiltinCorpusConfig",
    "BuiltinTokenizerConfig",
    "HubClient",
    "HubRefusedError",
    "HubRevision",
    "HubUnreachableError",
    "HuggingFaceHub",
    "ResolvedSource",
    "ResolvedTokenizer",
    "SourceError",
    "SourceUnavailableError",
    "TokenizerRef",
    "TokenizerUnavailableError",
    "TrainedTokenizer",
    "as_tokenizer_spec",
    "builtin_tinystories",
    "builtin_tokenizer",
    "resolve_source",
    "resolve_tokenizer_ref",
]
