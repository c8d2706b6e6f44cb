"""``marin_tokenizer``: the Marin tokenizer from the Hugging Face hub, or, offline, a stand-in the
project trains itself.

With the hub reachable (or the tokenizer in the local Hugging Face cache) this is
``marin-community/marin-tokenizer``. Offline on a fresh machine it is a byte-level BPE tokenizer
trained by a cached step on the built-in TinyStories-style corpus, asked for 4,096 tokens; that
corpus runs out of merges first, at 4,063 (:data:`OFFLINE_TRAINED_VOCAB_SIZE`, the size every log
line and summary then reports). The log says so with a WARNING, and its identity (and so every hash
built on it) differs from the hub tokenizer's.
"""

from functools import partial

from marin.datasets import TokenizerRef, builtin_tokenizer

MARIN_TOKENIZER_HUB_ID = "marin-community/marin-tokenizer"
OFFLINE_VOCAB_SIZE = 4096  # asked of the BPE trainer (part of the tokenizer step's hash)
OFFLINE_TRAINED_VOCAB_SIZE = 4063  # what training on the built-in corpus gives (deterministic)

marin_tokenizer = TokenizerRef(
    hub_id=MARIN_TOKENIZER_HUB_ID,
    offline_default=partial(builtin_tokenizer, vocab_size=OFFLINE_VOCAB_SIZE),
    description=f"byte-level BPE, {OFFLINE_TRAINED_VOCAB_SIZE:,} tokens (of {OFFLINE_VOCAB_SIZE:,} asked), "
                "trained on the built-in TinyStories-style corpus",
)
