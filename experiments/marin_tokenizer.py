"""``marin_tokenizer``: the Marin tokenizer from the Hugging Face hub, or, offline, a stand-in the
project trains itself.

With the hub reachable (or the tokenizer in the local Hugging Face cache) this is
``marin-community/marin-tokenizer``. Offline on a fresh machine it is a byte-level BPE tokenizer
with a 4,096-token vocabulary, trained by a cached step on the built-in TinyStories-style corpus;
the log says so with a WARNING, and its identity (and so every hash built on it) differs from the
hub tokenizer's.
"""

from functools import partial

from marin.datasets import TokenizerRef, builtin_tokenizer

MARIN_TOKENIZER_HUB_ID = "marin-community/marin-tokenizer"
OFFLINE_VOCAB_SIZE = 4096

marin_tokenizer = TokenizerRef(
    hub_id=MARIN_TOKENIZER_HUB_ID,
    offline_default=partial(builtin_tokenizer, vocab_size=OFFLINE_VOCAB_SIZE),
    description=f"byte-level BPE, {OFFLINE_VOCAB_SIZE} tokens, trained on the built-in TinyStories-style corpus",
)
