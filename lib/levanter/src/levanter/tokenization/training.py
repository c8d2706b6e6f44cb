"""Training a byte-level BPE tokenizer and saving it in the Hugging Face folder layout."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import tokenizers
from rigging import filesystem as fsx
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from levanter.tokenization.loading import SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    special_tokens: Sequence[str] = ("<|endoftext|>",),
    min_frequency: int = 2,
) -> tokenizers.Tokenizer:
    """A byte-level BPE tokenizer (GPT-2 style) trained on ``texts``.

    Byte-level means every string is encodable (no unknown token). The same texts in the same order
    give the same tokenizer, byte for byte. ``special_tokens`` get the first ids, in order.
    """
    min_size = len(pre_tokenizers.ByteLevel.alphabet()) + len(special_tokens)
    if vocab_size < min_size:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: the 256 byte symbols and {len(special_tokens)} special "
            f"tokens alone need {min_size}."
        )
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(
    tok: tokenizers.Tokenizer,
    folder: str | os.PathLike[str],
    *,
    eos_token: str | None = "<|endoftext|>",
    bos_token: str | None = None,
    model_max_length: int | None = None,
) -> str:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into ``folder``
    (a local path or any fsspec URL).

    The folder loads with ``transformers.AutoTokenizer.from_pretrained(folder)`` (as a
    ``PreTrainedTokenizerFast``) and with :func:`levanter.tokenization.load_tokenizer`. Special tokens
    that the vocabulary lacks are left out rather than written as dangling names. Returns the folder.
    """
    folder = os.fspath(folder)
    specials = {}
    for key, token in (("eos_token", eos_token), ("bos_token", bos_token)):
        if token is not None and tok.token_to_id(token) is not None:
            specials[key] = token
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **specials}
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    # Atomic: a crash mid-save must not leave a truncated tokenizer.json that later loads as garbage.
    # (atomic_write also makes a local folder that does not exist yet.)
    fsx.atomic_write(fsx.join(folder, TOKENIZER_FILE), tok.to_str())
    fsx.atomic_write(fsx.join(folder, SPECIAL_TOKENS_MAP_FILE), json.dumps(specials, indent=2, sort_keys=True))
    fsx.atomic_write(fsx.join(folder, TOKENIZER_CONFIG_FILE), json.dumps(config, indent=2, sort_keys=True))
    return folder

