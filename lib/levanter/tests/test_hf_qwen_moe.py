"""Qwen3-MoE and Qwen2-MoE (``Qwen3MoeForCausalLM``, ``Qwen2MoeForCausalLM``) <-> our
``MoeLMHeadModel``, checked against transformers' own models (torch, CPU, float32): the import gives
their logits and greedy continuations, our export loads back with the same logits, what we cannot
express is refused by name, and an import starts a training run."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import save_file  # noqa: E402

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_family import UnsupportedConfigError  # noqa: E402
from levanter.models import next_token_loss  # noqa: E402
from levanter.models.moe import MoeLMHeadModel  # noqa: E402

VOCAB = 64
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
             max_position_embeddings=64, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
# case -> (transformers config class, its arguments)
CASES = {
    # Qwen3-30B-A3B's settings: top-k probabilities renormalised, no biases, a head size of its own.
    "qwen3-renormalised": ("Qwen3MoeConfig", dict(SHAPE, head_dim=16, norm_topk_prob=True)),
    # transformers' default: raw top-k probabilities; with attention biases and tied embeddings.
    "qwen3-raw-top-k-bias-tied": ("Qwen3MoeConfig", dict(SHAPE, head_dim=16, norm_topk_prob=False, attention_bias=True,
                                                         tie_word_embeddings=True)),
    # Qwen1.5-MoE-A2.7B's settings: q/k/v biases, a gated shared expert, raw top-k probabilities.
    "qwen2": ("Qwen2MoeConfig", dict(SHAPE, shared_expert_intermediate_size=20, norm_topk_prob=False)),
}
MODEL_TYPE = {"Qwen3MoeConfig": "qwen3_moe", "Qwen2MoeConfig": "qwen2_moe"}

# Tolerance from float32 arithmetic (eps = 1.2e-7). Both sides compute the same operations on the
# same float32 weights, in another order: each projection is a dot product of at most 64 terms
# (hidden 32, heads x head_dim 64, experts 24 wide) whose rounding error is ~sqrt(64) * eps relative
# to the sum of |terms|; with weights ~0.15 and activations of order 1 after each RMSNorm, that is
# ~1e-6 per projection, and two layers of six chained projections plus the output layer compound it
# to a few 1e-6 on logits of magnitude ~3. 1e-4 leaves a 10x margin and is still far below what a
# misplaced tensor or a different routing choice moves a logit by (> 1e-2). Routing agrees because the
# routers are decisive (std 2): the top-k choices are nowhere near ties at 1e-6.
LOGITS_ATOL = 1e-4
TOKENS = np.random.RandomState(0).randint(0, VOCAB, size=(2, 11)).astype(np.int32)


@pytest.fixture(scope="module", params=list(CASES))
def imported(request, tmp_path_factory, hf_comparison):
    """(case, transformers model with every parameter random, its save_pretrained folder, our import of that folder)."""
    reference, folder = hf_comparison.random_model(*CASES[request.param]), tmp_path_factory.mktemp(request.param) / "theirs"
    return request.param, reference, folder, hf_comparison.saved_and_imported(reference, folder, use_scan=request.param == "qwen3-renormalised")


def test_import_gives_transformers_logits(imported, hf_comparison):
    case, reference, _, ours = imported
    assert isinstance(ours, MoeLMHeadModel)
    config, (config_class, kwargs) = ours.config, CASES[case]
    assert config.intermediate_dim == 24 and config.num_experts == 4 and config.rope_theta == 1e6
    assert config.renormalize_top_k == kwargs["norm_topk_prob"]
    if config_class == "Qwen3MoeConfig":
        assert config.qk_norm and config.head_dim == 16 and config.shared_expert_dim == 0
        assert config.qkv_bias == config.o_bias == kwargs.get("attention_bias", False)
    else:
        assert not config.qk_norm and config.qkv_bias and not config.o_bias and config.shared_expert_dim == 20
    np.testing.assert_allclose(hf_comparison.our_logits(ours, TOKENS), hf_comparison.their_logits(reference, TOKENS), atol=LOGITS_ATOL)


def test_export_loads_back_in_transformers_with_the_same_logits(imported, tmp_path, hf_comparison):
    case, _, _, ours = imported
    export_to_hf(ours, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == MODEL_TYPE[CASES[case][0]]
    assert written["num_experts"] == 4 and written["moe_intermediate_size"] == 24
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == type(imported[1]).__name__
    np.testing.assert_allclose(hf_comparison.their_logits(again, TOKENS), hf_comparison.our_logits(ours, TOKENS), atol=LOGITS_ATOL)
    back = import_from_hf(tmp_path)
    assert back.config == dataclasses.replace(ours.config, use_scan=False)


def test_greedy_decoding_matches_transformers_generate(imported, hf_comparison):
    _, reference, _, ours = imported
    hf_comparison.assert_same_greedy_decoding(ours, reference, TOKENS[:, :5])


def test_fused_expert_tensors_import_like_per_expert_ones(imported, tmp_path):
    # transformers keeps the experts fused in memory (mlp.experts.gate_up_proj [E, 2I, H]).
    _, reference, folder, _ = imported
    reference.config.save_pretrained(tmp_path)
    state = {name: t.detach().numpy().copy() for name, t in reference.state_dict().items()}
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    for a, b in zip(jax.tree.leaves(import_from_hf(tmp_path)), jax.tree.leaves(import_from_hf(folder)), strict=True):
        np.testing.assert_array_equal(a, b)


def _write_config(tmp_path, **fields):
    hf = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 48, "moe_intermediate_size": 16,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 64,
          "num_experts": 4, "num_experts_per_tok": 2, **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mlp_only_layers": [1]}, "mlp_only_layers=[1]"),
        ({"decoder_sparse_step": 2}, "decoder_sparse_step=2"),
        ({"shared_expert_intermediate_size": 64}, "shared_expert_intermediate_size=64"),
        ({"model_type": "qwen2_moe", "mlp_only_layers": [0]}, "mlp_only_layers=[0]"),
        ({"model_type": "qwen2_moe", "shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size=0"),
        ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=True"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}}, "rope_parameters.rope_type='yarn'"),
        ({"num_experts": 0}, "num_experts=0"),
    ],
)
def test_what_cannot_be_expressed_is_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message.replace("[", r"\[")):
        import_from_hf(_write_config(tmp_path, **fields))


def test_mixtral_export_refuses_the_qwen_options(imported, tmp_path):
    from levanter.compat.hf_mixtral import export_moe_to_hf

    case, _, _, ours = imported
    option = "qk_norm" if case.startswith("qwen3") else "qkv_bias, .*shared_expert_dim"
    with pytest.raises(UnsupportedConfigError, match=f"mixtral checkpoint cannot express .* {option}"):
        export_moe_to_hf(ours, tmp_path)


def test_training_starts_from_the_imported_weights(imported, tmp_path, hf_comparison):
    from levanter.main.train_lm import InitialWeights, TrainLmConfig, train_lm
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    case, reference, folder, ours = imported
    if case == "qwen3-raw-top-k-bias-tied":
        pytest.skip("one training run per family")
    source = InMemoryWindows(np.tile(np.arange(VOCAB), 32), seq_len=16, batch_size=8, seed=0)
    config = TrainLmConfig(model=ours.config, optimizer=AdamConfig(learning_rate=1e-2), vocab_size=VOCAB,
                           trainer=TrainerConfig(num_train_steps=2, batch_size=8, log_every=1, mesh=MeshConfig(data=1)),
                           output_path=str(tmp_path / "run"), initialize_from=InitialWeights(str(folder), "hf"))
    result = train_lm(config, source)
    # The first step's loss is the imported model's on the first batch: training started from its weights.
    first = jnp.asarray(source.batch_at(0).tokens)
    sums = next_token_loss(hf_comparison.our_logits(ours, first), first, jnp.ones(first.shape))
    first_loss = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    assert first_loss == pytest.approx(float(sums.loss_sum / sums.weight_sum), rel=1e-5)
    exported = transformers.AutoModelForCausalLM.from_pretrained(result.hf_path)
    assert type(exported).__name__ == type(reference).__name__


def test_a_shared_expert_counts_and_trains_like_the_rest():
    from levanter.models.moe import MoeConfig

    config = MoeConfig(hidden_dim=16, intermediate_dim=24, num_layers=2, num_heads=2, num_kv_heads=1, num_experts=4,
                       num_experts_per_token=2, max_seq_len=32, shared_expert_dim=8)
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    assert sum(x.size for x in jax.tree.leaves(model)) == config.num_parameters(VOCAB)
    # Active parameters: the shared expert is used by every token, so it is never among the inactive.
    plain = dataclasses.replace(config, shared_expert_dim=0)
    shared_per_layer = 3 * 16 * 8 + 16
    assert config.num_active_parameters(VOCAB) == plain.num_active_parameters(VOCAB) + 2 * shared_per_layer
    assert "shared_expert_dim" not in plain.to_dict() and config.to_dict()["shared_expert_dim"] == 8
    tokens = jnp.asarray(TOKENS)
    grads = jax.grad(lambda m: next_token_loss(m(tokens), tokens, jnp.ones(tokens.shape)).loss_sum)(model)
    assert float(jnp.abs(grads.layers[0].moe.shared_expert_gate.weight).sum()) > 0
    assert float(jnp.abs(grads.layers[1].moe.shared_expert.down_proj.weight).sum()) > 0


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        # A billion experts claimed over a file of four, under both of transformers' spellings.
        ({"num_experts": 10**9, "num_local_experts": 10**9}, r"describes 1000000000 experts per layer, but the tensors in "
                                                             r".* hold 4 \(experts 0 to 3; the last: model\.layers\.\d+\.mlp\.experts\.3\."),
        ({"num_experts": 2, "num_local_experts": 2}, "describes 2 experts per layer, but the tensors in .* hold 4"),
        # The two spellings disagreeing: which one is meant cannot be told.
        ({"num_experts": 10**9, "num_local_experts": 4}, "num_experts=1000000000 and num_local_experts=4, two names of one setting"),
        ({"num_hidden_layers": 3}, r"describes 3 layers, but the tensors in .* hold 2 \(layers 0 to 1"),
    ],
    ids=["a-billion-experts", "fewer-experts", "two-spellings", "more-layers"],
)
def test_a_config_the_tensors_contradict_is_refused_naming_both(tmp_path, edits, message, hf_comparison):
    from levanter.compat.hf_format import CorruptCheckpointError

    hf_comparison.random_model(*CASES["qwen3-renormalised"]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **edits}))
    with pytest.raises(CorruptCheckpointError, match=message):
        import_from_hf(tmp_path)
