"""Encoding documents into token ids in batches, with bounded memory for arbitrarily long documents.

The tokenizers library materialises, per token, the id plus its string, offsets and masks, so
encoding a 50 MB document in one call costs gigabytes. Long texts are therefore cut into pieces of at
most ``max_piece_chars`` characters, encoded a bounded number of characters at a time, and the ids
joined. Cuts are placed just before a space that sits between two non-space characters: byte-level
BPE pre-tokenizers (GPT-2, Llama 3 style) never let a token span such a boundary, so for them the
joined ids equal the ids of the uncut text. Only a text with no such space in half a piece (no
natural word boundary at all) is cut mid-word, where ids near the cut may differ.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from levanter.errors import LevanterError
from levanter.tokenization.loading import HfTokenizer

# Normal documents (stories, web pages) are far below this and are never cut.
DEFAULT_MAX_PIECE_CHARS = 100_000
# Upper bound on characters handed to one encode_batch call when pieces of long documents are encoded.
DEFAULT_MAX_BATCH_CHARS = 4_000_000


class MissingSpecialTokenError(LevanterError, ValueError):
    """BOS or EOS was asked for but the tokenizer defines no such token."""


class TokenIdOverflowError(LevanterError, ValueError):
    """The tokenizer produced an id too large for the dtype the ids were asked in."""


@dataclass(frozen=True)
class SpecialTokenPolicy:
    """Which special ids wrap every document: ``[bos] + content + [eos]`` as configured."""

    bos_id: int | None = None
    eos_id: int | None = None

    @classmethod
    def for_tokenizer(cls, tokenizer: HfTokenizer, *, prepend_bos: bool, append_eos: bool) -> "SpecialTokenPolicy":
        if prepend_bos and tokenizer.bos_id is None:
            raise MissingSpecialTokenError(
                f"prepend_bos=True but tokenizer {tokenizer.source!r} has no BOS token; set prepend_bos=False."
            )
        if append_eos and tokenizer.eos_id is None:
            raise MissingSpecialTokenError(
                f"append_eos=True but tokenizer {tokenizer.source!r} has no EOS token; set append_eos=False "
                "or add an eos_token to its tokenizer_config.json."
            )
        return cls(bos_id=tokenizer.bos_id if prepend_bos else None, eos_id=tokenizer.eos_id if append_eos else None)

    @property
    def extra_tokens_per_document(self) -> int:
        return int(self.bos_id is not None) + int(self.eos_id is not None)


def split_text(text: str, max_chars: int = DEFAULT_MAX_PIECE_CHARS) -> Iterator[str]:
    """Yield consecutive pieces of ``text`` (joined, they are ``text``), each at most ``max_chars`` long."""
    if max_chars < 2:
        raise ValueError(f"max_chars must be >= 2, got {max_chars}")
    start, n = 0, len(text)
    while n - start > max_chars:
        limit = start + max_chars
        floor = start + max_chars // 2
        cut = _safe_cut(text, floor, limit)
        yield text[start:cut]
        start = cut
    yield text[start:]


def _safe_cut(text: str, floor: int, limit: int) -> int:
    # Latest space in (floor, limit] with non-space characters on both sides; else a hard cut.
    pos = text.rfind(" ", floor + 1, limit + 1)
    while pos > floor:
        if pos + 1 < len(text) and not text[pos - 1].isspace() and not text[pos + 1].isspace():
            return pos
        pos = text.rfind(" ", floor + 1, pos)
    return limit


def encode_documents(
    tokenizer: HfTokenizer,
    texts: Sequence[str],
    special: SpecialTokenPolicy = SpecialTokenPolicy(),
    *,
    max_piece_chars: int = DEFAULT_MAX_PIECE_CHARS,
    max_batch_chars: int = DEFAULT_MAX_BATCH_CHARS,
    dtype: np.dtype | type = np.uint32,
) -> list[np.ndarray]:
    """Token ids of each text, wrapped with BOS/EOS per ``special``, as arrays of ``dtype``.

    The tokenizer's own post-processing (its template special tokens) is not applied: ``special`` is
    the single source of truth for what wraps a document, and it is recorded in the cache metadata.
    ``dtype`` (unsigned) lets a caller that stores narrower ids (a token cache of a small vocabulary)
    get them without a second conversion; an id it cannot hold is a :class:`TokenIdOverflowError`.
    """
    tok = tokenizer.tokenizer
    encode_batch = fastest_encode_batch(tok)
    dtype = np.dtype(dtype)
    results: list[np.ndarray | None] = [None] * len(texts)

    short_idx = [i for i, t in enumerate(texts) if len(t) <= max_piece_chars]
    # Short texts: one encode_batch call per bounded group, so the Rust side parallelises across cores.
    # The special ids join the list the tokenizer returns, so each document becomes an array once.
    for group in _groups_by_chars(short_idx, texts, max_batch_chars):
        encodings = encode_batch([texts[i] for i in group], add_special_tokens=False)
        for i, enc in zip(group, encodings):
            ids = enc.ids
            if special.bos_id is not None:
                ids.insert(0, special.bos_id)
            if special.eos_id is not None:
                ids.append(special.eos_id)
            results[i] = _ids_array(ids, dtype)

    for i, text in enumerate(texts):
        if results[i] is None:
            ids = _encode_long(encode_batch, text, max_piece_chars, max_batch_chars).tolist()
            head = [special.bos_id] if special.bos_id is not None else []
            tail = [special.eos_id] if special.eos_id is not None else []
            results[i] = _ids_array(head + ids + tail, dtype)
    return results  # type: ignore[return-value]


def _ids_array(ids: list[int], dtype: np.dtype) -> np.ndarray:
    """``ids`` as an array of ``dtype``; an id it cannot hold is refused, never wrapped around."""
    try:
        return np.array(ids, dtype=dtype)  # NumPy refuses a Python int the dtype cannot hold
    except OverflowError:
        raise TokenIdOverflowError(
            f"the tokenizer produced token id {max(ids)}, which {dtype.name} cannot hold; is the tokenizer's "
            "vocab_size what the ids were sized for?"
        ) from None


def fastest_encode_batch(tok):
    # encode_batch_fast (tokenizers >= 0.20) skips computing character offsets, which the data
    # pipeline never uses; the ids are identical to encode_batch's.
    return getattr(tok, "encode_batch_fast", None) or tok.encode_batch


def _encode_long(encode_batch, text: str, max_piece_chars: int, max_batch_chars: int) -> np.ndarray:
    parts: list[np.ndarray] = []
    pending: list[str] = []
    pending_chars = 0
    for piece in split_text(text, max_piece_chars):
        pending.append(piece)
        pending_chars += len(piece)
        if pending_chars >= max_batch_chars:
            parts.extend(np.asarray(e.ids, dtype=np.uint32) for e in encode_batch(pending, add_special_tokens=False))
            pending, pending_chars = [], 0
    if pending:
        parts.extend(np.asarray(e.ids, dtype=np.uint32) for e in encode_batch(pending, add_special_tokens=False))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def _groups_by_chars(indices: list[int], texts: Sequence[str], max_chars: int) -> Iterator[list[int]]:
    group: list[int] = []
    size = 0
    for i in indices:
        if group and size + len(texts[i]) > max_chars:
            yield group
            group, size = [], 0
        group.append(i)
        size += len(texts[i])
    if group:
        yield group
