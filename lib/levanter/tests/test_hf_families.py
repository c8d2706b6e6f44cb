"""The Llama-like Hugging Face families (Llama 3.x, Mistral, Qwen2, Qwen3, Gemma) and Mixtral,
checked against transformers' own models (torch, CPU, float32): imports give the same logits,
and our exports load in transformers with the same logits again."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from haliax.nn import RopeScaling  # noqa: E402
from levanter.compat.hf_checkpoints import HfFormatError, export_llama_to_hf, export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_family import UnsupportedConfigError  # noqa: E402
from levanter.compat.hf_gemma import gemma_config_from_hf  # noqa: E402
from levanter.compat.hf_llama import llama_config_from_hf  # noqa: E402
from levanter.inference.sampling import decode, init_cache  # noqa: E402
from levanter.models import LlamaConfig  # noqa: E402
from levanter.models.llama import LlamaLMHeadModel  # noqa: E402
from levanter.models.moe import MoeLMHeadModel  # noqa: E402

VOCAB = 64
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
# Wavelengths of a 16-wide head at theta 10000 run from 6 to 20,000 positions: with an original
# context of 64, llama3 scaling keeps the first, blends the next two and divides the rest.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

# (transformers config class, its arguments, the model_type our export should write back)
CASES = {
    "llama3.1": ("LlamaConfig", dict(SHAPE, head_dim=16, rope_parameters=LLAMA3_ROPE, tie_word_embeddings=True,
                                     attention_bias=True, mlp_bias=True), "llama"),
    "llama-linear-rope": ("LlamaConfig", dict(SHAPE, rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 4.0}), "llama"),
    "mistral-window": ("MistralConfig", dict(SHAPE, sliding_window=4, head_dim=16), "mistral"),
    "mistral-no-window": ("MistralConfig", dict(SHAPE, sliding_window=None), "llama"),
    "qwen2": ("Qwen2Config", dict(SHAPE, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "qwen2"),
    "qwen3": ("Qwen3Config", dict(SHAPE, head_dim=16), "qwen3"),
    "qwen3-bias": ("Qwen3Config", dict(SHAPE, head_dim=8, attention_bias=True, tie_word_embeddings=True), "qwen3"),
    "gemma": ("GemmaConfig", dict(SHAPE, head_dim=16, num_key_value_heads=1), "gemma"),
    "mixtral": ("MixtralConfig", dict(SHAPE, num_local_experts=4, num_experts_per_tok=2, sliding_window=None), "mixtral"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_import_and_export_match_transformers_logits(case, tmp_path, hf_comparison, assert_same_logits_as_transformers):
    reference = hf_comparison.random_model(*CASES[case][:2])
    reference.save_pretrained(tmp_path / "theirs")
    ours = import_from_hf(tmp_path / "theirs", use_scan=case in ("qwen2", "gemma"))
    assert isinstance(ours, MoeLMHeadModel if case == "mixtral" else LlamaLMHeadModel)
    assert_same_logits_as_transformers(ours, reference)

    export_to_hf(ours, tmp_path / "ours")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["model_type"] == CASES[case][2]
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval()
    assert_same_logits_as_transformers(ours, again)
    assert import_from_hf(tmp_path / "ours").config == dataclasses.replace(ours.config, use_scan=False)


def test_imported_options_are_the_ones_the_config_names(tmp_path, hf_comparison):
    hf_comparison.random_model(*CASES["llama3.1"][:2]).save_pretrained(tmp_path)
    config = import_from_hf(tmp_path).config
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 64)
    assert config.head_dim == 16 and config.qkv_bias and config.o_bias and config.mlp_bias and config.tie_word_embeddings
    hf_comparison.random_model(*CASES["qwen3"][:2]).save_pretrained(tmp_path / "q")
    config = import_from_hf(tmp_path / "q").config
    assert config.qk_norm and not config.qkv_bias and config.head_dim == 16


def test_transformers_4_config_spellings_read_the_same():
    # Published Llama 3.1 and Gemma configs predate rope_parameters: rope_scaling + rope_theta, "gelu".
    llama31 = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
               "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 1024, "rope_theta": 500000.0,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 256, "rope_type": "llama3"}}
    config, _ = llama_config_from_hf(llama31)
    assert config.rope_theta == 500000.0 and config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 256)
    gemma = {**llama31, "model_type": "gemma", "rope_scaling": None, "head_dim": 32, "hidden_act": "gelu"}
    config, _ = gemma_config_from_hf(gemma)
    assert config.activation == "gelu_tanh" and config.head_dim == 32 and config.tie_word_embeddings and config.scale_embeddings


def test_cached_decoding_matches_the_forward_pass_with_every_option():
    config = LlamaConfig(
        hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64, head_dim_override=16,
        rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 32), qkv_bias=True, o_bias=True, mlp_bias=True, qk_norm=True,
        sliding_window=5, activation="gelu_tanh", scale_embeddings=True,
    )
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    # Biases start at zero and norms at one; perturb every array so each option changes the result.
    leaves, treedef = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    model = jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    assert sum(x.size for x in leaves) == config.num_parameters(VOCAB)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 12), 0, VOCAB, dtype=jnp.int32)
    prefix_logits, cache = decode(model, tokens[:, :7], init_cache(model, 2, 12), 0)
    rest_logits, _ = decode(model, tokens[:, 7:], cache, 7)
    full = model(tokens)
    np.testing.assert_allclose(jnp.concatenate([prefix_logits, rest_logits], axis=1), full, atol=1e-5)


def test_sliding_window_limits_what_each_position_sees():
    config = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=1, max_seq_len=32, sliding_window=4)
    model = config.build(VOCAB, key=jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 12), 0, VOCAB, dtype=jnp.int32)
    changed = tokens.at[:, 2].set((tokens[:, 2] + 1) % VOCAB)
    before, after = model(tokens), model(changed)
    # Position 2 is seen by positions 2..5 only (a window of 4 counts the position itself).
    assert not np.allclose(before[:, 2:6], after[:, 2:6], atol=1e-5)
    np.testing.assert_allclose(before[:, 6:], after[:, 6:], atol=1e-6)


def _write_config(tmp_path, **fields):
    hf = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
          "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 64, **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_parameters.rope_type='yarn'"),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type='dynamic'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks low_freq_factor, high_freq_factor"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"hidden_act": "relu"}, "hidden_act='relu'"),
        ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=True"),
        ({"model_type": "qwen3", "layer_types": ["sliding_attention"]}, "layer_types=['sliding_attention']"),
        ({"model_type": "gemma", "use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ({"model_type": "gemma3"}, "model_type='gemma3': Gemma 3 with a vision tower"),
        ({"model_type": "mixtral", "head_dim": 16}, "head_dim=16"),
        ({"model_type": "mixtral", "rope_parameters": LLAMA3_ROPE}, "rope_parameters.rope_type='llama3'"),
        ({"model_type": "phi3"}, "'phi3' model; supported model_types: llama, mistral, qwen2, qwen3, gemma, mixtral"),
    ],
)
def test_what_cannot_be_expressed_is_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message.replace("[", r"\[").replace("(", r"\(")) as refused:
        import_from_hf(_write_config(tmp_path, **fields))
    assert isinstance(refused.value, HfFormatError)


def test_export_refuses_configs_no_family_can_express(tmp_path):
    both = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, sliding_window=4, qkv_bias=True)
    with pytest.raises(UnsupportedConfigError, match="mistral: it has no place for qkv_bias"):
        export_to_hf(both.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path)
    qwen3 = dataclasses.replace(both, sliding_window=None, qkv_bias=False, qk_norm=True)
    with pytest.raises(UnsupportedConfigError, match="llama checkpoint cannot express .* qk_norm"):
        export_llama_to_hf(qwen3.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path)


# What LlamaConfig.to_dict() gave before the family options existed; it hashes into step
# identities (the tutorial's training step is 72472b56), so a default config must still give it.
LLAMA_NANO_RECORD = {
    "attention": "auto", "hidden_dim": 64, "initializer_range": 0.02, "intermediate_dim": 256, "max_seq_len": 2048,
    "norm_eps": 1e-05, "num_heads": 2, "num_kv_heads": 2, "num_layers": 2, "remat": "none", "rope_theta": 10000.0,
    "tie_word_embeddings": False, "use_scan": False,
}
LLAMA_NANO = LlamaConfig(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=2, num_kv_heads=2)


def test_default_llama_config_records_exactly_as_before_the_family_options():
    assert LLAMA_NANO.to_dict() == LLAMA_NANO_RECORD
    scaled = dataclasses.replace(LLAMA_NANO, rope_scaling=RopeScaling("linear", 2.0), qk_norm=True)
    record = scaled.to_dict()
    assert record["qk_norm"] is True and record["rope_scaling"]["factor"] == 2.0 and "qkv_bias" not in record
    assert LlamaConfig(**json.loads(json.dumps(record))) == scaled


def test_default_llama_config_keeps_its_step_identity():
    identity = pytest.importorskip("marin.execution.hashing.identity")
    assert identity.canonicalize(LLAMA_NANO) == {"__class__": "LlamaConfig", **LLAMA_NANO_RECORD}
    with_window = identity.canonicalize(dataclasses.replace(LLAMA_NANO, sliding_window=1024))
    assert with_window["sliding_window"] == 1024
