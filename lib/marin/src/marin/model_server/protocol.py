"""Requests of the OpenAI completions and chat APIs, read and checked.

Every bad request becomes an :class:`ApiError` naming the parameter, which the app answers with
OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``) and a 4xx status.
Settings this server does not implement (penalties, logit bias, tools, a suffix) are refused by
name rather than ignored, so a client never gets text it did not ask for. Unknown fields are
ignored, as clients (lm-eval among them) send extras of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from marin.errors import MarinError

MAX_STOPS = 4
MAX_N = 16
MAX_LOGPROBS = 5
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default for completions


class ApiError(MarinError, ValueError):
    """A request refused with an OpenAI-shaped error body."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """What both endpoints share. ``max_tokens`` None: the endpoint's default."""

    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class CompletionRequest:
    prompts: tuple[str | tuple[int, ...], ...]  # text, or token ids
    sampling: Sampling
    echo: bool
    logprobs: int | None  # None: no logprobs; N: the top N alternatives with each token


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict[str, str], ...]
    sampling: Sampling
    logprobs: bool
    top_logprobs: int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
        raise ApiError(f"'{name}' must be a number between {low:g} and {high:g}, got {value!r}", param=name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"{low} or more"
        raise ApiError(f"'{name}' must be an integer {bound}, got {value!r}", param=name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"'{name}' must be true or false, got {value!r}", param=name)
    return value


def _refuse_unsupported(body: dict) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise ApiError(f"'{name}' is not supported by this server; leave it out or set it to 0", param=name)
    if body.get("logit_bias"):
        raise ApiError("'logit_bias' is not supported by this server; leave it out", param="logit_bias")


def _sampling(body: dict, model_name: str, *, max_tokens_name: str = "max_tokens") -> Sampling:
    if not isinstance(body, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if model is not None and model != model_name:
        raise ApiError(f"The model '{model}' does not exist; this server serves '{model_name}'", status=404,
                       param="model", code="model_not_found")
    _refuse_unsupported(body)
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOPS:
        stops = tuple(s for s in stop if s)
    else:
        raise ApiError(f"'stop' must be a string or a list of at most {MAX_STOPS} strings, got {stop!r}", param="stop")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(f"'stream_options' must be an object, got {options!r}", param="stream_options")
    stream = _flag(body, "stream")
    include_usage = bool(options and options.get("include_usage"))
    if include_usage and not stream:
        raise ApiError("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    max_tokens = body.get(max_tokens_name, body.get("max_tokens") if max_tokens_name != "max_tokens" else None)
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 0):
        raise ApiError(f"'{max_tokens_name}' must be an integer 0 or more, got {max_tokens!r}", param=max_tokens_name)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise ApiError(f"'seed' must be an integer, got {seed!r}", param="seed")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0) or 1e-9,  # top_p 0 keeps the likeliest token alone
        top_k=_integer(body, "top_k", 0, 0),
        seed=seed,
        stop=stops,
        n=_integer(body, "n", 1, 1, MAX_N),
        stream=stream,
        include_usage=include_usage,
    )


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    def ids(values: list) -> tuple[int, ...] | None:
        return tuple(values) if values and all(_is_int(v) for v in values) else None

    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if (single := ids(prompt)) is not None:
            return (single,)
        if all(isinstance(p, list) for p in prompt):
            batch = [ids(p) for p in prompt]
            if all(b is not None for b in batch):
                return tuple(batch)  # type: ignore[arg-type]
    raise ApiError("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids "
                   f"(none empty), got {str(prompt)[:80]!r}", param="prompt")


def parse_completion(body: Any, model_name: str) -> CompletionRequest:
    sampling = _sampling(body, model_name)
    if "prompt" not in body:
        raise ApiError("'prompt' is required", param="prompt")
    if body.get("suffix"):
        raise ApiError("'suffix' is not supported by this server (no fill-in-the-middle); leave it out", param="suffix")
    best_of = body.get("best_of")
    if best_of is not None and best_of != sampling.n:
        raise ApiError(f"'best_of' is not supported by this server except equal to n ({sampling.n}); leave it out", param="best_of")
    echo = _flag(body, "echo")
    logprobs = _integer(body, "logprobs", None, 0, MAX_LOGPROBS)
    if sampling.stream and (echo or logprobs is not None):
        raise ApiError("'echo' and 'logprobs' are not supported with 'stream' by this server; ask without stream",
                       param="echo" if echo else "logprobs")
    if sampling.max_tokens == 0 and not echo:
        raise ApiError("'max_tokens' is 0, which only makes sense with 'echo' (to score the prompt)", param="max_tokens")
    return CompletionRequest(_prompts(body["prompt"]), sampling, echo, logprobs)


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: only text ones
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(f"messages[{index}].content: only text parts are supported, got {str(part)[:60]!r}",
                               param=f"messages[{index}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise ApiError(f"messages[{index}].content must be a string or a list of text parts, got {content!r}",
                   param=f"messages[{index}].content")


def parse_chat(body: Any, model_name: str) -> ChatRequest:
    sampling = _sampling(body, model_name, max_tokens_name="max_completion_tokens")
    for name in ("tools", "functions", "tool_choice"):
        if body.get(name):
            raise ApiError(f"'{name}' is not supported by this server; leave it out", param=name)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise ApiError("'response_format' is not supported by this server except {\"type\": \"text\"}", param="response_format")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "developer", "user", "assistant"):
            raise ApiError(f"messages[{i}] must be an object whose role is system, user or assistant, got {str(message)[:80]!r}",
                           param=f"messages[{i}]")
        role = "system" if message["role"] == "developer" else message["role"]
        checked.append({"role": role, "content": _content(message, i)})
    logprobs = _flag(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, 0, MAX_LOGPROBS)
    if top_logprobs and not logprobs:
        raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    if sampling.stream and logprobs:
        raise ApiError("'logprobs' is not supported with 'stream' by this server; ask without stream", param="logprobs")
    return ChatRequest(tuple(checked), sampling, logprobs, top_logprobs)


__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "Sampling", "parse_chat", "parse_completion"]
