"""MoE <-> Hugging Face MixtralForCausalLM, checked against transformers' own model (torch, CPU)."""

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import save_file  # noqa: E402

from levanter.compat.hf_checkpoints import HfFormatError, export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_mixtral import import_moe_from_hf  # noqa: E402
from levanter.models import LlamaConfig  # noqa: E402
from levanter.models.llama import LlamaLMHeadModel  # noqa: E402
from levanter.models.moe import MoeConfig, MoeLMHeadModel  # noqa: E402

VOCAB = 64
TINY_MOE = MoeConfig(
    hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, num_kv_heads=2, num_experts=4,
    num_experts_per_token=2, max_seq_len=64, rope_theta=5000.0, router_aux_loss_coef=0.02,
)


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_as_mixtral_with_matching_logits(tmp_path, assert_same_logits_as_transformers, tied):
    config = dataclasses.replace(TINY_MOE, tie_word_embeddings=tied, use_scan=tied)
    model = config.build(VOCAB, key=jax.random.PRNGKey(3))
    # Random routers at init send every token almost uniformly; sharpen them so top-2 choices differ
    # clearly between tokens and a routing mismatch would show in the logits.
    model = jax.tree_util.tree_map_with_path(lambda path, x: x * 20.0 if "router" in jax.tree_util.keystr(path) else x, model)
    export_to_hf(model, tmp_path, max_shard_bytes=30_000 if tied else 5 * 2**30)
    assert (tmp_path / "model.safetensors.index.json").exists() == tied
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["model_type"] == "mixtral" and hf_config["num_local_experts"] == 4
    assert hf_config["num_experts_per_tok"] == 2 and hf_config["router_aux_loss_coef"] == 0.02

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf_model).__name__ == "MixtralForCausalLM"
    assert_same_logits_as_transformers(model, hf_model)

    again = import_from_hf(tmp_path, use_scan=config.use_scan)
    assert isinstance(again, MoeLMHeadModel) and again.config == model.config
    for ours, back in zip(jax.tree.leaves(model), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(ours, back)


@pytest.fixture(scope="module")
def hf_mixtral():
    hf_config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(hf_config).eval()
    with torch.no_grad():
        # transformers initialises routers near zero (std 0.02): scale them so routing is decisive.
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(20.0)
    return model


def test_transformers_mixtral_imports_with_matching_logits(tmp_path, assert_same_logits_as_transformers, hf_mixtral):
    hf_mixtral.save_pretrained(tmp_path)
    model = import_from_hf(tmp_path, use_scan=True)
    assert isinstance(model, MoeLMHeadModel)
    assert model.config.num_experts == 4 and model.config.rope_theta == 20000.0 and model.config.norm_eps == 1e-6
    assert_same_logits_as_transformers(model, hf_mixtral)


def test_fused_expert_tensors_import_like_per_expert_ones(tmp_path, assert_same_logits_as_transformers, hf_mixtral):
    # The in-memory state dict of recent transformers fuses experts (mlp.experts.gate_up_proj).
    hf_mixtral.config.save_pretrained(tmp_path)
    state = {name: t.detach().numpy().copy() for name, t in hf_mixtral.state_dict().items()}
    assert any(name.endswith("mlp.experts.gate_up_proj") for name in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    model = import_moe_from_hf(tmp_path)
    assert_same_logits_as_transformers(model, hf_mixtral)


def test_generic_import_dispatches_on_model_type(tmp_path):
    llama = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=16)
    export_to_hf(llama.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path)
    assert isinstance(import_from_hf(tmp_path), LlamaLMHeadModel)
    with pytest.raises(TypeError, match="No Hugging Face export for str"):
        export_to_hf("not a model", tmp_path)


def test_unsupported_mixtral_checkpoints_fail_clearly(tmp_path):
    base = {
        "model_type": "mixtral", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 4096, "num_local_experts": 4,
    }
    (tmp_path / "config.json").write_text(json.dumps({**base, "sliding_window": 1024}))
    with pytest.raises(HfFormatError, match="sliding_window=1024"):
        import_from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**base, "model_type": "deepseek_v3"}))
    with pytest.raises(HfFormatError, match="deepseek_v3"):
        import_from_hf(tmp_path)
