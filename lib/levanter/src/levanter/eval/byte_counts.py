"""UTF-8 byte counts of the text behind a token cache, recovered by decoding its documents.

Bits per byte divides by the bytes of the original text, so that models with different tokenizers
compare fairly. The count is taken by decoding each document's tokens (without the BOS/EOS the
tokenize step wrapped it in) and measuring the UTF-8 encoding of the result. That needs no change to
the cache format, works for every cache already written, and measures exactly the documents that are
evaluated. It is exact whenever the tokenizer round-trips text (``decode(encode(text)) == text``), as
byte-level BPE tokenizers (GPT-2's, Llama 3's, the project's built-in one) do; a tokenizer that
normalises text (lowercasing, Unicode normalisation) counts the bytes of the normalised text.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from zephyr.token_cache import TokenCache

from levanter.errors import LevanterError

logger = logging.getLogger(__name__)

_DOCUMENTS_PER_DECODE = 1024
_PROGRESS_EVERY_SECONDS = 10.0


class TokenizerMismatchError(LevanterError, ValueError):
    """The tokenizer given to decode a cache is not the one that wrote it."""


def check_tokenizer_matches(cache: TokenCache, tokenizer: Any) -> None:
    """Raise :class:`TokenizerMismatchError` when the cache records another tokenizer identity."""
    recorded = cache.metadata.get("tokenizer")
    identity = getattr(tokenizer, "identity", None)
    if recorded is not None and identity is not None and recorded != identity:
        raise TokenizerMismatchError(
            f"token cache {cache.url} was written by tokenizer {recorded[:19]}..., but {identity[:19]}... was given "
            f"({getattr(tokenizer, 'source', 'a tokenizer')}); decode it with the tokenizer that wrote it."
        )


def document_byte_counts(cache: TokenCache, tokenizer: Any) -> np.ndarray:
    """Per document of ``cache``: the UTF-8 bytes of its text (int64, ``num_documents`` entries).

    ``tokenizer``: a ``levanter.tokenization.HfTokenizer`` (checked against the cache's recorded
    identity) or a ``tokenizers.Tokenizer``.
    """
    check_tokenizer_matches(cache, tokenizer)
    raw = getattr(tokenizer, "tokenizer", tokenizer)
    bos_id, eos_id = cache.metadata.get("bos_id"), cache.metadata.get("eos_id")
    counts = np.zeros(cache.num_documents, dtype=np.int64)
    started = last_log = time.perf_counter()
    for first in range(0, cache.num_documents, _DOCUMENTS_PER_DECODE):
        stop = min(first + _DOCUMENTS_PER_DECODE, cache.num_documents)
        contents = [_content(cache.document(i), bos_id, eos_id) for i in range(first, stop)]
        # Special tokens that occurred in the text itself are kept: they were part of its bytes.
        texts = raw.decode_batch(contents, skip_special_tokens=False)
        counts[first:stop] = [len(text.encode("utf-8")) for text in texts]
        now = time.perf_counter()
        if now - last_log >= _PROGRESS_EVERY_SECONDS:
            last_log = now
            rate = stop / (now - started)
            logger.info("counting bytes: %d/%d documents (%.0f docs/s, ETA %.0fs)", stop, cache.num_documents,
                        rate, (cache.num_documents - stop) / rate)
    return counts


def _content(ids: np.ndarray, bos_id: int | None, eos_id: int | None) -> list[int]:
    ids = ids.tolist()
    if bos_id is not None and ids and ids[0] == bos_id:
        ids = ids[1:]
    if eos_id is not None and ids and ids[-1] == eos_id:
        ids = ids[:-1]
    return ids


def token_bytes(tokenizer: Any, token_id: int) -> int:
    """UTF-8 bytes of one token decoded alone (exact when the token holds whole characters)."""
    raw = getattr(tokenizer, "tokenizer", tokenizer)
    return len(raw.decode([int(token_id)], skip_special_tokens=True).encode("utf-8"))
