"""What one request may carry, checked before any of it is tokenized, so no client can take the server down.

* The body is read up to :data:`MAX_BODY_BYTES` (``413`` past it, said by its ``Content-Length``
  before anything is read when it gives one): a body is held whole in memory to be parsed.
* Text must be Unicode: JSON can spell a lone surrogate (``"\\ud800"``), which no UTF-8 encoder, the
  tokenizer's included, can take (``400``, naming where it is).
* A text prompt must be able to fit the model's context: a token stands for at most
  ``max_token_bytes`` bytes of UTF-8 (the longest entry of the vocabulary), so a prompt of more bytes
  than ``max_seq_len * max_token_bytes`` cannot fit whatever it tokenizes to, and is refused
  without tokenizing it (tokenizing 50 MB of text takes gigabytes). A tokenizer whose normalizer
  deletes most of a text could in principle fit such a prompt; none of ours does.
* Token ids must be ids of the model's vocabulary (``-1`` or ``2**64`` cannot even be decoded).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from marin.model_server.protocol import ApiError

MAX_BODY_BYTES = 8 << 20  # a batch of 32 prompts of 8,192 token ids each is about 1.5 MiB of JSON


async def read_json_body(request: Any, limit: int = MAX_BODY_BYTES) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (an :class:`ApiError` 413 past it, 400 when not JSON)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _too_large(total, limit)
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks) or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"The request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise ApiError("The request body is not valid JSON: it nests too deep") from None
    check_unicode(body)
    return body


def _too_large(size: int, limit: int) -> ApiError:
    return ApiError(f"The request body has {size} bytes or more; this server takes at most {limit} in one request",
                    status=413, code="request_too_large")


def check_unicode(body: Any) -> None:
    """Refuse a body holding a string that is not Unicode text (a lone surrogate), naming where."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                name = where or "the request body"
                raise ApiError(f"{name} holds a lone surrogate (U+{ord(value[exc.start]):04X}) at character {exc.start}, "
                               "which is not Unicode text; send the text as UTF-8", param=where.split("[", 1)[0] or None) from None
        elif isinstance(value, dict):
            stack.extend((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{index}]", item) for index, item in enumerate(value))


@dataclass(frozen=True)
class TokenBounds:
    """What the model can take: ids below ``vocab_size``, and ``max_seq_len`` tokens of at most
    ``max_token_bytes`` UTF-8 bytes each."""

    vocab_size: int
    max_seq_len: int
    max_token_bytes: int

    @classmethod
    def of(cls, raw_tokenizer: Any, vocab_size: int, max_seq_len: int) -> TokenBounds:
        longest = max((len(raw_tokenizer.decode([token], skip_special_tokens=False).encode("utf-8", "surrogatepass"))
                       for token in range(raw_tokenizer.get_vocab_size())), default=1)
        return cls(vocab_size, max_seq_len, max(1, longest))

    def check_ids(self, ids: Any, param: str) -> None:
        bad = next((token for token in ids if not 0 <= token < self.vocab_size), None)
        if bad is not None:
            raise ApiError(f"'{param}' holds token id {bad}, outside the model's vocabulary (0 to {self.vocab_size - 1})",
                           param=param)

    def check_fits(self, text: str, param: str) -> None:
        """Refuse, without tokenizing it, a text that cannot fit the context (see the module docstring)."""
        # Characters first: a code point is at most 4 bytes, so most texts are passed without encoding them.
        if len(text) * 4 <= self.max_seq_len * self.max_token_bytes:
            return
        size = len(text.encode("utf-8"))
        if size > self.max_seq_len * self.max_token_bytes:
            raise ApiError(f"'{param}' is {size} bytes of text, at least {-(-size // self.max_token_bytes)} tokens (no token "
                           f"of this tokenizer stands for more than {self.max_token_bytes} bytes), and this model's "
                           f"context is {self.max_seq_len} tokens; shorten it", param=param, code="context_length_exceeded")
