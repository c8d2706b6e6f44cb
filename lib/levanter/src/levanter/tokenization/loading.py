"""Loading a Hugging Face tokenizer from a file, a folder, a URL or a hub id, with a content identity.

A tokenizer's identity is a digest of its ``tokenizer.json`` content (canonical JSON), never its name:
two copies of GPT-2's tokenizer in different folders hash the same, and a retrained tokenizer saved
under the same name hashes differently. Step hashes use this identity, so a cache tokenized with one
vocabulary can never be mistaken for another.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import fsspec
import tokenizers

from levanter.errors import LevanterError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# Newer tokenizer folders keep the chat template in a file of its own instead of tokenizer_config.json.
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# When a tokenizer ships without a config naming its special tokens, these are the conventional
# spellings, tried in order. Only tokens the vocabulary actually contains are used.
_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
_BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "<|endoftext|>")


class TokenizerNotFoundError(LevanterError, FileNotFoundError):
    """The tokenizer named by the user is neither a readable local/remote path nor a cached hub id."""


class TokenizerFormatError(LevanterError, ValueError):
    """The tokenizer file exists but is not a Hugging Face ``tokenizer.json``."""


@dataclass(frozen=True, eq=False)
class HfTokenizer:
    """A loaded Hugging Face tokenizer with everything the data pipeline needs to know about it.

    ``identity`` is ``sha256:<hex>`` of the canonical ``tokenizer.json``; ``source`` is what the user
    passed (for logs only: it never enters a hash). The object pickles compactly (the JSON text, not
    the Rust object), so it can be shipped to worker processes.

    ``chat_template`` is the Jinja chat template the tokenizer ships with (``chat_template.jinja``,
    else ``chat_template`` in ``tokenizer_config.json``), or None. It is not part of ``identity``:
    steps that render conversations hash it themselves (see ``levanter.tokenization.chat``).
    """

    source: str
    tokenizer_json: str = field(repr=False)
    identity: str
    eos_token: str | None = None
    bos_token: str | None = None
    chat_template: str | None = field(default=None, repr=False)

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        cached = self.__dict__.get("_tokenizer")
        if cached is None:
            cached = tokenizers.Tokenizer.from_str(self.tokenizer_json)
            object.__setattr__(self, "_tokenizer", cached)
        return cached

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int | None:
        return None if self.eos_token is None else self.tokenizer.token_to_id(self.eos_token)

    @property
    def bos_id(self) -> int | None:
        return None if self.bos_token is None else self.tokenizer.token_to_id(self.bos_token)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_tokenizer", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"HfTokenizer(source={self.source!r}, identity={self.identity[:19]}..., vocab_size={self.vocab_size})"


def tokenizer_identity(tokenizer_json: str) -> str:
    """``sha256:<hex>`` of the canonical form (sorted keys, no whitespace) of a ``tokenizer.json``."""
    try:
        parsed = json.loads(tokenizer_json)
    except json.JSONDecodeError as exc:
        raise TokenizerFormatError(f"tokenizer.json is not valid JSON: {exc}") from exc
    return _identity_of(parsed)


def _identity_of(parsed: Any) -> str:
    canonical = json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _not_a_tokenizer(spec: str, why: str) -> TokenizerFormatError:
    return TokenizerFormatError(
        f"{spec!r} is not a tokenizer: {why}. Expected a tokenizer.json saved by the Hugging Face tokenizers "
        "library (Tokenizer.save, or save_pretrained of a fast tokenizer), a folder holding one, or a hub id "
        "such as 'gpt2'."
    )


def _read_tokenizer_json(tokenizer_json: str, spec: str) -> dict[str, Any]:
    """The parsed ``tokenizer.json``, or a :class:`TokenizerFormatError` saying what the file is instead."""
    try:
        parsed = json.loads(tokenizer_json)
    except json.JSONDecodeError as exc:
        raise _not_a_tokenizer(spec, _what_instead_of_json(tokenizer_json, exc)) from exc
    if not isinstance(parsed, dict):
        raise _not_a_tokenizer(spec, f"it is JSON, but not a JSON object (it holds a {type(parsed).__name__})")
    if "model" not in parsed:
        keys = sorted(parsed)
        shown = ", ".join(keys[:6]) + (", ..." if len(keys) > 6 else "")
        raise _not_a_tokenizer(spec, f"it is a JSON object with no 'model' section (its keys: {shown or 'none'})")
    return parsed


def _what_instead_of_json(text: str, error: json.JSONDecodeError) -> str:
    # The likeliest mix-up is a dataset file (one JSON document per line) passed in the tokenizer's place.
    if error.msg == "Extra data":
        lines = [line for line in text.splitlines()[:20] if line.strip()]
        try:
            for line in lines:
                json.loads(line)
        except json.JSONDecodeError:
            pass
        else:
            return "it is JSON Lines (one JSON document per line, like a dataset), not one JSON object"
    return f"it is not JSON ({error})"


def load_tokenizer(name_or_path: str | os.PathLike[str], *, revision: str | None = None) -> HfTokenizer:
    """Load a tokenizer from a ``tokenizer.json`` file, a folder holding one, an fsspec URL, or a hub id.

    Hub ids use the local Hugging Face cache when offline (``HF_HUB_OFFLINE=1``) or when the hub is
    unreachable; if the id is not cached either, a :class:`TokenizerNotFoundError` says so.
    """
    spec = os.fspath(name_or_path)
    if _looks_like_path(spec):
        files = _read_tokenizer_files_from_path(spec)
    else:
        files = _read_tokenizer_files_from_hub(spec, revision)
    tokenizer_json, config = files
    identity, tok = _parse(tokenizer_json, spec)
    eos = _special_token(config, "eos_token", tok, _EOS_CANDIDATES)
    bos = _special_token(config, "bos_token", tok, _BOS_CANDIDATES)
    loaded = HfTokenizer(
        source=spec,
        tokenizer_json=tokenizer_json,
        identity=identity,
        eos_token=eos,
        bos_token=bos,
        chat_template=_chat_template(config),
    )
    object.__setattr__(loaded, "_tokenizer", tok)
    return loaded


# Parsed tokenizers by the digest of their exact bytes. A script declares a tokenize step (loading the
# tokenizer for its identity) and then runs it in the same process; canonicalising a 2 MB vocabulary
# and building the Rust object twice would double the fixed cost of every small tokenize run.
_PARSED: dict[str, tuple[str, tokenizers.Tokenizer]] = {}
_PARSED_LOCK = threading.Lock()
_PARSED_MAX = 8


def _parse(tokenizer_json: str, spec: str) -> tuple[str, tokenizers.Tokenizer]:
    raw_digest = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
    with _PARSED_LOCK:
        hit = _PARSED.get(raw_digest)
    if hit is not None:
        return hit
    identity = _identity_of(_read_tokenizer_json(tokenizer_json, spec))
    try:
        tok = tokenizers.Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # the Rust side raises a bare Exception for unknown formats
        raise _not_a_tokenizer(spec, f"the tokenizers library cannot read it ({exc})") from exc
    with _PARSED_LOCK:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[raw_digest] = (identity, tok)
    return identity, tok


def _looks_like_path(spec: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else that could be a path is treated as one so that
    # a typo in a path gets a "does not exist" error instead of a confusing hub lookup.
    if "://" in spec or os.path.exists(spec):
        return True
    return spec.startswith(("/", ".", "~")) or spec.endswith(".json") or spec.count("/") > 1


def _read_tokenizer_files_from_path(spec: str) -> tuple[str, dict[str, Any]]:
    fs, path = fsspec.core.url_to_fs(os.path.expanduser(spec))
    if not fs.exists(path):
        raise TokenizerNotFoundError(
            f"Tokenizer path {spec!r} does not exist. Pass a tokenizer.json file, a folder containing one, "
            "or a Hugging Face hub id such as 'gpt2'."
        )
    if fs.isdir(path):
        folder = path
        json_path = f"{path.rstrip('/')}/{TOKENIZER_FILE}"
        if not fs.exists(json_path):
            raise TokenizerNotFoundError(
                f"Tokenizer folder {spec!r} has no {TOKENIZER_FILE}; only fast (tokenizers-library) "
                "tokenizers are supported."
            )
    else:
        folder = path.rsplit("/", 1)[0] if "/" in path else "."
        json_path = path
    with fs.open(json_path, "rb") as f:
        raw = f.read()
    try:
        tokenizer_json = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerFormatError(f"Tokenizer file {spec!r} is not UTF-8 text (a binary file?).") from exc
    config: dict[str, Any] = {}
    for name in (SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE):  # later files win
        candidate = f"{folder.rstrip('/')}/{name}"
        if fs.exists(candidate):
            with fs.open(candidate, "rb") as f:
                try:
                    config.update(json.loads(f.read().decode("utf-8")))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    pass  # an unreadable side file only loses the special-token hints
    template_path = f"{folder.rstrip('/')}/{CHAT_TEMPLATE_FILE}"
    if fs.exists(template_path):
        with fs.open(template_path, "rb") as f:
            config["chat_template"] = f.read().decode("utf-8")
    return tokenizer_json, config


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _read_tokenizer_files_from_hub(repo_id: str, revision: str | None) -> tuple[str, dict[str, Any]]:
    from huggingface_hub import hf_hub_download

    def download(filename: str, local_only: bool) -> str:
        return hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, local_files_only=local_only)

    try:
        try:
            json_path = download(TOKENIZER_FILE, local_only=_hub_offline())
            local_only = _hub_offline()
        except Exception:
            if _hub_offline():
                raise
            # The hub is unreachable (or refused us): a cached copy is still the same content.
            json_path = download(TOKENIZER_FILE, local_only=True)
            local_only = True
    except Exception as exc:
        raise TokenizerNotFoundError(
            f"Tokenizer {repo_id!r} is not a local path, and the Hugging Face hub id is not in the local cache "
            f"while the hub is {'disabled (HF_HUB_OFFLINE=1)' if _hub_offline() else 'unreachable or refused it'} "
            f"({type(exc).__name__}). Pass a path to a tokenizer.json or a folder, or download it while online."
        ) from exc
    with open(json_path, encoding="utf-8") as f:
        tokenizer_json = f.read()
    config: dict[str, Any] = {}
    for name in (SPECIAL_TOKENS_MAP_FILE, TOKENIZER_CONFIG_FILE):
        try:
            with open(download(name, local_only=local_only), encoding="utf-8") as f:
                config.update(json.load(f))
        except Exception:
            pass  # optional files: without them special tokens fall back to conventional names
    try:
        with open(download(CHAT_TEMPLATE_FILE, local_only=local_only), encoding="utf-8") as f:
            config["chat_template"] = f.read()
    except Exception:
        pass  # most tokenizers keep their template in tokenizer_config.json, or have none
    return tokenizer_json, config


def _chat_template(config: dict[str, Any]) -> str | None:
    """The tokenizer's chat template: a string, or from a list of named templates the one named "default"."""
    value = config.get("chat_template")
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value.strip() else None


def _special_token(config: dict[str, Any], key: str, tok: tokenizers.Tokenizer, candidates: tuple[str, ...]) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str) and tok.token_to_id(value) is not None:
        return value
    for candidate in candidates:
        if tok.token_to_id(candidate) is not None:
            return candidate
    return None
