"""The tokenizer of a checkpoint folder, with the metadata other tools read beside ``tokenizer.json``.

``tokenizer.json`` alone encodes text, but transformers, lm-eval-harness and serving engines also
need to know which tokens are BOS, EOS and padding, how long an input may be and where generation
stops. Without that, lm-eval's Hugging Face backend cannot even score a request: it looks up its
prefix token (BOS, else EOS), finds neither, and fails decoding ``None``. So beside the tokenizer's
own files this module writes ``tokenizer_config.json`` and ``special_tokens_map.json`` naming the
special tokens, ``generation_config.json`` with their ids, and returns the ids for ``config.json``.
The model's length goes into ``tokenizer_config.json`` (``model_max_length``) and ``config.json``, not
into ``generation_config.json``: a ``max_length`` there makes transformers warn on every ``generate``
given ``max_new_tokens``, which is how generation is usually asked for.

The special tokens are the ones :func:`levanter.tokenization.load_tokenizer` resolves: the names the
source's config gives, else the conventional ones its vocabulary holds (a lone ``<|endoftext|>``
is both EOS and BOS, as in GPT-2). Our lm-eval adapter and the tokenize step resolve them the
same way, so the exported BOS is the prefix token our evaluations condition on. Padding is the
source's pad token, else EOS. Every other field of a source config (its chat template, added
tokens, ``add_bos_token``...) is carried over unchanged.

What the export never changes is how text encodes: ``tokenizer.json`` is copied as it is and no
``add_bos_token`` is introduced, so ``AutoTokenizer.from_pretrained(folder)(text)`` gives the
source's ids. (Our adapter puts the prefix token before every context; lm-eval's backend does so
only when the tokenizer adds BOS itself, or when given ``add_bos_token=True``.)
"""

from __future__ import annotations

import logging
from typing import Any

from rigging import filesystem as fsx

from levanter.compat.hf_format import TOKENIZER_JSON, read_json_object, write_json, write_tokenizer
from levanter.tokenization import HfTokenizer, load_tokenizer

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"

# The roles written to the configs, in the order transformers lists them.
ROLES = ("bos", "eos", "unk", "pad")

logger = logging.getLogger("levanter.compat.hf_checkpoints")


def write_tokenizer_files(tokenizer: Any, out_dir: str, *, max_length: int) -> dict[str, int]:
    """Put ``tokenizer`` (a folder, a ``tokenizer.json`` file or a ``tokenizers.Tokenizer``) and its
    metadata into ``out_dir``, for a model that reads at most ``max_length`` tokens.

    Returns the ``config.json`` fields naming the special ids the tokenizer has (``bos_token_id``,
    ``eos_token_id``, ``pad_token_id``). A folder holding only a slow tokenizer (``vocab.json`` and
    ``merges.txt``, or ``tokenizer.model``) is copied as it is, with nothing derived.
    """
    copied = write_tokenizer(tokenizer, out_dir)
    if TOKENIZER_JSON not in copied:
        logger.info("The tokenizer copied to %s has no %s; it gets no derived metadata.", out_dir, TOKENIZER_JSON)
        return {}
    for name in (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE):
        if name not in copied and fsx.exists(fsx.join(out_dir, name)):
            fsx.rm(fsx.join(out_dir, name))  # an earlier export's, which must not pass for the source's
    config = _read_if_present(fsx.join(out_dir, TOKENIZER_CONFIG_FILE))
    special_map = _read_if_present(fsx.join(out_dir, SPECIAL_TOKENS_MAP_FILE))
    tokens = special_tokens(load_tokenizer(out_dir), {**special_map, **config})  # reads the configs just copied
    if "bos" not in tokens and "eos" not in tokens:
        logger.warning("The tokenizer in %s has neither a BOS nor an EOS token: lm-eval cannot score empty "
                       "contexts with it, and generation has no token to stop at.", out_dir)

    write_json(fsx.join(out_dir, TOKENIZER_CONFIG_FILE), tokenizer_config(config, tokens, max_length))
    write_json(fsx.join(out_dir, SPECIAL_TOKENS_MAP_FILE), _with_tokens(special_map, tokens))
    ids = {f"{role}_token_id": token_id for role, (_, token_id) in tokens.items() if role != "unk"}
    write_json(fsx.join(out_dir, GENERATION_CONFIG_FILE), ids)
    return ids


def special_tokens(tokenizer: HfTokenizer, config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Role (``bos``, ``eos``, ``unk``, ``pad``) -> (token, id), for the roles the tokenizer can fill.

    BOS and EOS as :func:`~levanter.tokenization.load_tokenizer` resolves them; ``unk`` only when
    ``config`` names one the vocabulary has; ``pad`` the configured one, else EOS.
    """
    vocab = tokenizer.tokenizer
    named = {role: _token_name(config.get(f"{role}_token")) for role in ROLES}
    has_pad = named["pad"] is not None and vocab.token_to_id(named["pad"]) is not None
    chosen = {
        "bos": tokenizer.bos_token,
        "eos": tokenizer.eos_token,
        "unk": named["unk"],
        "pad": named["pad"] if has_pad else tokenizer.eos_token,
    }
    found = {role: (token, vocab.token_to_id(token)) for role, token in chosen.items() if token is not None}
    return {role: (token, token_id) for role, (token, token_id) in found.items() if token_id is not None}


def tokenizer_config(source: dict[str, Any], tokens: dict[str, tuple[str, int]], max_length: int) -> dict[str, Any]:
    """``source``'s ``tokenizer_config.json`` (empty when there was none), completed.

    It gains the special tokens it does not name, ``model_max_length`` no longer than the model's,
    the fast tokenizer class, and decoding without transformers' space clean-up (``" ."`` stays as
    it is, as our own decoding leaves it).
    """
    config = _with_tokens(source, tokens)
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    config.setdefault("clean_up_tokenization_spaces", False)
    given = source.get("model_max_length")
    # transformers writes a huge sentinel (about 1e30) for "no limit"; the model's length is the real one.
    fits = isinstance(given, int) and not isinstance(given, bool) and 0 < given <= max_length
    config["model_max_length"] = given if fits else max_length
    return config


def _with_tokens(source: dict[str, Any], tokens: dict[str, tuple[str, int]]) -> dict[str, Any]:
    """``source`` with ``<role>_token`` set for every role in ``tokens``; a value naming the same
    token (as a plain string or transformers' serialised ``AddedToken``) is kept as written."""
    result = dict(source)
    for role in ROLES:
        if role in tokens and _token_name(source.get(f"{role}_token")) != tokens[role][0]:
            result[f"{role}_token"] = tokens[role][0]
    return result


def _token_name(value: Any) -> str | None:
    if isinstance(value, dict):  # a serialised AddedToken
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_if_present(url: str) -> dict[str, Any]:
    return read_json_object(url) if fsx.exists(url) else {}
