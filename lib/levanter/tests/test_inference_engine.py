"""Continuous batching over a paged cache gives what one-prompt-at-a-time sampling gives."""

import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from levanter.inference import sample
from levanter.inference.engine import (
    EngineConfig,
    Finished,
    FinishReason,
    GenerationEngine,
    GenerationParams,
    RequestRefusedError,
    TokenGenerated,
)
from levanter.inference.paged_cache import BlockAllocator
from levanter.models import LlamaConfig

VOCAB = 64
CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64, use_scan=True)
WAIT_S = 60


@pytest.fixture(scope="module")
def model():
    return CONFIG.build(VOCAB, key=jax.random.PRNGKey(0))


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.RandomState(seed).randint(1, VOCAB, size=length).tolist()


def _greedy_reference(model, prompt: list[int], max_tokens: int) -> list[int]:
    return np.asarray(sample(model, np.asarray(prompt, np.int32), max_new_tokens=max_tokens, temperature=0.0))[len(prompt):].tolist()


def test_concurrent_prompts_of_different_lengths_match_greedy_sample(model):
    prompts = [_prompt(n, seed) for seed, n in enumerate((3, 5, 9, 17, 30))]
    budgets = [6, 3, 8, 5, 4]
    with GenerationEngine(model, EngineConfig(max_batch=8, block_size=4)) as engine:
        results: dict[int, list] = {}

        def ask(i):
            results[i] = engine.generate([prompts[i]], GenerationParams(max_tokens=budgets[i]), timeout=WAIT_S)[0]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
    for i, prompt in enumerate(prompts):
        assert results[i].finish_reason is FinishReason.LENGTH
        assert results[i].tokens == _greedy_reference(model, prompt, budgets[i]), f"prompt {i} (length {len(prompt)})"


def test_a_request_joining_a_running_batch_changes_no_ones_tokens(model):
    first, late = _prompt(6, 10), _prompt(11, 11)
    events: list[tuple[str, object]] = []
    joined = threading.Event()
    done = {name: threading.Event() for name in ("first", "late")}

    def listener(name):
        def listen(event):
            events.append((name, event))
            if name == "first" and isinstance(event, TokenGenerated) and sum(n == "first" for n, _ in events) == 3:
                joined.set()
            if isinstance(event, Finished):
                done[name].set()
        return listen

    with GenerationEngine(model, EngineConfig(max_batch=4, block_size=4)) as engine:
        engine.submit(first, GenerationParams(max_tokens=10), listener("first"))
        assert joined.wait(WAIT_S)
        engine.submit(late, GenerationParams(max_tokens=5), listener("late"))
        assert all(event.wait(WAIT_S) for event in done.values())
    tokens = {name: [e.token for n, e in events if n == name and isinstance(e, TokenGenerated)] for name in done}
    assert tokens["first"] == _greedy_reference(model, first, 10)
    assert tokens["late"] == _greedy_reference(model, late, 5)
    # The late request ran while the first was still going: their tokens interleave.
    order = [n for n, e in events if isinstance(e, TokenGenerated)]
    assert order.index("late") < len(order) - 1 - order[::-1].index("first")


def test_a_request_that_cannot_get_blocks_waits_until_some_are_freed(model):
    # 4 blocks of 4 positions; each request needs 3 (4 prompt tokens + 8 new), so they take turns.
    prompts = [_prompt(4, 20), _prompt(4, 21)]
    order: list[tuple[int, str]] = []
    tokens: dict[int, list[int]] = {0: [], 1: []}
    done = [threading.Event(), threading.Event()]

    def listener(i):
        def listen(event):
            order.append((i, type(event).__name__))
            if isinstance(event, TokenGenerated):
                tokens[i].append(event.token)
            if isinstance(event, Finished):
                done[i].set()
        return listen

    with GenerationEngine(model, EngineConfig(max_batch=4, block_size=4, num_blocks=5)) as engine:
        assert engine.block_capacity == 4
        for i, prompt in enumerate(prompts):
            engine.submit(prompt, GenerationParams(max_tokens=8), listener(i))
        assert all(event.wait(WAIT_S) for event in done)
        assert engine.stats().blocks_used == 0
    assert order.index((0, "Finished")) < order.index((1, "TokenGenerated"))
    assert tokens[1] == _greedy_reference(model, prompts[1], 8)


def test_block_allocator_hands_out_each_block_once_and_refuses_when_short():
    allocator = BlockAllocator(6)
    first = allocator.allocate(3)
    assert first == [1, 2, 3] and allocator.allocate(3) is None and allocator.free_blocks == 2
    second = allocator.allocate(2)
    assert not set(first) & set(second) and 0 not in first + second
    allocator.release(first)
    assert sorted(allocator.allocate(3)) == first


def test_new_prompt_lengths_in_a_bucket_compile_nothing_new(model):
    with GenerationEngine(model, EngineConfig(max_batch=4, block_size=4)) as engine:
        engine.generate([_prompt(9, 30)], GenerationParams(max_tokens=4), timeout=WAIT_S)
        warm = engine.compilations
        assert warm >= 2  # a prefill and a decode step
        for length in (10, 11, 12):
            engine.generate([_prompt(length, length)], GenerationParams(max_tokens=2), timeout=WAIT_S)
        assert engine.compilations == warm
        engine.generate([_prompt(17, 40)], GenerationParams(max_tokens=2), timeout=WAIT_S)  # a longer bucket
        assert engine.compilations > warm


def test_a_model_placed_on_a_mesh_compiles_nothing_new_for_a_second_request_of_the_same_shapes(model):
    # A trainer's model lives on its mesh; the fresh cache must start there too, or the first call
    # returns it placed there and the second compiles the same program again.
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    placed = jax.device_put(model, NamedSharding(mesh, PartitionSpec()))
    with GenerationEngine(placed, EngineConfig(max_batch=4, block_size=4)) as engine:
        first = engine.generate([_prompt(9, 50)], GenerationParams(max_tokens=3), timeout=WAIT_S)[0]
        warm = engine.compilations
        engine.generate([_prompt(9, 51)], GenerationParams(max_tokens=3), timeout=WAIT_S)
        assert engine.compilations == warm
    assert first.tokens == _greedy_reference(model, _prompt(9, 50), 3)


def test_a_seeded_request_gives_the_same_tokens_alone_or_in_a_batch(model):
    prompt = _prompt(7, 50)
    sampled = GenerationParams(max_tokens=6, temperature=1.0, seed=3)
    with GenerationEngine(model, EngineConfig(max_batch=4, block_size=8)) as engine:
        alone = engine.generate([prompt], sampled, timeout=WAIT_S)[0].tokens
        crowd = engine.generate([prompt, _prompt(12, 51), _prompt(3, 52)], sampled, timeout=WAIT_S)[0].tokens
        other_seed = engine.generate([prompt], GenerationParams(max_tokens=6, temperature=1.0, seed=4), timeout=WAIT_S)[0].tokens
        top1 = engine.generate([prompt], GenerationParams(max_tokens=6, temperature=1.0, top_k=1, seed=5), timeout=WAIT_S)[0].tokens
    assert alone == crowd
    assert other_seed != alone  # 6 draws from 64 tokens at temperature 1 all equal by chance: ~never
    assert top1 == _greedy_reference(model, prompt, 6)  # top-k 1 leaves only the argmax


def test_prompt_logprobs_are_the_full_forwards_and_stop_tokens_end_a_request(model):
    prompt = _prompt(10, 60)
    with GenerationEngine(model, EngineConfig(max_batch=2, block_size=4)) as engine:
        scored = engine.generate([prompt], GenerationParams(max_tokens=0, prompt_logprobs=True, top_logprobs=3), timeout=WAIT_S)[0]
        greedy = _greedy_reference(model, prompt, 4)
        stopped = engine.generate([prompt], GenerationParams(max_tokens=4, stop_ids=(greedy[2],)), timeout=WAIT_S)[0]
    log_probs = np.asarray(jax.nn.log_softmax(model(np.asarray([prompt], np.int32))[0], axis=-1))
    assert scored.tokens == [] and scored.finish_reason is FinishReason.LENGTH
    assert scored.prompt_scores[0] is None and len(scored.prompt_scores) == len(prompt)
    for t, score in enumerate(scored.prompt_scores[1:], start=1):
        assert score.logprob == pytest.approx(log_probs[t - 1, prompt[t]], abs=1e-4)
        assert [token for token, _ in score.top] == np.argsort(-log_probs[t - 1])[:3].tolist()
    expected = greedy[:greedy.index(greedy[2])]
    assert stopped.tokens == expected and stopped.finish_reason is FinishReason.STOP


def test_cancelling_frees_the_blocks_and_refusals_give_the_numbers(model):
    started = threading.Event()
    finished: list[Finished] = []

    def listen(event):
        if isinstance(event, TokenGenerated):
            started.set()
        elif isinstance(event, Finished):
            finished.append(event)

    with GenerationEngine(model, EngineConfig(max_batch=2, block_size=4)) as engine:
        request = engine.submit(_prompt(4, 70), GenerationParams(max_tokens=50), listen)
        assert started.wait(WAIT_S)
        engine.cancel(request)
        engine.generate([_prompt(3, 71)], GenerationParams(max_tokens=1), timeout=WAIT_S)  # a step after the cancel
        assert finished and finished[0].reason is FinishReason.CANCELLED
        assert engine.stats().blocks_used == 0
        with pytest.raises(RequestRefusedError, match=r"context is 64 tokens, but the prompt has 60 and max_tokens asks for 10 more \(70 in all\)"):
            engine.submit(_prompt(60, 72), GenerationParams(max_tokens=10), listen)
        with pytest.raises(RequestRefusedError, match="outside the model's vocabulary"):
            engine.submit([VOCAB + 1], GenerationParams(max_tokens=1), listen)


def test_a_reported_stop_token_ends_the_request_with_its_logprob_at_the_sampling_temperature(model):
    prompt = _prompt(8, 80)
    temperature = 0.7
    with GenerationEngine(model, EngineConfig(max_batch=2, block_size=4)) as engine:
        free = engine.generate([prompt], GenerationParams(max_tokens=6, temperature=temperature, seed=9), timeout=WAIT_S)[0]
        stop = free.tokens[2]
        params = GenerationParams(max_tokens=6, temperature=temperature, seed=9, stop_ids=(stop,), report_stop=True,
                                  logprobs_at_temperature=True)
        stopped = engine.generate([prompt], params, timeout=WAIT_S)[0]
    first = free.tokens.index(stop)
    assert stopped.tokens == free.tokens[:first + 1] and stopped.finish_reason is FinishReason.STOP
    # Each log-probability is that of softmax(logits / temperature), from a full forward of what came before.
    sequence = np.asarray([prompt + stopped.tokens], np.int32)
    logits = np.asarray(model(sequence)[0], np.float64)[len(prompt) - 1:-1] / temperature
    expected = logits[np.arange(len(stopped.tokens)), stopped.tokens] - np.log(np.exp(logits).sum(-1))
    assert [lp.logprob for lp in stopped.logprobs] == pytest.approx(expected.tolist(), abs=1e-4)
    # Without the option they are the model's own (temperature 1), as before.
    raw = np.asarray(jax.nn.log_softmax(model(sequence)[0], axis=-1))[len(prompt) - 1:-1]
    assert [lp.logprob for lp in free.logprobs[:first + 1]] == pytest.approx(raw[np.arange(first + 1), stopped.tokens].tolist(), abs=1e-4)


def test_new_weights_serve_the_next_requests_and_are_refused_mid_request(model):
    other = CONFIG.build(VOCAB, key=jax.random.PRNGKey(1))
    prompt = _prompt(5, 90)
    started = threading.Event()
    with GenerationEngine(model, EngineConfig(max_batch=2, block_size=4)) as engine:
        request = engine.submit(prompt, GenerationParams(max_tokens=40), lambda event: started.set())
        assert started.wait(WAIT_S)
        with pytest.raises(RuntimeError, match="in flight"):
            engine.set_model(other)
        engine.cancel(request)
        engine.generate([prompt], GenerationParams(max_tokens=1), timeout=WAIT_S)  # the cancel has taken effect
        compiled = engine.compilations
        engine.set_model(other)
        tokens = engine.generate([prompt], GenerationParams(max_tokens=4), timeout=WAIT_S)[0].tokens
        assert engine.compilations == compiled  # the same shapes: the compiled steps serve the new weights
    assert tokens == _greedy_reference(other, prompt, 4)
