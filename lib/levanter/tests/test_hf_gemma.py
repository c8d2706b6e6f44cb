"""Gemma 2 and Gemma 3 (text) checkpoints, checked against transformers' own models (torch, CPU,
float32): the import gives the same logits and the same greedy continuation, our export loads in
transformers with the same logits again, and what we cannot express is refused by name."""

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_family import UnsupportedConfigError  # noqa: E402
from levanter.compat.hf_gemma import gemma2_config_from_hf, gemma3_config_from_hf  # noqa: E402
from levanter.models import ConfigError, LlamaConfig  # noqa: E402

VOCAB = 64
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=4, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Small caps and a query scale other than head_dim, so that each changes the logits (the random
# model's attention scores reach about +-3 and its logits about +-6).
GEMMA2 = dict(SHAPE, num_hidden_layers=2, attn_logit_softcapping=1.5, final_logit_softcapping=3.0, query_pre_attn_scalar=24)
# Three layers, sliding, sliding, full; linearly rescaled RoPE in the full layer only, and a local
# base of its own in the sliding ones.
GEMMA3 = dict(SHAPE, num_hidden_layers=3, sliding_window_pattern=3, query_pre_attn_scalar=12, rope_parameters={
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50_000.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
})
CASES = {"gemma2": ("Gemma2Config", GEMMA2), "gemma3_text": ("Gemma3TextConfig", GEMMA3)}
TOKENS = np.random.RandomState(0).randint(3, VOCAB, size=(2, 11)).astype(np.int32)

# Tolerance on logits, float32: each logit is the end of a chain of reductions (per layer the q/k/v
# and output projections over 32 and 64 terms, scores over 16, attention over up to 11 positions,
# the MLP over 32 and 48, four norms over 32; then the output layer over 32). Rounding adds about
# eps * (terms) relative error per reduction, some 300 * eps per layer for three layers and the
# head, on logits of magnitude up to ~6: 6 * 1000 * 1.2e-7 = 7e-4 at worst; measured ~1e-6.
LOGIT_TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory):
    """A random transformers model of the case, saved: (case, model, folder). Norm scales are drawn
    around zero (Gemma multiplies by 1 + w) so a misplaced norm shows."""
    case = request.param
    config_class, kwargs = CASES[case]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**kwargs)).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 0.5 if "norm" in name else 0.15
            param.copy_(scale * torch.randn(param.shape, generator=generator))
    folder = tmp_path_factory.mktemp(case)
    model.save_pretrained(folder)
    return case, model, folder


def test_import_gives_transformers_logits_with_every_option_in_use(checkpoint, hf_comparison):
    case, reference, folder = checkpoint
    ours = import_from_hf(folder)
    config = ours.config
    assert config.norm_placement == "both" and config.scale_embeddings and config.sliding_window == 4
    if case == "gemma2":
        assert config.layer_types == ("sliding_attention", "full_attention")
        assert (config.attention_logit_softcap, config.final_logit_softcap, config.attention_scale_dim) == (1.5, 3.0, 24)
    else:
        assert config.layer_types == ("sliding_attention", "sliding_attention", "full_attention") and config.qk_norm
        assert (config.rope_theta, config.rope_scaling.factor, config.sliding_rope_theta) == (50_000.0, 4.0, 500.0)
    expected = hf_comparison.their_logits(reference, TOKENS)
    assert np.max(np.abs(hf_comparison.our_logits(ours, TOKENS) - expected)) < LOGIT_TOLERANCE
    # Each option is in play: the same weights without it give logits far from transformers'.
    options = {"attention_scale_dim": None, "sliding_window": 64}  # a window longer than the tokens: none
    options.update({"attention_logit_softcap": None, "final_logit_softcap": None} if case == "gemma2" else {"sliding_rope_theta": None})
    for name, value in options.items():
        assert np.max(np.abs(np.asarray(_with_option(ours, name, value)(TOKENS)) - expected)) > 10 * LOGIT_TOLERANCE, name


def _with_option(model, name, value):
    """``model``'s weights under its config with one option changed (static fields rebuilt)."""
    config = dataclasses.replace(model.config, **{name: value})
    fresh = config.build(model.vocab_size, key=jax.random.PRNGKey(0))
    return jax.tree.unflatten(jax.tree.structure(fresh), jax.tree.leaves(model))


def test_greedy_decoding_equals_transformers_generate(checkpoint, hf_comparison):
    _, reference, folder = checkpoint
    hf_comparison.assert_same_greedy_decoding(import_from_hf(folder), reference, TOKENS[:, :5])


def test_export_loads_in_transformers_with_the_same_logits(checkpoint, tmp_path, hf_comparison):
    case, _, folder = checkpoint
    ours = import_from_hf(folder)
    export_to_hf(ours, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == case
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert np.max(np.abs(hf_comparison.our_logits(ours, TOKENS) - hf_comparison.their_logits(again, TOKENS))) < LOGIT_TOLERANCE
    assert import_from_hf(tmp_path).config == ours.config


def test_published_config_spellings_read_as_transformers_reads_them():
    # Gemma 2 9B's and Gemma 3 1B's config.json, shortened: no layer_types, transformers 4's RoPE fields.
    gemma2 = {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 4,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
              "max_position_embeddings": 8192, "rope_theta": 10000.0, "hidden_act": "gelu_pytorch_tanh",
              "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "sliding_window": 4096,
              "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
    config, _ = gemma2_config_from_hf(gemma2)
    assert config.layer_types == ("sliding_attention", "full_attention") * 2 and config.attention_scale_dim is None
    assert config.activation == "gelu_tanh" and config.tie_word_embeddings and config.head_dim == 256
    gemma3 = {"model_type": "gemma3_text", "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 7,
              "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
              "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512, "sliding_window_pattern": 6,
              "query_pre_attn_scalar": 256, "final_logit_softcapping": None, "attn_logit_softcapping": None}
    config, _ = gemma3_config_from_hf(gemma3)
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention", "sliding_attention")
    assert (config.rope_theta, config.rope_scaling.factor, config.sliding_rope_theta) == (1e6, 8.0, 10000.0)
    assert config.attention_logit_softcap is None and config.final_logit_softcap is None and config.qk_norm


def _write_config(tmp_path, **fields):
    (tmp_path / "config.json").write_text(json.dumps({**GEMMA3, "model_type": "gemma3_text", **fields}))
    return tmp_path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}},
         "rope_parameters.sliding_attention.rope_type='linear'"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}}}, "rope_type='yarn'"),
        ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]}, "layer_types="),
        ({"model_type": "gemma3"}, "model_type='gemma3': Gemma 3 with a vision tower"),
        ({"model_type": "gemma2", "rope_parameters": None, "hidden_activation": "relu"}, "hidden_activation='relu'"),
    ],
)
def test_what_cannot_be_expressed_is_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        import_from_hf(_write_config(tmp_path, **fields))


def test_mixed_layer_patterns_are_not_stacked(checkpoint):
    _, _, folder = checkpoint
    with pytest.raises(ConfigError, match="use_scan=True cannot stack layers of different attention kinds"):
        import_from_hf(folder, use_scan=True)


def test_soft_capping_refuses_a_kernel_that_cannot_compute_it():
    with pytest.raises(ConfigError, match="attention='cudnn' cannot soft-cap attention scores"):
        LlamaConfig(hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2, attention="cudnn",
                    attention_logit_softcap=50.0)


def test_other_families_refuse_the_gemma_options_on_export(tmp_path):
    capped = LlamaConfig(hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2, final_logit_softcap=30.0)
    with pytest.raises(UnsupportedConfigError, match="llama: it has no place for final_logit_softcap"):
        export_to_hf(capped.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path)


def test_training_starts_from_the_checkpoint_and_exports_the_same_family(checkpoint, tmp_path):
    from levanter.compat.hf_format import read_tensors
    from levanter.main.train_lm import InitialWeights, TrainLmConfig, train_lm
    from levanter.optim import AdamConfig
    from levanter.trainer import TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    case, _, folder = checkpoint
    learning_rate, steps = 1e-3, 2
    config = TrainLmConfig(
        model=import_from_hf(folder).config,
        optimizer=AdamConfig(learning_rate=learning_rate),
        trainer=TrainerConfig(num_train_steps=steps, batch_size=8, minutes_per_checkpoint=None),
        vocab_size=VOCAB,
        output_path=str(tmp_path),
        initialize_from=InitialWeights(str(folder), "hf"),
    )
    result = train_lm(config, InMemoryWindows(np.tile(np.arange(VOCAB), 8), seq_len=16, batch_size=8, seed=0))
    assert np.isfinite(result.final_train_loss)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == case
    before, after = read_tensors(str(folder)), read_tensors(result.hf_path)
    assert sorted(before) == sorted(after)
    # An Adam step moves each weight by at most about the learning rate (|m_hat| <= sqrt(v_hat)), so
    # weights that started from the checkpoint stay within steps * lr of it (twice that for slack);
    # a random start would differ by about the 0.15 the reference weights were drawn with.
    moved = max(float(np.max(np.abs(after[name] - before[name]))) for name in before)
    assert 0 < moved < 2 * steps * learning_rate


def test_cached_decoding_gives_the_forward_logits(checkpoint, hf_comparison):
    from levanter.inference.sampling import decode, init_cache

    _, _, folder = checkpoint
    ours = import_from_hf(folder)
    prefix_logits, cache = decode(ours, TOKENS[:, :7], init_cache(ours, 2, 11), 0)
    rest_logits, _ = decode(ours, TOKENS[:, 7:], cache, 7)
    # Same arithmetic as the forward pass but for the order of the attention sums: float32 rounding.
    np.testing.assert_allclose(np.concatenate([prefix_logits, rest_logits], axis=1), hf_comparison.our_logits(ours, TOKENS), atol=1e-5)


def test_fused_loss_soft_caps_logits_as_the_forward_pass_does():
    from levanter.models.lm import soft_cap
    from levanter.models.loss import fused_next_token_loss, next_token_loss

    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    hidden, unembedding = jax.random.normal(keys[0], (2, 9, 8)), jax.random.normal(keys[1], (8, VOCAB))
    tokens, mask = jax.numpy.asarray(TOKENS[:, :9]), jax.numpy.ones((2, 9))

    def plain(h, w):
        return next_token_loss(soft_cap(h @ w, 3.0), tokens, mask, z_loss_weight=0.5)

    def fused(h, w):
        return fused_next_token_loss(h, w, tokens, mask, z_loss_weight=0.5, block_size=4, logit_softcap=3.0)

    assert float(jax.numpy.max(jax.numpy.abs(hidden @ unembedding))) > 6  # the cap of 3 binds
    expected = jax.value_and_grad(lambda h, w: sum(plain(h, w)[::2]), argnums=(0, 1))(hidden, unembedding)
    got = jax.value_and_grad(lambda h, w: sum(fused(h, w)[::2]), argnums=(0, 1))(hidden, unembedding)
    # float32 sums over 18 tokens of log-sum-exps over 64 logits: a few ulps of ~100.
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_experiment_sizes_are_the_published_architectures():
    from experiments.gemma import GEMMA_SIZES, gemma2_2b, gemma2_nano, gemma3_nano

    counts = {name: config.num_parameters(vocab) for name, (config, vocab) in GEMMA_SIZES.items()}
    assert counts == {"gemma2_2b": 2_614_341_888, "gemma2_9b": 9_241_705_984, "gemma3_1b": 999_885_952}
    # transformers' Gemma2Config defaults are the 2B model.
    config, vocab = gemma2_config_from_hf(transformers.Gemma2Config().to_dict())
    assert dataclasses.replace(config, initializer_range=gemma2_2b.initializer_range) == gemma2_2b and vocab == 256_000
    for nano in (gemma2_nano, gemma3_nano):  # CPU-sized, as llama_nano; recorded and read back whole
        assert nano.max_seq_len >= 2048 and nano.num_parameters(4063) < 1_000_000
        assert LlamaConfig(**json.loads(json.dumps(nano.to_dict()))) == nano
