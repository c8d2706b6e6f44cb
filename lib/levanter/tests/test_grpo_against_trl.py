"""The GRPO objective and its Dr. GRPO and DAPO variants give TRL's GRPOTrainer loss, advantages and
gradient on the same batch: the same prompts, completions, rewards and sampler log-probabilities, and
the same weights (a small Llama made by transformers, imported into our model).

TRL's trainer runs for real: its own reward scoring and advantages (``_generate_and_score_completions``,
with the completions handed in through its ``rollout_func``) and its own loss (``_compute_loss``). The
sampler's log-probabilities are set as its ``old_per_token_logps``: the weights that sampled are not
the weights trained, so ratios differ from 1 and some are clipped. The reference is the weights
before a perturbation, the policy the weights after it, on both sides.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # TRL warns that rollout_func is experimental
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

from levanter.compat.hf_checkpoints import import_from_hf  # noqa: E402
from levanter.trainer.grpo import (  # noqa: E402
    ADVANTAGES,
    SAMPLER_LOGPROBS,
    GrpoObjective,
    dapo,
    dr_grpo,
    group_advantages,
    grpo,
)
from levanter.trainer.state import FrozenArrays  # noqa: E402
from levanter.trainer.step import DeviceBatch  # noqa: E402

CHARS = list("0123456789+-=abc ")
PAD, EOS = 0, 1
VOCAB = 2 + len(CHARS)
GROUP = 4
MAX_COMPLETION = 7
PROMPTS = [[5, 11, 4, 13], [2 + 3, 2 + 3, 12, 2 + 4, 13]]  # two prompts of different lengths
REWARDS = [1.0, 0.0, 0.0, 0.5, 0.25, 0.25, 1.0, 0.0]  # per completion, groups of GROUP


def _completions(rng) -> list[list[int]]:
    """Completions of several lengths; some end in EOS, some stop at the token budget."""
    out = []
    for i in range(len(PROMPTS) * GROUP):
        length = int(rng.integers(2, MAX_COMPLETION + 1))
        tokens = rng.integers(2, VOCAB, size=length).tolist()
        if i % 3 != 2:
            tokens[-1] = EOS
        out.append(tokens)
    return out


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A small Llama saved twice: the reference (as made) and the policy (perturbed)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("grpo-trl")
    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", *CHARS])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "reference")
    tokenizer.save_pretrained(root / "reference")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(root / "policy")
    return {"root": root, "tokenizer": tokenizer}


def _trl_side(weights, loss_config, completions, sampler_logprobs):
    """TRL's loss, gradient norm and advantages on the batch."""
    from trl import GRPOConfig, GRPOTrainer

    loss_type = loss_config.variant
    args = GRPOConfig(
        output_dir=str(weights["root"] / f"trl-{loss_type}"), per_device_train_batch_size=len(completions),
        num_generations=GROUP, max_completion_length=MAX_COMPLETION, beta=loss_config.kl_coef,
        epsilon=loss_config.epsilon, epsilon_high=loss_config.upper_epsilon, loss_type=loss_type,
        scale_rewards=loss_config.scale_rewards, temperature=1.0, report_to=[], use_cpu=True, logging_steps=1,
        use_bias_correction_kl=loss_config.unbiased_kl,
        bf16=False,  # TRL's default is bf16 autocast, on CPU too; both sides compute in float32 here
    )
    prompts = [str(i) for i in range(len(PROMPTS)) for _ in range(GROUP)]

    def rollout(prompt_texts, trainer):
        return {"prompt_ids": [PROMPTS[int(p)] for p in prompt_texts], "completion_ids": completions,
                "logprobs": sampler_logprobs}

    def reward(prompts, completions, **kwargs):
        return REWARDS

    # The policy, and (with beta > 0) TRL's reference loaded from the reference folder.
    policy = transformers.LlamaForCausalLM.from_pretrained(weights["root"] / "policy")
    policy.config._name_or_path = str(weights["root"] / "reference")
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=args, processing_class=weights["tokenizer"],
                          train_dataset=datasets.Dataset.from_dict({"prompt": prompts}), rollout_func=rollout)
    trainer.model.train()
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in prompts])
    old = torch.zeros_like(inputs["completion_mask"], dtype=torch.float32)
    for row, values in enumerate(sampler_logprobs):
        old[row, :len(values)] = torch.tensor(values)
    inputs["old_per_token_logps"] = old
    trainer.current_gradient_accumulation_steps = 1  # what its training loop sets for one batch per update
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    grad_norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in trainer.model.parameters() if p.grad is not None))
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    return float(loss), float(grad_norm), inputs["advantages"].numpy(), metrics


def _our_batch(completions, sampler_logprobs, advantages):
    width = max(len(p) for p in PROMPTS) + MAX_COMPLETION
    rows = len(completions)
    tokens = np.full((rows, width), PAD, np.int32)
    mask = np.zeros((rows, width), np.float32)
    old = np.zeros((rows, width), np.float32)
    adv = np.zeros((rows, width), np.float32)
    for row, completion in enumerate(completions):
        prompt = PROMPTS[row // GROUP]
        tokens[row, :len(prompt) + len(completion)] = prompt + completion
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))  # positions predicting the completion
        mask[row, span] = 1.0
        old[row, span] = sampler_logprobs[row]
        adv[row] = advantages[row]
    return DeviceBatch(jnp.asarray(tokens), jnp.asarray(mask), None, {SAMPLER_LOGPROBS: jnp.asarray(old),
                                                                     ADVANTAGES: jnp.asarray(adv)})


def _our_side(weights, loss_config, completions, sampler_logprobs):
    import equinox as eqx

    policy = import_from_hf(str(weights["root"] / "policy"))
    reference = import_from_hf(str(weights["root"] / "reference"))
    advantages = group_advantages(np.asarray(REWARDS), GROUP, loss_config.scale_rewards)
    batch = _our_batch(completions, sampler_logprobs, advantages)
    objective = GrpoObjective(loss_config, temperature=1.0, max_completion_length=MAX_COMPLETION)
    params, static = eqx.partition(policy, eqx.is_inexact_array)
    reference_params = eqx.partition(reference, eqx.is_inexact_array)[0]
    build = lambda p, frozen: eqx.combine(p, static)  # noqa: E731
    context = objective.precompute(build, params, FrozenArrays(reference=reference_params), batch)
    normaliser = objective.normaliser(batch)

    def value(p):
        return objective.loss(build(p, None), batch, context, normaliser, 1)

    (loss, sums), grads = jax.value_and_grad(value, has_aux=True)(params)
    return float(loss), float(optax.tree.norm(grads)), advantages, objective.metrics(sums, normaliser, 1)


def _sampler_logprobs(weights, completions, rng):
    """The policy's own log-probabilities of the completions, moved by up to +-0.4: another sampler's."""
    model = transformers.LlamaForCausalLM.from_pretrained(weights["root"] / "policy")
    out = []
    with torch.no_grad():
        for row, completion in enumerate(completions):
            prompt = PROMPTS[row // GROUP]
            logits = model(torch.tensor([prompt + completion])).logits[0].log_softmax(-1)
            own = [float(logits[len(prompt) - 1 + t, token]) for t, token in enumerate(completion)]
            out.append([value + float(rng.uniform(-0.4, 0.4)) for value in own])
    return out


@pytest.mark.parametrize(
    "loss_config",
    [grpo(kl_coef=0.1), dataclasses.replace(grpo(kl_coef=0.1), unbiased_kl=False), grpo(), dr_grpo(kl_coef=0.05), dapo()],
    ids=["grpo-kl", "grpo-kl-plain", "grpo", "dr_grpo-kl", "dapo"],
)
def test_loss_advantages_and_gradient_match_trl(weights, loss_config):
    rng = np.random.default_rng(0)
    completions = _completions(rng)
    sampler_logprobs = _sampler_logprobs(weights, completions, rng)
    trl_loss, trl_grad_norm, trl_advantages, trl_metrics = _trl_side(weights, loss_config, completions, sampler_logprobs)
    loss, grad_norm, advantages, metrics = _our_side(weights, loss_config, completions, sampler_logprobs)
    # float32 throughout: the advantages are a few operations apart. The loss sums ~40 per-token terms
    # of size ~1 (ratios times advantages) whose log-probabilities the two implementations compute in
    # different orders, each rounded to ~1e-7 relative: their sum agrees to ~40 * 1e-7 absolute, even
    # where terms of both signs cancel to a small loss. The gradient norm sums ~10k squares: 1e-5
    # relative. (TRL's default bfloat16 autocast, left on, moves the loss by ~5e-4.)
    np.testing.assert_allclose(advantages, trl_advantages, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(trl_loss, rel=0, abs=1e-5)
    assert grad_norm == pytest.approx(trl_grad_norm, rel=1e-5)
    assert float(metrics["policy/entropy"]) == pytest.approx(trl_metrics["entropy"], rel=1e-4)
    if loss_config.kl_coef > 0:
        assert float(metrics["policy/kl"]) == pytest.approx(trl_metrics["kl"], rel=1e-3, abs=1e-6)
    assert float(metrics["policy/clip_low"]) == pytest.approx(trl_metrics["clip_ratio/low_mean"], abs=1e-6)
    assert float(metrics["policy/clip_high"]) == pytest.approx(trl_metrics["clip_ratio/high_mean"], abs=1e-6)
    # The batch is not degenerate: some ratios are clipped on each side somewhere in the parametrisation.
    assert trl_metrics["clip_ratio/region_mean"] > 0


def test_failed_rewards_are_left_out_of_their_group_and_get_no_advantage():
    rewards = np.asarray([1.0, np.nan, 0.0, 0.0, np.nan, np.nan, np.nan, np.nan])
    advantages = group_advantages(rewards, 4, "group")
    valid = np.asarray([1.0, 0.0, 0.0])
    expected = (valid - valid.mean()) / (valid.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(advantages[[0, 2, 3]], expected, rtol=1e-6)
    assert advantages[1] == 0 and not advantages[4:].any()
    assert dataclasses.replace(grpo(), scale_rewards="none").scale_rewards == "none"

