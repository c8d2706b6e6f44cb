"""Generation for many requests at once: continuous batching over a paged key/value cache.

One scheduler thread owns the model and the cache. Between decode steps it admits waiting
requests, first come first served, while a batch slot and the blocks for the request's whole
length (prompt + ``max_tokens``) are free; prefills them together; then advances every running
request by one token in one batched step. A request leaves the batch at the step it finishes and
its blocks go back to the free list. Reserving all of a request's blocks when it is admitted means
a running request never runs out of cache and nothing is ever preempted; a request that cannot get
its blocks waits at the head of the queue, and later ones wait behind it, so a long request is not
starved by short ones.

Compiled shapes are bucketed, so a new prompt length or batch size reuses a compiled program: the
batch is padded to a power of two (up to ``max_batch``), a prefill's length to a power of two (at
least 16, at most the model's context) and the blocks a row's view spans to a power of two.
:attr:`GenerationEngine.compilations` counts the traces.

Sampling is per row: each request has its own temperature, top-k, top-p and seed, and its i-th
token is drawn with ``fold_in(PRNGKey(seed), i)``, so a seeded request gives the same tokens
whatever else shares its batch. A greedy row (temperature 0) takes the argmax of the logits, as
:func:`levanter.inference.sample` does. Log-probabilities are those of the model's distribution,
before temperature and truncation, unless a request asks for them at its temperature (what a
policy-gradient loss at that temperature compares against).

:meth:`GenerationEngine.set_model` replaces the weights between requests (a policy being trained
hands its samplers new weights); a program compiled for the old weights serves the new ones when
their shapes and dtypes are the same.

Events (:class:`PromptScored`, :class:`TokenGenerated`, :class:`Finished`) reach each request's
listener on the scheduler thread, as they happen; a listener must return quickly.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from levanter.errors import LevanterError
from levanter.inference.paged_cache import TRASH_BLOCK, BlockAllocator, blocks_for, init_paged_cache, paged_decode

logger = logging.getLogger(__name__)

MAX_TOP_LOGPROBS = 5  # alternatives kept per position, as OpenAI's completions API allows
_MIN_PREFILL_BUCKET = 16
_RATE_WINDOW_S = 10.0


class RequestRefusedError(LevanterError, ValueError):
    """A request this engine can never serve (too long for the model or the cache, bad settings)."""


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop token was generated
    LENGTH = "length"  # max_tokens reached
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class GenerationParams:
    """How one request is continued. ``temperature=0`` is greedy; ``top_k=0`` and ``top_p=1`` are off.

    ``stop_ids``: tokens that end the request (not reported, unless ``report_stop``: then the stop
    token is the request's last token, with its log-probability, as a policy that must learn when to
    stop needs it). ``top_logprobs``: how many of the likeliest alternatives to report with each
    token (at most :data:`MAX_TOP_LOGPROBS`). ``prompt_logprobs``: also score every prompt token
    given the ones before it. ``max_tokens=0`` only scores the prompt. ``logprobs_at_temperature``:
    each chosen token's log-probability is that of ``softmax(logits / temperature)`` (before top-k
    and top-p), not of the model's own distribution; the alternatives stay the model's.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop_ids: tuple[int, ...] = ()
    top_logprobs: int = 0
    prompt_logprobs: bool = False
    report_stop: bool = False
    logprobs_at_temperature: bool = False


@dataclass(frozen=True)
class TokenLogprobs:
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), likeliest first


@dataclass(frozen=True)
class PromptScored:
    scores: tuple[TokenLogprobs | None, ...]  # one per prompt token; the first has no context and is None


@dataclass(frozen=True)
class TokenGenerated:
    token: int
    logprobs: TokenLogprobs


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    message: str = ""


Event = PromptScored | TokenGenerated | Finished
Listener = Callable[[Event], None]


@dataclass(frozen=True)
class EngineConfig:
    """``num_blocks`` (block 0 reserved) bounds the cache; None gives every batch slot room for a
    full-length sequence."""

    max_batch: int = 32
    block_size: int = 16
    num_blocks: int | None = None


@dataclass(frozen=True)
class EngineStats:
    prompt_tokens: int
    generated_tokens: int
    finished_requests: int
    waiting: int
    running: int
    blocks_used: int
    blocks_total: int
    tokens_per_second: float  # generated, over the last few seconds
    compilations: int


@dataclass
class Request:
    """A submitted request; hand it to :meth:`GenerationEngine.cancel` to stop it early."""

    prompt: list[int]
    params: GenerationParams
    listener: Listener
    blocks: list[int] = field(default_factory=list)
    length: int = 0  # positions whose keys and values are in the cache
    pending: int = -1  # the last token chosen, not yet in the cache
    generated: int = 0
    cancelled: bool = False
    done: bool = False


@dataclass(frozen=True)
class Generation:
    """What :meth:`GenerationEngine.generate` returns for one prompt."""

    tokens: list[int]
    logprobs: list[TokenLogprobs]
    finish_reason: FinishReason
    prompt_scores: tuple[TokenLogprobs | None, ...] | None = None
    message: str = ""


def _bucket(n: int, smallest: int, largest: int) -> int:
    size = smallest
    while size < n:
        size *= 2
    return max(min(size, largest), n)


def _choose(logits, seeds, steps, temperature, top_k, top_p, scale_logprobs):
    """Per row: the token chosen, its log-probability (at the row's temperature where ``scale_logprobs``), the
    top alternatives and whether the logits were finite."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def sampled(_):
        vocab = logits.shape[-1]
        scaled = logits / jnp.maximum(temperature, 1e-6)[:, None]
        descending = -jnp.sort(-scaled, axis=-1)
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
        descending = jnp.where(jnp.arange(vocab)[None, :] < k[:, None], descending, -jnp.inf)
        # Nucleus over what top-k kept: the likeliest tokens until their mass reaches top_p, the
        # one that crosses it included, so at least one survives.
        probs = jax.nn.softmax(descending, axis=-1)
        kept = jnp.sum(jnp.cumsum(probs, axis=-1) - probs < top_p[:, None], axis=-1, keepdims=True)
        threshold = jnp.take_along_axis(descending, jnp.minimum(kept, k[:, None]) - 1, axis=-1)
        scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
        keys = jax.vmap(lambda seed, step: jax.random.fold_in(jax.random.PRNGKey(seed), step))(seeds, steps)
        drawn = jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)
        return jnp.where(temperature > 0, drawn, greedy)

    token = jax.lax.cond(jnp.any(temperature > 0), sampled, lambda _: greedy, None)
    top_values, top_ids = jax.lax.top_k(log_probs, min(MAX_TOP_LOGPROBS, logits.shape[-1]))
    chosen = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    at_temperature = jax.nn.log_softmax(logits / jnp.maximum(temperature, 1e-6)[:, None], axis=-1)
    chosen_at_temperature = jnp.take_along_axis(at_temperature, token[:, None], axis=-1)[:, 0]
    chosen = jnp.where(scale_logprobs & (temperature > 0), chosen_at_temperature, chosen)
    return token, chosen, top_values, top_ids, jnp.all(jnp.isfinite(logits), axis=-1)


class GenerationEngine:
    """Continuous batching of generation requests over one model (see the module docstring)."""

    def __init__(self, model: Any, config: EngineConfig = EngineConfig()):
        if config.max_batch < 1 or config.block_size < 1:
            raise ValueError(f"max_batch and block_size must be positive, got {config.max_batch} and {config.block_size}")
        self.model = model
        self.config = config
        self.max_seq_len = int(model.config.max_seq_len)
        self._max_view_blocks = blocks_for(self.max_seq_len, config.block_size)
        num_blocks = config.num_blocks or config.max_batch * self._max_view_blocks + 1
        self._allocator = BlockAllocator(num_blocks)
        self._cache = init_paged_cache(model, num_blocks, config.block_size)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.compilations = 0
        self._prompt_tokens = 0
        self._generated_tokens = 0
        self._finished = 0
        self._in_flight = 0  # submitted and not yet finished: the weights may change only at 0
        self._recent: deque[tuple[float, int]] = deque()
        self._prefill = jax.jit(self._prefill_fn, static_argnames=("prompt_logprobs",), donate_argnames=("cache",))
        self._step = jax.jit(self._step_fn, donate_argnames=("cache",))

    # -- the public side --------------------------------------------------------------------------

    def start(self) -> GenerationEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="generation-engine", daemon=True)
            self._thread.start()
        return self

    def close(self, timeout: float = 30.0) -> None:
        """Stop the scheduler; requests still waiting or running finish as cancelled."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        for request in [*self._waiting, *self._running]:
            self._finish(request, FinishReason.CANCELLED, "the server is shutting down")
        self._waiting.clear()
        self._running.clear()

    def __enter__(self) -> GenerationEngine:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_model(self, model: Any) -> None:
        """Serve ``model`` (new weights of the same model) from the next request on.

        Refused while requests are in flight, so that every request is generated by one set of
        weights from its first token to its last.
        """
        with self._cond:
            if self._in_flight:
                raise RuntimeError(f"set_model while {self._in_flight} request(s) are in flight; wait for them to finish")
            self.model = model

    @property
    def block_capacity(self) -> int:
        return self._allocator.capacity

    def check(self, prompt_len: int, params: GenerationParams) -> None:
        """Raise :class:`RequestRefusedError`, with the numbers, if this request can never be served."""
        if prompt_len < 1:
            raise RequestRefusedError("the prompt is empty: give at least one token")
        if params.max_tokens < 0:
            raise RequestRefusedError(f"max_tokens must be 0 or more, got {params.max_tokens}")
        total = prompt_len + params.max_tokens
        if total > self.max_seq_len:
            raise RequestRefusedError(
                f"this model's context is {self.max_seq_len} tokens, but the prompt has {prompt_len} and max_tokens "
                f"asks for {params.max_tokens} more ({total} in all); shorten the prompt or lower max_tokens"
            )
        needed = blocks_for(total, self.config.block_size)
        if needed > self._allocator.capacity:
            raise RequestRefusedError(
                f"the request needs {needed} cache blocks of {self.config.block_size} tokens ({total} tokens) but the "
                f"cache holds only {self._allocator.capacity}; lower max_tokens or start the server with more blocks"
            )
        if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
            raise RequestRefusedError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {params.top_logprobs}")

    def submit(self, prompt: Sequence[int], params: GenerationParams, listener: Listener) -> Request:
        prompt = [int(t) for t in prompt]
        self.check(len(prompt), params)
        vocab = self.model.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            bad = next(t for t in prompt if not 0 <= t < vocab)
            raise RequestRefusedError(f"token id {bad} is outside the model's vocabulary (0 to {vocab - 1})")
        request = Request(prompt, params, listener)
        with self._cond:
            if self._stopping:
                raise RequestRefusedError("the engine is shutting down")
            self._waiting.append(request)
            self._in_flight += 1
            self._prompt_tokens += len(prompt)
            self._cond.notify_all()
        return request

    def cancel(self, request: Request) -> None:
        """Stop ``request`` at the next step; its blocks are freed and it finishes as cancelled."""
        with self._cond:
            request.cancelled = True
            self._cond.notify_all()

    def generate(self, prompts: Sequence[Sequence[int]], params: GenerationParams | Sequence[GenerationParams],
                 timeout: float = 600.0) -> list[Generation]:
        """Submit every prompt at once and wait for all of them (the engine must be started).

        ``params``: one for every prompt, or one per prompt (each its own seed, say)."""
        per_prompt = [params] * len(prompts) if isinstance(params, GenerationParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise RequestRefusedError(f"{len(prompts)} prompts but {len(per_prompt)} generation params; give one, or one per prompt")
        results: list[dict[str, Any]] = [{"tokens": [], "logprobs": [], "scores": None} for _ in prompts]
        finished = [threading.Event() for _ in prompts]

        def listener_for(i: int) -> Listener:
            def listen(event: Event) -> None:
                if isinstance(event, TokenGenerated):
                    results[i]["tokens"].append(event.token)
                    results[i]["logprobs"].append(event.logprobs)
                elif isinstance(event, PromptScored):
                    results[i]["scores"] = event.scores
                else:
                    results[i]["finish"] = event
                    finished[i].set()

            return listen

        for i, prompt in enumerate(prompts):
            self.submit(prompt, per_prompt[i], listener_for(i))
        deadline = time.monotonic() + timeout
        for event in finished:
            if not event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"generation did not finish within {timeout} s")
        return [Generation(r["tokens"], r["logprobs"], r["finish"].reason, r["scores"], r["finish"].message) for r in results]

    def stats(self) -> EngineStats:
        with self._cond:
            now = time.monotonic()
            while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
                self._recent.popleft()
            recent = sum(count for _, count in self._recent)
            return EngineStats(
                prompt_tokens=self._prompt_tokens, generated_tokens=self._generated_tokens,
                finished_requests=self._finished, waiting=len(self._waiting), running=len(self._running),
                blocks_used=self._allocator.capacity - self._allocator.free_blocks, blocks_total=self._allocator.capacity,
                tokens_per_second=recent / _RATE_WINDOW_S, compilations=self.compilations,
            )

    # -- compiled steps ---------------------------------------------------------------------------

    def _prefill_fn(self, model, cache, tokens, lengths, block_tables, seeds, temperature, top_k, top_p, scale_logprobs, *,
                    prompt_logprobs):
        self.compilations += 1  # runs only while tracing
        logits, cache = paged_decode(model, tokens, jnp.zeros_like(lengths), lengths, block_tables, cache)
        last = jnp.take_along_axis(logits, jnp.maximum(lengths - 1, 0)[:, None, None], axis=1)[:, 0]
        chosen = _choose(last, seeds, jnp.zeros_like(seeds), temperature, top_k, top_p, scale_logprobs)
        scores = None
        if prompt_logprobs:
            log_probs = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
            following = jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]
            scores = (following, *jax.lax.top_k(log_probs, min(MAX_TOP_LOGPROBS, log_probs.shape[-1])))
        return cache, chosen, scores

    def _step_fn(self, model, cache, tokens, starts, lengths, block_tables, seeds, steps, temperature, top_k, top_p,
                 scale_logprobs):
        self.compilations += 1
        logits, cache = paged_decode(model, tokens[:, None], starts, lengths, block_tables, cache)
        return cache, _choose(logits[:, 0], seeds, steps, temperature, top_k, top_p, scale_logprobs)

    # -- the scheduler ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stopping:
                    return
                admitted = self._admit()
            for request in [r for r in self._running if r.cancelled]:
                self._finish(request, FinishReason.CANCELLED)
            try:
                if admitted:
                    self._prefill_batch(admitted)
                if self._running:
                    self._decode_batch()
            except Exception as exc:  # a failed step fails the requests in it, not the server
                logger.exception("generation step failed")
                for request in [*admitted, *self._running]:
                    self._finish(request, FinishReason.ERROR, f"generation failed: {type(exc).__name__}: {exc}")

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        while self._waiting and len(self._running) + len(admitted) < self.config.max_batch:
            request = self._waiting[0]
            if request.cancelled:
                self._waiting.popleft()
                self._finish(request, FinishReason.CANCELLED)
                continue
            needed = blocks_for(len(request.prompt) + request.params.max_tokens, self.config.block_size)
            blocks = self._allocator.allocate(needed)
            if blocks is None:
                break  # the head waits for blocks; the ones behind it wait their turn
            self._waiting.popleft()
            request.blocks = blocks
            admitted.append(request)
        return admitted

    def _tables(self, requests: list[Request], rows: int, view_blocks: int) -> np.ndarray:
        tables = np.full((rows, view_blocks), TRASH_BLOCK, np.int32)
        for i, request in enumerate(requests):
            owned = request.blocks[:view_blocks]
            tables[i, :len(owned)] = owned
        return tables

    def _sampling_arrays(self, requests: list[Request], rows: int) -> tuple[np.ndarray, ...]:
        seeds = np.zeros(rows, np.uint32)
        temperature = np.zeros(rows, np.float32)
        top_k = np.zeros(rows, np.int32)
        top_p = np.ones(rows, np.float32)
        scaled = np.zeros(rows, bool)
        for i, request in enumerate(requests):
            seeds[i] = request.params.seed & 0xFFFFFFFF
            temperature[i] = request.params.temperature
            top_k[i] = request.params.top_k
            top_p[i] = request.params.top_p
            scaled[i] = request.params.logprobs_at_temperature
        return seeds, temperature, top_k, top_p, scaled

    def _prefill_batch(self, requests: list[Request]) -> None:
        rows = _bucket(len(requests), 1, self.config.max_batch)
        width = _bucket(max(len(r.prompt) for r in requests), _MIN_PREFILL_BUCKET, self.max_seq_len)
        view_blocks = _bucket(blocks_for(width, self.config.block_size), 1, self._max_view_blocks)
        tokens = np.zeros((rows, width), np.int32)
        lengths = np.zeros(rows, np.int32)
        for i, request in enumerate(requests):
            tokens[i, :len(request.prompt)] = request.prompt
            lengths[i] = len(request.prompt)
        seeds, temperature, top_k, top_p, scaled = self._sampling_arrays(requests, rows)
        want_scores = any(r.params.prompt_logprobs for r in requests)
        self._cache, chosen, scores = self._prefill(
            self.model, self._cache, tokens, lengths, self._tables(requests, rows, view_blocks), seeds, temperature,
            top_k, top_p, scaled, prompt_logprobs=want_scores,
        )
        chosen, scores = jax.device_get((chosen, scores))
        for i, request in enumerate(requests):
            request.length = len(request.prompt)
            if request.params.prompt_logprobs:
                following, top_values, top_ids = scores
                n = request.params.top_logprobs
                per_token = [TokenLogprobs(float(following[i, t]), tuple(zip(top_ids[i, t, :n].tolist(), top_values[i, t, :n].tolist())))
                             for t in range(request.length - 1)]
                self._emit(request, PromptScored((None, *per_token)))
            if request.params.max_tokens == 0:
                self._finish(request, FinishReason.LENGTH)
            elif self._accept(request, i, chosen):
                self._running.append(request)

    def _decode_batch(self) -> None:
        requests = list(self._running)
        rows = _bucket(len(requests), 1, self.config.max_batch)
        view_blocks = _bucket(max(blocks_for(r.length + 1, self.config.block_size) for r in requests), 1, self._max_view_blocks)
        tokens = np.zeros(rows, np.int32)
        starts = np.zeros(rows, np.int32)
        lengths = np.zeros(rows, np.int32)
        steps = np.zeros(rows, np.int32)
        for i, request in enumerate(requests):
            tokens[i], starts[i], lengths[i], steps[i] = request.pending, request.length, 1, request.generated
        seeds, temperature, top_k, top_p, scaled = self._sampling_arrays(requests, rows)
        self._cache, chosen = self._step(
            self.model, self._cache, tokens, starts, lengths, self._tables(requests, rows, view_blocks), seeds, steps,
            temperature, top_k, top_p, scaled,
        )
        chosen = jax.device_get(chosen)
        for i, request in enumerate(requests):
            request.length += 1
            self._accept(request, i, chosen)  # a finished request leaves the batch in _finish

    def _accept(self, request: Request, row: int, chosen: tuple[np.ndarray, ...]) -> bool:
        """Hand row ``row``'s token to ``request``; False once the request is finished."""
        token, logprob, top_values, top_ids, finite = (array[row] for array in chosen)
        if request.cancelled:
            self._finish(request, FinishReason.CANCELLED)
            return False
        if not finite:
            self._finish(request, FinishReason.ERROR, "the model produced NaN or infinite logits: its weights are broken "
                                                      "(or overflow in their dtype)")
            return False
        token = int(token)
        stop = token in request.params.stop_ids
        if stop and not request.params.report_stop:
            self._finish(request, FinishReason.STOP)
            return False
        request.generated += 1
        request.pending = token
        with self._cond:
            self._generated_tokens += 1
            self._recent.append((time.monotonic(), 1))
        n = request.params.top_logprobs
        self._emit(request, TokenGenerated(token, TokenLogprobs(float(logprob), tuple(zip(top_ids[:n].tolist(), top_values[:n].tolist())))))
        if stop:
            self._finish(request, FinishReason.STOP)
            return False
        if request.generated >= request.params.max_tokens:
            self._finish(request, FinishReason.LENGTH)
            return False
        return not request.done

    def _emit(self, request: Request, event: Event) -> None:
        try:
            request.listener(event)
        except Exception:  # a broken listener loses its own request only
            logger.exception("a generation listener failed; cancelling its request")
            request.cancelled = True

    def _finish(self, request: Request, reason: FinishReason, message: str = "") -> None:
        if request.done:
            return
        request.done = True
        if request in self._running:
            self._running.remove(request)
        if request.blocks:
            self._allocator.release(request.blocks)
            request.blocks = []
        with self._cond:
            self._finished += 1
            self._in_flight -= 1
        self._emit(request, Finished(reason, message))


__all__ = [
    "MAX_TOP_LOGPROBS", "EngineConfig", "EngineStats", "Event", "Finished", "FinishReason", "Generation", "GenerationEngine",
    "GenerationParams", "PromptScored", "Request", "RequestRefusedError", "TokenGenerated", "TokenLogprobs",
]
