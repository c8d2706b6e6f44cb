"""The tokenize step's encoder: batches encoded in a background thread come out whole and in order."""

from __future__ import annotations

import numpy as np
import pytest

from levanter.tokenization import SpecialTokenPolicy, encode_documents, load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin.processing.tokenize import EncodeShard
from zephyr.worker_context import WorkerContext, active_worker_context


@pytest.fixture(scope="module")
def tokenizer(synthetic_stories, tmp_path_factory):
    return load_tokenizer(save_tokenizer(train_bpe_tokenizer(synthetic_stories[:100], 400), tmp_path_factory.mktemp("tok")))


def test_documents_of_many_overlapped_batches_come_out_in_order_as_cache_ids(tokenizer, synthetic_stories):
    special = SpecialTokenPolicy.for_tokenizer(tokenizer, prepend_bos=False, append_eos=True)
    texts = list(synthetic_stories[:60])
    # About 860 characters a story: batches of 2,000 characters make some 25 batches, each encoded
    # while the one before is consumed.
    context = WorkerContext(shard_index=0, num_shards=1)
    with active_worker_context(context):
        documents = list(EncodeShard(tokenizer, special, batch_chars=2_000)(iter(texts)))
    expected = encode_documents(tokenizer, texts, special)
    assert len(documents) == len(texts)
    assert all(got.tolist() == want.tolist() for got, want in zip(documents, expected))
    # Already the dtype a cache of this vocabulary stores, so the writer keeps the arrays as they are.
    assert {got.dtype for got in documents} == {np.dtype(np.uint16)}
    # Counted in the shard's own context, not lost in the encoding thread.
    assert context.counters == {"documents": 60, "tokens": sum(int(d.size) for d in expected)}


def test_an_encoding_error_reaches_the_shard(tokenizer):
    special = SpecialTokenPolicy.for_tokenizer(tokenizer, prepend_bos=False, append_eos=True)
    # Bytes have a length (so they are batched) but the tokenizer refuses them, in the encoding thread.
    with pytest.raises(TypeError):
        list(EncodeShard(tokenizer, special, batch_chars=10)(iter(["a story", b"not text"])))  # type: ignore[list-item]
