"""Hugging Face tokenizers for the data pipeline: loading with a content identity, bounded-memory
batch encoding with configured BOS/EOS, and training/saving a byte-level BPE tokenizer."""

from levanter.tokenization.encoding import (
    DEFAULT_MAX_PIECE_CHARS,
    MissingSpecialTokenError,
    SpecialTokenPolicy,
    encode_documents,
    split_text,
)
from levanter.tokenization.loading import (
    HfTokenizer,
    TokenizerFormatError,
    TokenizerNotFoundError,
    load_tokenizer,
    tokenizer_identity,
)
from levanter.tokenization.training import save_tokenizer, train_bpe_tokenizer

__all__ = [
    "DEFAULT_MAX_PIECE_CHARS",
    "HfTokenizer",
    "MissingSpecialTokenError",
    "SpecialTokenPolicy",
    "TokenizerFormatError",
    "TokenizerNotFoundError",
    "encode_documents",
    "load_tokenizer",
    "save_tokenizer",
    "split_text",
    "tokenizer_identity",
    "train_bpe_tokenizer",
]
