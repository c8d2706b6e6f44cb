"""How the training windows cover the replies of chat data, checked before training starts.

Chat caches are packed into fixed windows like plain text (:mod:`levanter.data.windows`), and a
loss mask says which tokens are the assistant's. A conversation that crosses a window boundary is
cut: its later part is trained without its beginning in view (each window attends within itself),
and some reply tokens are never trained at all (a window's first token is never a target; the tail
past the last full window is dropped). Nothing in the loss shows it: the mean over the reply tokens
that remain looks normal, and when no reply token is left in any training window every step trains
on nothing at a loss of exactly 0.

So :func:`check_reply_coverage` counts, for a cache with a loss mask, the conversations cut and
what happens to every reply token, by index arithmetic over the document boundaries and the mask
(one pass over the mask, in chunks), and logs the counts as a WARNING when anything is cut. It
refuses (:class:`NoRepliesInWindowsError`) training windows, or validation windows, that hold no
reply token, and with ``on_cut_conversation="refuse"`` any cut conversation
(:class:`CutConversationError`), naming the longest conversation and the remedy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from levanter.data.windows import TokenWindows
from levanter.errors import LevanterError

logger = logging.getLogger(__name__)

CUT_CONVERSATION_POLICIES = ("warn", "refuse")
_CHUNK_TOKENS = 1 << 24


class NoRepliesInWindowsError(LevanterError, ValueError):
    """Chat data whose training (or validation) windows hold none of its reply tokens."""


class CutConversationError(LevanterError, ValueError):
    """Chat data with conversations cut by a window boundary, refused on request."""


@dataclass(frozen=True)
class ReplyCoverage:
    """What the windows of one cache make of its conversations and reply tokens.

    ``trained``: reply tokens that are a target in a training window, ``without_start`` of them
    with their conversation's first token in an earlier window; ``validated``: those only in
    validation windows; ``lost``: the rest, never a target (a window's first token, the tail past
    the last full window).
    """

    seq_len: int
    conversations: int
    cut: int
    longer_than_seq_len: int
    longest: int
    reply_tokens: int
    trained: int
    without_start: int
    validated: int

    @property
    def lost(self) -> int:
        return self.reply_tokens - self.trained - self.validated


def measure_reply_coverage(train: TokenWindows, held: TokenWindows | None = None) -> ReplyCoverage:
    """Count how ``train`` (and ``held``, when its windows are of the same cache) cover the cache's replies."""
    cache, seq_len = train.cache, train.seq_len
    bounds = cache.document_boundaries()
    starts, ends = bounds[:-1], bounds[1:]
    lengths = ends - starts
    cut = (lengths > 0) & (starts // seq_len != (ends - 1) // seq_len)
    spans = [(w.first * seq_len, (w.first + w.count) * seq_len) for w in (train, held) if w is not None and w.cache is cache]
    trained = without_start = validated = total = 0
    for lo in range(0, cache.num_tokens, _CHUNK_TOKENS):
        hi = min(lo + _CHUNK_TOKENS, cache.num_tokens)
        targets = np.flatnonzero(cache.read_loss_mask(lo, hi)) + lo
        total += targets.size
        # A token is a target in the window that holds it, unless it is that window's first token.
        predicted = targets % seq_len != 0
        in_train = predicted & (targets >= spans[0][0]) & (targets < spans[0][1])
        trained += int(in_train.sum())
        conversation_start = starts[np.searchsorted(starts, targets, side="right") - 1]
        without_start += int((in_train & (conversation_start < targets - targets % seq_len)).sum())
        for span in spans[1:]:
            validated += int((predicted & (targets >= span[0]) & (targets < span[1])).sum())
    return ReplyCoverage(
        seq_len=seq_len, conversations=int(lengths.size), cut=int(cut.sum()),
        longer_than_seq_len=int((lengths > seq_len).sum()), longest=int(lengths.max(initial=0)),
        reply_tokens=total, trained=trained, without_start=without_start, validated=validated,
    )


def _remedy(coverage: ReplyCoverage) -> str:
    return (
        f"Use seq_len >= {coverage.longest} (the longest conversation, within the model's max_seq_len), or shorten "
        "the long prompts before tokenizing: keep the end of each one, trimming it from the left as DPO does, so the "
        "reply and the turns just before it fit in one window."
    )


def check_reply_coverage(
    train: TokenWindows, held: TokenWindows | None = None, on_cut_conversation: str = "warn"
) -> ReplyCoverage | None:
    """Report (or refuse) what ``train``'s windows cut from the replies of its cache; None for a cache
    without a loss mask (plain text, where every token is trained).

    ``held``: the validation windows, of the same cache (a held-out tail) or of its own; a
    validation cache is checked for reply tokens too.
    """
    if on_cut_conversation not in CUT_CONVERSATION_POLICIES:
        raise ValueError(f"on_cut_conversation must be one of {CUT_CONVERSATION_POLICIES}, got {on_cut_conversation!r}")
    cache = train.cache
    if not cache.has_loss_mask:
        return None
    coverage = measure_reply_coverage(train, held)
    where = f"chat data {cache.url}"
    if coverage.reply_tokens and coverage.trained == 0:
        raise NoRepliesInWindowsError(
            f"{where}: none of its {coverage.reply_tokens} reply tokens lies inside a training window at "
            f"seq_len={coverage.seq_len} ({coverage.conversations} conversations, the longest {coverage.longest} tokens, "
            f"{coverage.cut} cut by a window boundary), so every step would train on nothing, at loss 0. "
            + _remedy(coverage)
        )
    if held is not None and held.cache is not cache:
        held_coverage = measure_reply_coverage(held)
        if held_coverage.reply_tokens and held_coverage.trained == 0:
            raise NoRepliesInWindowsError(
                f"validation chat data {held.cache.url}: none of its {held_coverage.reply_tokens} reply tokens lies "
                f"inside a window at seq_len={held_coverage.seq_len}, so there is nothing to evaluate. "
                + _remedy(held_coverage)
            )
    elif held is not None and coverage.reply_tokens and coverage.validated == 0:
        raise NoRepliesInWindowsError(
            f"{where}: none of its {coverage.reply_tokens} reply tokens lies inside the held-out validation windows "
            f"at seq_len={coverage.seq_len}, so there is nothing to evaluate. Give the source a validation split "
            "of its own, or " + _remedy(coverage)[0].lower() + _remedy(coverage)[1:]
        )
    if coverage.cut:
        summary = (
            f"{where}: {coverage.cut} of {coverage.conversations} conversations are cut by a window boundary "
            f"({coverage.longer_than_seq_len} longer than seq_len={coverage.seq_len}); of {coverage.reply_tokens} reply "
            f"tokens, {coverage.trained} are trained ({coverage.without_start} of them without the start of their "
            f"conversation in the window), {coverage.validated} are in validation windows only and {coverage.lost} are "
            "never trained"
        )
        if on_cut_conversation == "refuse":
            raise CutConversationError(f"{summary}. {_remedy(coverage)}")
        logger.warning("%s. %s", summary, _remedy(coverage))
    return coverage
