"""Hugging Face tokenizers for the data pipeline: loading with a content identity, bounded-memory
batch encoding with configured BOS/EOS, conversations through chat templates with an
assistant-only loss mask, and training/saving a byte-level BPE tokenizer."""

from levanter.tokenization.chat import (
    ChatRenderer,
    ChatTemplate,
    ChatTemplateError,
    ConversationFormatError,
    SegmentationMismatchError,
    encode_conversations,
    resolve_chat_template,
)
from levanter.tokenization.encoding import (
    DEFAULT_MAX_PIECE_CHARS,
    MissingSpecialTokenError,
    SpecialTokenPolicy,
    TokenIdOverflowError,
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
    "ChatRenderer",
    "ChatTemplate",
    "ChatTemplateError",
    "ConversationFormatError",
    "DEFAULT_MAX_PIECE_CHARS",
    "HfTokenizer",
    "MissingSpecialTokenError",
    "SegmentationMismatchError",
    "SpecialTokenPolicy",
    "TokenIdOverflowError",
    "TokenizerFormatError",
    "TokenizerNotFoundError",
    "encode_conversations",
    "encode_documents",
    "load_tokenizer",
    "resolve_chat_template",
    "save_tokenizer",
    "split_text",
    "tokenizer_identity",
    "train_bpe_tokenizer",
]
