"""MinHash signatures and LSH banding, vectorised with numpy.

A document becomes a set of shingles (word or character n-grams of its normalised text), each
hashed to 64 bits and folded to 32 (high half xor low half). A signature holds, for each of
``num_perm`` hash functions, the minimum over the document's shingles; two signatures agree in one
position with probability (close to) the documents' Jaccard similarity (Broder 1997). A minimum is
the same over a set and over a list that repeats its members, so shingles are hashed where they
occur, repeats and all, and never collected into sets.

The functions are random affine permutations of 32-bit values, h_i(x) = a_i m(x) + b_i mod 2^32
with odd a_i (so h_i is a bijection) and m the MurmurHash3 32-bit finaliser, an avalanching
bijection that spreads every input bit before the multiply. Arithmetic mod 2^32 is numpy's
wrapping uint32 multiply and add. It is also datasketch's default ("affine32") family since its
2.0, so given the same shingle hashes and coefficients both produce the same signatures, which the
tests check.

No Python runs per shingle: a word n-gram's hash combines the xxh3 hashes of its words
(:class:`WordShingleHasher`), a character n-gram's the code points of its characters
(:func:`char_shingle_hashes`), by multiply-xor over a batch's whole array at once. How shingles are
hashed is part of :data:`SIGNATURE_SCHEMES`, which names the kernel in the fuzzy step's identity.

LSH cuts a signature into ``b`` bands of ``r`` rows; documents that agree on every row of some band
share a bucket and become candidates. A pair with Jaccard ``s`` becomes a candidate with probability
``1 - (1 - s^r)^b`` (the S-curve; Leskovec et al., *Mining of Massive Datasets*, ch. 3).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

# Names the shingle hash and function family per shingle kind; part of the fuzzy step's identity, so
# outputs made with another kernel are never reused. Character shingles were hashed as xxh3 of their
# UTF-8 bytes ("xxh3-fold32-fmix32-affine32") until they were hashed from code points in numpy.
SIGNATURE_SCHEMES = {
    "word": "xxh3-fold32-fmix32-affine32",
    "char": "codepoint-xormul64-mix64-fold32-fmix32-affine32",
}
_LOW_32 = np.uint64((1 << 32) - 1)
_LOW_64 = (1 << 64) - 1
_WORD = re.compile(r"\w+")
# Shingles put through every function per block: 1 MiB of uint32 scratch, a few blocks per batch.
_SHINGLES_PER_BLOCK = 1 << 18
_NO_SHINGLE = np.uint32(0xFFFFFFFF)
_KEY_SEED = np.uint64(0x9E3779B97F4A7C15)
_KEY_MULTIPLIER = np.uint64(0x100000001B3)


def normalize_text(text: str) -> str:
    """NFKC, lower case, whitespace runs collapsed to one space, stripped."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


@dataclass(frozen=True)
class MinHashConfig:
    """How signatures are computed. ``shingle``: ``"word"`` or ``"char"`` n-grams of size ``ngram``."""

    num_perm: int = 128
    ngram: int = 5
    shingle: str = "word"
    seed: int = 1

    def __post_init__(self) -> None:
        if self.shingle not in ("word", "char"):
            raise ValueError(f"shingle must be 'word' or 'char', got {self.shingle!r}")
        if self.num_perm < 1 or self.ngram < 1:
            raise ValueError(f"num_perm and ngram must be positive, got {self.num_perm} and {self.ngram}")


def shingles(text: str, ngram: int, shingle: str = "word") -> list[str]:
    """The distinct n-grams of ``text``'s normalised words (or characters); a short text is one shingle."""
    if shingle == "word":
        words = _WORD.findall(unicodedata.normalize("NFKC", text).lower())
        if len(words) <= ngram:
            return [" ".join(words)]
        return list({" ".join(words[i:i + ngram]) for i in range(len(words) - ngram + 1)})
    chars = normalize_text(text)
    if len(chars) <= ngram:
        return [chars]
    return list({chars[i:i + ngram] for i in range(len(chars) - ngram + 1)})


class WordShingleHasher:
    """64-bit hashes of word n-grams for a batch of documents, without building the n-gram strings.

    Each distinct word is hashed once with xxh3 (a cache remembers it); an n-gram's hash combines its
    words' hashes, multiply-xor over the batch's word array at once, then a final 64-bit mix. Equal
    n-grams get equal hashes, so the shingle *sets* are those of :func:`shingles` (up to 64-bit collisions).
    """

    def __init__(self, ngram: int, seed: int, cache_limit: int = 1 << 20):
        self.ngram, self.seed, self.cache_limit = ngram, seed, cache_limit
        self.cache: dict[str, int] = {}

    def _word_hashes(self, words: list[str]) -> np.ndarray:
        cache, digest, seed = self.cache, xxhash.xxh3_64_intdigest, self.seed
        if len(cache) > self.cache_limit:
            cache.clear()
        # Only a batch's distinct new words reach Python-level code; the lookups run in C.
        for word in dict.fromkeys(words).keys() - cache.keys():
            cache[word] = digest(word.encode("utf-8"), seed)
        return np.fromiter(map(cache.__getitem__, words), dtype=np.uint64, count=len(words))

    def __call__(self, texts: Sequence[str]) -> list[np.ndarray]:
        n = self.ngram
        tokenised = [_WORD.findall(unicodedata.normalize("NFKC", text).lower()) for text in texts]
        lengths = np.array([len(words) for words in tokenised], dtype=np.int64)
        flat = self._word_hashes([w for words in tokenised for w in words])
        combined = flat[: max(len(flat) - n + 1, 0)].copy()
        for k in range(1, n):
            combined = (combined * _KEY_MULTIPLIER) ^ flat[k: k + len(combined)]
        combined = _mix64(combined)
        starts = np.concatenate(([0], np.cumsum(lengths)))
        out = []
        digest = xxhash.xxh3_64_intdigest
        for index, words in enumerate(tokenised):
            if len(words) <= n:  # a short text is one shingle, hashed like the string form
                out.append(np.array([digest(" ".join(words).encode("utf-8"), self.seed)], dtype=np.uint64))
            else:
                out.append(combined[starts[index]: starts[index] + len(words) - n + 1])
        return out


def char_shingle_hashes(texts: Sequence[str], ngram: int) -> list[np.ndarray]:
    """64-bit hashes of every character n-gram of each text's normalised form (a short text is one shingle).

    The batch's texts are laid end to end as one array of code points; each window's hash is a
    multiply-xor over its ``ngram`` code points, computed for every window of the array at once,
    then a final 64-bit mix; windows that straddle two texts are dropped. The hashes are those of
    the n-grams of :func:`shingles` (``shingle="char"``), repeats included.
    """
    normalised = [normalize_text(text) for text in texts]
    lengths = np.fromiter(map(len, normalised), dtype=np.int64, count=len(normalised))
    # UTF-32 is one unit per code point, so the array lines up with the strings; lone surrogates pass.
    codes = np.frombuffer("".join(normalised).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    windows = max(len(codes) - ngram + 1, 0)
    combined = np.full(windows, _KEY_SEED, dtype=np.uint64)
    for k in range(ngram):
        combined ^= codes[k:k + windows]
        combined *= _KEY_MULTIPLIER
    combined = _mix64(combined)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    out = []
    for index, length in enumerate(lengths.tolist()):
        start = int(starts[index])
        if length > ngram:
            out.append(combined[start:start + length - ngram + 1])
        else:  # the whole text, hashed like a window of its length
            key = int(_KEY_SEED)
            for code in codes[start:start + length].tolist():
                key = ((key ^ code) * int(_KEY_MULTIPLIER)) & _LOW_64
            out.append(_mix64(np.array([key], dtype=np.uint64)))
    return out


def batch_shingle_hashes(texts: Sequence[str], config: MinHashConfig, hasher: WordShingleHasher | None = None) -> list[np.ndarray]:
    """Shingle hashes of every text, by the scheme :data:`SIGNATURE_SCHEMES` names for ``config.shingle``."""
    if config.shingle == "word":
        return (hasher or WordShingleHasher(config.ngram, config.seed))(texts)
    return char_shingle_hashes(texts, config.ngram)


def _mix64(key: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads every input bit over the key."""
    key = key ^ (key >> np.uint64(30))
    key = key * np.uint64(0xBF58476D1CE4E5B9)
    key = key ^ (key >> np.uint64(27))
    key = key * np.uint64(0x94D049BB133111EB)
    return key ^ (key >> np.uint64(31))


def permutations(config: MinHashConfig) -> tuple[np.ndarray, np.ndarray]:
    """The coefficients (uint32) of the ``num_perm`` functions: odd a, any b, fixed by ``seed``."""
    rng = np.random.Generator(np.random.PCG64(config.seed))
    a = rng.integers(0, 1 << 31, size=config.num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = rng.integers(0, 1 << 32, size=config.num_perm, dtype=np.uint64).astype(np.uint32)
    return a, b


def fold32(hashes: np.ndarray) -> np.ndarray:
    """64-bit shingle hashes to 32 bits: the high half xor the low half."""
    hashes = np.asarray(hashes, dtype=np.uint64)
    return ((hashes >> np.uint64(32)) ^ (hashes & _LOW_32)).astype(np.uint32)


def fmix32(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser (a bijection): every input bit reaches every output bit."""
    values = values ^ (values >> np.uint32(16))
    values = values * np.uint32(0x85EBCA6B)
    values = values ^ (values >> np.uint32(13))
    values = values * np.uint32(0xC2B2AE35)
    return values ^ (values >> np.uint32(16))


def signatures(hash_lists: Sequence[np.ndarray], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """MinHash signatures (``len(hash_lists)`` x ``num_perm``, uint32) of documents given their shingle hashes.

    Each 64-bit shingle hash is folded to 32 bits, mixed by :func:`fmix32` and put through
    h(x) = a x + b mod 2^32 for every (a, b). The batch's shingles lie end to end in one array; one
    function at a time runs over a block of it (three numpy calls: multiply, add, and
    ``minimum.reduceat`` at the documents' starts), so every call works on a long contiguous run,
    and the block stays in cache across the functions. A document cut by a block's edge takes the
    minimum of its parts.
    """
    num_perm = len(a)
    if not hash_lists:
        return np.empty((0, num_perm), dtype=np.uint32)
    lengths = np.fromiter((len(h) for h in hash_lists), dtype=np.int64, count=len(hash_lists))
    if (lengths == 0).any():
        raise ValueError("every document needs at least one shingle")
    values = fmix32(fold32(np.concatenate(hash_lists)))
    a, b = np.asarray(a, dtype=np.uint32), np.asarray(b, dtype=np.uint32)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    by_function = np.full((num_perm, len(hash_lists)), _NO_SHINGLE, dtype=np.uint32)
    scratch = np.empty(min(len(values), _SHINGLES_PER_BLOCK), dtype=np.uint32)
    for low in range(0, len(values), _SHINGLES_PER_BLOCK):
        high = min(low + _SHINGLES_PER_BLOCK, len(values))
        first, last = int(np.searchsorted(ends, low, side="right")), int(np.searchsorted(starts, high))
        cuts = np.maximum(starts[first:last], low) - low
        block, hashed = values[low:high], scratch[: high - low]
        for i in range(num_perm):
            np.multiply(block, a[i], out=hashed)  # wraps: mod 2^32
            hashed += b[i]
            row = by_function[i, first:last]
            np.minimum(row, np.minimum.reduceat(hashed, cuts), out=row)
    return np.ascontiguousarray(by_function.T)


def estimated_jaccard(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Fraction of agreeing signature positions (broadcasts over leading axes)."""
    return (left == right).mean(axis=-1)


# -- LSH parameters ---------------------------------------------------------------------------------


def candidate_probability(similarity: np.ndarray | float, bands: int, rows: int) -> np.ndarray:
    """The S-curve: probability that a pair with Jaccard ``similarity`` shares at least one bucket."""
    return 1.0 - (1.0 - np.asarray(similarity, dtype=np.float64) ** rows) ** bands


def lsh_params(threshold: float, num_perm: int, false_positive_weight: float = 0.5) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimising the weighted error areas of the S-curve.

    False positives are the area under the curve below ``threshold``, false negatives the area above
    the curve from ``threshold`` to 1; candidates are verified afterwards, so the default weighs both alike.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must lie strictly between 0 and 1, got {threshold}")
    below = np.linspace(0.0, threshold, 201)
    above = np.linspace(threshold, 1.0, 201)
    best, best_error = (1, num_perm), float("inf")
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp = np.trapezoid(candidate_probability(below, bands, rows), below)
            fn = np.trapezoid(1.0 - candidate_probability(above, bands, rows), above)
            error = false_positive_weight * fp + (1.0 - false_positive_weight) * fn
            if error < best_error - 1e-12:
                best, best_error = (bands, rows), error
    return best


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """Bucket keys (documents x bands, uint64): a multiply-xor hash of each band's rows, then a final mix.

    Keys of different bands never meet: buckets are keyed by ``(band, key)``.
    """
    data = signatures[:, : bands * rows].reshape(len(signatures), bands, rows).astype(np.uint64)
    key = np.full(data.shape[:2], _KEY_SEED, dtype=np.uint64)
    for row in range(rows):
        key = (key ^ data[:, :, row]) * _KEY_MULTIPLIER
    return _mix64(key)
