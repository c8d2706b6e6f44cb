"""The OpenAI-compatible routes over a :class:`~levanter.inference.engine.GenerationEngine`.

``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions`` (streamed as server-sent events
with ``stream: true``), ``/metrics`` in Prometheus' text format, the tokenizer routes lm-eval's
``local-completions`` uses to tokenize on the server (``/tokenizer_info``, ``/tokenize``,
``/detokenize``) and a small chat page at ``/``.

Every prompt is read as the start of a document: the token training put before each document
(the tokenizer's BOS, else its EOS) goes before it unless it is there already, as ``marin
generate`` and the in-process lm-eval adapter do, so the model sees what it was trained on. It is
never echoed back: with ``echo`` the prompt's first token is scored given it. A chat prompt is the
rendered conversation, which carries whatever its template puts first.

Bad requests get OpenAI's error shape and a 4xx; a failure inside the server gets a 500 with a
one-line message, its traceback going only to the log. What a request may carry (its size, its
text, its token ids, its prompt's length) is checked before any of it is tokenized
(:mod:`marin.model_server.limits`): no request can take the server down for the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from levanter.inference.engine import (
    Finished,
    FinishReason,
    GenerationEngine,
    GenerationParams,
    PromptScored,
    RequestRefusedError,
    TokenGenerated,
    TokenLogprobs,
)
from marin.model_server.chat_page import chat_page
from marin.model_server.limits import MAX_BODY_BYTES, TokenBounds, read_json_body
from marin.model_server.metrics import prometheus_text
from marin.model_server.protocol import DEFAULT_COMPLETION_TOKENS, ApiError, Sampling, parse_chat, parse_completion
from marin.model_server.text import TextAssembler

logger = logging.getLogger(__name__)


@dataclass
class _Choice:
    """One sequence being generated: its engine events arrive on ``events``."""

    index: int
    prompt_ids: list[int]  # what the model is conditioned on
    shown_from: int  # prompt_ids[shown_from:] are the caller's own tokens
    assembler: TextAssembler
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_scores: tuple[TokenLogprobs | None, ...] | None = None
    finish_reason: str | None = None
    request: Any = None


class ModelServer:
    """The state the routes share: the engine, the tokenizer and how prompts are read."""

    def __init__(self, engine: GenerationEngine, tokenizer: Any, model_name: str, chat_template: Any = None, *,
                 max_body_bytes: int = MAX_BODY_BYTES):
        from levanter.tokenization.chat import ChatRenderer, reply_end_marker

        self.engine = engine
        self.tokenizer = tokenizer
        self.raw = tokenizer.tokenizer
        self.max_body_bytes = max_body_bytes
        self.bounds = TokenBounds.of(self.raw, engine.model.vocab_size, engine.max_seq_len)
        self.model_name = model_name
        self.created = int(time.time())
        start = tokenizer.bos_id if tokenizer.bos_id is not None else tokenizer.eos_id
        self.document_start = start
        self.renderer = ChatRenderer.for_tokenizer(tokenizer, chat_template) if chat_template is not None else None
        self.reply_end = reply_end_marker(self.renderer) if self.renderer is not None else ""
        self.chat_template_text = chat_template.source if chat_template is not None else None
        end_ids = self.raw.encode(self.reply_end, add_special_tokens=False).ids if self.reply_end else []
        self.eos_ids = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
        # A reply also ends at the template's end of turn; where that is one token, sampling stops on it.
        self.chat_stop_ids = (*self.eos_ids, *(end_ids if len(end_ids) == 1 else ()))

    # -- tokens ---------------------------------------------------------------------------------

    def encode(self, text: str, param: str = "prompt") -> list[int]:
        self.bounds.check_fits(text, param)
        return self.raw.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.raw.decode(ids, skip_special_tokens=True)

    def token_text(self, token: int) -> str:
        """A token's own text; a piece of a character (bytes that decode to nothing whole) is
        named by its vocabulary entry, so alternatives keyed by text stay distinct."""
        text = self.raw.decode([token], skip_special_tokens=False)
        return self.raw.id_to_token(token) if "\ufffd" in text else text

    def as_document(self, ids: list[int]) -> tuple[list[int], int]:
        """The ids the model is conditioned on, and where the caller's own ids start in them."""
        if self.document_start is None or (ids and ids[0] == self.document_start):
            return ids, 0
        return [self.document_start, *ids], 1

    # -- generation -----------------------------------------------------------------------------

    def params(self, sampling: Sampling, prompt_len: int, index: int, *, default_max: int | None, stops_ids: tuple[int, ...],
               top_logprobs: int = 0, prompt_logprobs: bool = False, seed: int) -> GenerationParams:
        room = self.engine.max_seq_len - prompt_len
        if sampling.max_tokens is not None:
            max_tokens = sampling.max_tokens
        else:
            max_tokens = room if default_max is None else min(default_max, room)
            if max_tokens < 1:
                max_tokens = 1  # refused below with the numbers
        params = GenerationParams(max_tokens=max_tokens, temperature=sampling.temperature, top_k=sampling.top_k,
                                  top_p=sampling.top_p, seed=seed + index, stop_ids=stops_ids,
                                  top_logprobs=top_logprobs, prompt_logprobs=prompt_logprobs)
        try:
            self.engine.check(prompt_len, params)
        except RequestRefusedError as exc:
            code = "context_length_exceeded" if "context" in str(exc) else None
            raise ApiError(str(exc)[0].upper() + str(exc)[1:] + ".", param="max_tokens" if sampling.max_tokens else "prompt",
                           code=code) from exc
        return params

    def start(self, choices: list[_Choice], params: list[GenerationParams]) -> None:
        loop = asyncio.get_running_loop()
        for choice, choice_params in zip(choices, params):
            def listen(event, queue=choice.events):
                loop.call_soon_threadsafe(queue.put_nowait, event)

            try:
                choice.request = self.engine.submit(choice.prompt_ids, choice_params, listen)
            except RequestRefusedError as exc:
                self.cancel(choices)
                raise ApiError(str(exc), param="prompt") from exc

    def cancel(self, choices: list[_Choice]) -> None:
        for choice in choices:
            if choice.request is not None and not choice.request.done:
                self.engine.cancel(choice.request)

    async def deltas(self, choice: _Choice) -> AsyncIterator[str]:
        """The choice's text as it becomes final; sets its finish reason at the end."""
        while True:
            event = await choice.events.get()
            if isinstance(event, PromptScored):
                choice.prompt_scores = event.scores
            elif isinstance(event, TokenGenerated):
                choice.logprobs.append(event.logprobs)
                piece = choice.assembler.add(event.token)
                if piece:
                    yield piece
                if choice.assembler.stopped:
                    self.engine.cancel(choice.request)
                    choice.finish_reason = "stop"
            elif isinstance(event, Finished):
                rest = choice.assembler.finish()
                if rest:
                    yield rest
                if event.reason is FinishReason.ERROR:
                    raise ApiError(f"Generation failed: {event.message}", status=500, type="server_error")
                if choice.finish_reason is None:
                    if event.reason is FinishReason.CANCELLED:
                        raise ApiError(f"The request was cancelled: {event.message or 'the server is stopping'}",
                                       status=503, type="server_error")
                    choice.finish_reason = "stop" if event.reason is FinishReason.STOP else "length"
                return

    async def run(self, choices: list[_Choice]) -> None:
        async def drain(choice):
            async for _ in self.deltas(choice):
                pass

        await asyncio.gather(*(drain(c) for c in choices))

    # -- records --------------------------------------------------------------------------------

    def usage(self, choices: list[_Choice], prompts: list[list[int]]) -> dict[str, int]:
        prompt_tokens = sum(len(p) for p in prompts)
        completion = sum(c.assembler.kept_tokens() for c in choices)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}

    def completion_logprobs(self, choice: _Choice, top: int, echo: bool) -> dict[str, Any]:
        tokens, token_logprobs, top_logprobs = [], [], []

        def add(token: int, scored: TokenLogprobs | None) -> None:
            tokens.append(self.token_text(token))
            token_logprobs.append(None if scored is None else scored.logprob)
            top_logprobs.append(None if scored is None else {self.token_text(t): lp for t, lp in scored.top[:top]})

        if echo:
            shown = choice.prompt_ids[choice.shown_from:]
            scores = (choice.prompt_scores or (None,) * len(choice.prompt_ids))[choice.shown_from:]
            for token, scored in zip(shown, scores):
                add(token, scored)
        kept = choice.assembler.kept_tokens()
        for token, scored in zip(choice.assembler.tokens[:kept], choice.logprobs[:kept]):
            add(token, scored)
        offsets, position = [], 0
        for text in tokens:
            offsets.append(position)
            position += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}

    def chat_logprobs(self, choice: _Choice, top: int) -> dict[str, Any]:
        def entry(token: int, logprob: float) -> dict[str, Any]:
            text = self.token_text(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        kept = choice.assembler.kept_tokens()
        return {"content": [entry(t, s.logprob) | {"top_logprobs": [entry(a, lp) for a, lp in s.top[:top]]}
                            for t, s in zip(choice.assembler.tokens[:kept], choice.logprobs[:kept])]}


def _sse(record: dict[str, Any]) -> str:
    return f"data: {json.dumps(record)}\n\n"


def _seed(sampling: Sampling) -> int:
    return sampling.seed if sampling.seed is not None else secrets.randbits(31)


def create_app(server: ModelServer) -> FastAPI:
    app = FastAPI(title="marin serve-model", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"There is no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return JSONResponse(ApiError(message, status=exc.status_code).body(), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(ApiError(f"Bad request: {exc}").body(), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("marin serve-model: %s %s failed", request.method, request.url.path)
        error = ApiError(f"The server failed on this request: {type(exc).__name__}: {exc}", status=500, type="server_error")
        return JSONResponse(error.body(), status_code=500)

    def model_record() -> dict[str, Any]:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "marin",
                "max_model_len": server.engine.max_seq_len}

    @app.get("/", response_class=HTMLResponse)
    async def page() -> str:
        return chat_page(server.model_name, chat=server.renderer is not None, max_len=server.engine.max_seq_len)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_record()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name != server.model_name:
            raise ApiError(f"The model '{name}' does not exist; this server serves '{server.model_name}'", status=404,
                           param="model", code="model_not_found")
        return model_record()

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return prometheus_text(server.engine.stats())

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        tok = server.tokenizer
        return {"eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": None,
                "chat_template": server.chat_template_text, "model_max_length": server.engine.max_seq_len}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await read_json_body(request, server.max_body_bytes)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise ApiError("'prompt' must be a string", param="prompt")
        ids = server.encode(body["prompt"])
        if body.get("add_special_tokens"):
            ids = server.as_document(ids)[0]
        return {"tokens": ids, "count": len(ids), "max_model_len": server.engine.max_seq_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await read_json_body(request, server.max_body_bytes)
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise ApiError("'tokens' must be a list of token ids", param="tokens")
        server.bounds.check_ids(tokens, "tokens")
        return {"prompt": server.decode(tokens)}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        parsed = parse_completion(await read_json_body(request, server.max_body_bytes), server.model_name)
        sampling, seed = parsed.sampling, _seed(parsed.sampling)
        prompts, texts, choices, params = [], [], [], []
        for prompt in parsed.prompts:
            if not isinstance(prompt, str):
                server.bounds.check_ids(prompt, "prompt")
        for prompt in parsed.prompts:
            ids = server.encode(prompt) if isinstance(prompt, str) else list(prompt)
            texts.append(prompt if isinstance(prompt, str) else server.decode(ids))
            conditioned, shown_from = server.as_document(ids)
            prompts.append(conditioned)
            for j in range(sampling.n):
                choices.append(_Choice(len(choices), conditioned, shown_from, TextAssembler(server.decode, sampling.stop)))
                params.append(server.params(sampling, len(conditioned), j, default_max=DEFAULT_COMPLETION_TOKENS,
                                            stops_ids=server.eos_ids, top_logprobs=parsed.logprobs or 0,
                                            prompt_logprobs=parsed.echo and parsed.logprobs is not None, seed=seed))
        record = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                  "model": server.model_name}
        server.start(choices, params)
        if sampling.stream:
            return _stream(server, choices, record, lambda c, text, finish: {
                "index": c.index, "text": text, "logprobs": None, "finish_reason": finish}, prompts, sampling.include_usage)
        try:
            await server.run(choices)
        finally:
            server.cancel(choices)
        out = []
        for choice in choices:
            prompt_text = texts[choice.index // sampling.n] if parsed.echo else ""
            logprobs = None if parsed.logprobs is None else server.completion_logprobs(choice, parsed.logprobs, parsed.echo)
            out.append({"index": choice.index, "text": prompt_text + choice.assembler.text, "logprobs": logprobs,
                        "finish_reason": choice.finish_reason})
        return record | {"choices": out, "usage": server.usage(choices, prompts)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        parsed = parse_chat(await read_json_body(request, server.max_body_bytes), server.model_name)
        if server.renderer is None:
            raise ApiError(f"The model '{server.model_name}' has no chat template (its tokenizer has none), so messages cannot "
                           "be rendered into a prompt; use /v1/completions, or restart with --chat-template NAME naming the "
                           "template it was fine-tuned with", param="messages", code="no_chat_template")
        from levanter.tokenization.chat import ChatTemplateError

        try:
            rendered = server.renderer.render(list(parsed.messages), add_generation_prompt=True)
        except ChatTemplateError as exc:
            raise ApiError(f"The chat template refused these messages: {exc}", param="messages") from exc
        ids = server.encode(rendered, "messages")
        sampling, seed = parsed.sampling, _seed(parsed.sampling)
        stops = (*sampling.stop, *((server.reply_end,) if server.reply_end else ()))
        choices = [_Choice(j, ids, 0, TextAssembler(server.decode, stops)) for j in range(sampling.n)]
        params = [server.params(sampling, len(ids), j, default_max=None, stops_ids=server.chat_stop_ids,
                                top_logprobs=parsed.top_logprobs, seed=seed) for j in range(sampling.n)]
        record = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                  "model": server.model_name}
        server.start(choices, params)
        if sampling.stream:
            return _stream(server, choices, record | {"object": "chat.completion.chunk"}, lambda c, text, finish: {
                "index": c.index, "delta": {"content": text} if text is not None else {}, "logprobs": None,
                "finish_reason": finish}, [ids], sampling.include_usage, opening={"role": "assistant", "content": ""})
        try:
            await server.run(choices)
        finally:
            server.cancel(choices)
        out = [{"index": c.index, "message": {"role": "assistant", "content": c.assembler.text},
                "logprobs": server.chat_logprobs(c, parsed.top_logprobs) if parsed.logprobs else None,
                "finish_reason": c.finish_reason} for c in choices]
        return record | {"choices": out, "usage": server.usage(choices, [ids])}

    return app


def _stream(server: ModelServer, choices: list[_Choice], record: dict[str, Any], choice_record: Any,
            prompts: list[list[int]], include_usage: bool, opening: dict[str, Any] | None = None) -> StreamingResponse:
    """Server-sent events: one chunk per piece of final text, a last chunk per choice with its finish
    reason, the usage when asked for, then ``[DONE]``. An error after the first chunk is sent as an
    event of OpenAI's error shape, as no status can be sent any more."""

    async def events() -> AsyncIterator[str]:
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(choice: _Choice) -> None:
            try:
                async for piece in server.deltas(choice):
                    await merged.put((choice, piece, None))
                await merged.put((choice, None, choice.finish_reason))
            except ApiError as exc:
                await merged.put((choice, exc, None))

        tasks = [asyncio.create_task(pump(c)) for c in choices]
        try:
            if opening is not None:
                for choice in choices:
                    yield _sse(record | {"choices": [{"index": choice.index, "delta": opening, "logprobs": None, "finish_reason": None}]})
            remaining = len(choices)
            while remaining:
                choice, piece, finish = await merged.get()
                if isinstance(piece, ApiError):
                    yield _sse(piece.body())
                    break
                if finish is not None:
                    remaining -= 1
                    yield _sse(record | {"choices": [choice_record(choice, None if opening else "", finish)]})
                else:
                    yield _sse(record | {"choices": [choice_record(choice, piece, None)]})
            if include_usage:
                yield _sse(record | {"choices": [], "usage": server.usage(choices, prompts)})
            yield "data: [DONE]\n\n"
        finally:  # the client went away, or all is sent: nothing keeps generating for nobody
            server.cancel(choices)
            for task in tasks:
                task.cancel()

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


__all__ = ["ModelServer", "create_app"]
