"""Chat data whose replies the training windows cut or miss is reported before training: how many
conversations a window boundary cuts and what becomes of their reply tokens (counted here by walking
every window, independently of the loader), and a cache whose training windows hold no reply token at
all (every step would train on nothing, at loss 0) is refused with the remedy."""

import logging

import numpy as np
import pytest

from levanter.data import CacheSource, TokenWindows, build_text_data
from levanter.data.reply_coverage import CutConversationError, NoRepliesInWindowsError
from levanter.data.windows import split_heldout
from zephyr.token_cache import TokenCache, finalize_token_cache, write_token_cache_shard

LOGGER = "levanter.data.reply_coverage"


def _conversation(prompt: int, reply: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.random.default_rng(seed).integers(1, 200, size=prompt + reply).astype(np.uint16)
    return tokens, np.r_[np.zeros(prompt), np.ones(reply)].astype(np.uint8)


def _cache(url: str, conversations) -> str:
    write_token_cache_shard(f"{url}/shard-00000", conversations, np.uint16, loss_mask=True)
    finalize_token_cache(url, ["shard-00000"], vocab_size=256, metadata={"tokenizer": "t"})
    return url


def test_a_long_prompt_whose_reply_no_training_window_holds_is_refused_before_training(tmp_path):
    # A 100-token user turn and a 5-token reply: at seq_len=32 the reply falls past the last full
    # window, so every training window is prompt only.
    url = _cache(str(tmp_path / "chat"), [_conversation(100, 5, seed=0)])
    with pytest.raises(NoRepliesInWindowsError) as caught:
        build_text_data([CacheSource("chat", train=url)], seq_len=32, batch_size=2)
    message = str(caught.value)
    assert "none of its 5 reply tokens" in message and "seq_len=32" in message
    assert "105 tokens" in message and "seq_len >= 105" in message and "from the left" in message


def _walk(cache: TokenCache, seq_len: int, train: TokenWindows, held: TokenWindows):
    """Counts by brute force: every window's own mask, every document's own span."""
    bounds = cache.document_boundaries()
    starts = bounds[:-1]
    cut = sum(1 for s, e in zip(bounds[:-1], bounds[1:]) if e > s and s // seq_len != (e - 1) // seq_len)
    trained = without_start = validated = 0
    for windows, kind in ((train, "train"), (held, "held")):
        for index in range(len(windows)):
            start = (windows.first + index) * seq_len
            mask = windows.loss_mask(index)
            for t in np.flatnonzero(mask):
                target = start + t + 1
                if kind == "held":
                    validated += 1
                    continue
                trained += 1
                doc_start = starts[np.searchsorted(starts, target, side="right") - 1]
                without_start += doc_start < start
    total = int(cache.read_loss_mask(0, cache.num_tokens).sum())
    return cut, total, trained, without_start, validated, total - trained - validated


def test_conversations_cut_by_windows_are_counted_with_their_reply_tokens(tmp_path, caplog):
    rng = np.random.default_rng(3)
    conversations = [_conversation(int(rng.integers(2, 30)), int(rng.integers(1, 12)), seed=i) for i in range(40)]
    url = _cache(str(tmp_path / "chat"), conversations)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        build_text_data([CacheSource("chat", train=url)], seq_len=16, batch_size=2, heldout_fraction=0.1)
    cache = TokenCache.open(url)
    train, held = split_heldout(TokenWindows.over(cache, 16), 0.1)
    cut, total, trained, without_start, validated, lost = _walk(cache, 16, train, held)
    assert min(cut, without_start, validated, lost) > 0  # every count is exercised
    longer = sum(1 for ids, _ in conversations if ids.size > 16)
    expected = (
        f"{cut} of 40 conversations are cut by a window boundary ({longer} longer than seq_len=16); of {total} reply "
        f"tokens, {trained} are trained ({without_start} of them without the start of their conversation in the "
        f"window), {validated} are in validation windows only and {lost} are never trained"
    )
    assert expected in caplog.text


def test_refusing_cut_conversations_on_request(tmp_path):
    url = _cache(str(tmp_path / "chat"), [_conversation(10, 10, seed=i) for i in range(10)])
    with pytest.raises(CutConversationError, match=r"cut by a window boundary.*seq_len=16"):
        build_text_data([CacheSource("chat", train=url)], seq_len=16, batch_size=2, on_cut_conversation="refuse")
    # Conversations that each fill one window exactly are never cut, and nothing is said.
    exact = _cache(str(tmp_path / "exact"), [_conversation(8, 8, seed=i) for i in range(10)])
    build_text_data([CacheSource("chat", train=exact)], seq_len=16, batch_size=2, on_cut_conversation="refuse")
