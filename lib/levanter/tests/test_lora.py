"""LoRA adapters on a tiny Llama: exactness at init and after merging, training only the adapters,
and the exported adapter folder checked against PEFT's own LoRA on transformers' Llama (torch, CPU)."""

import json

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file

import haliax
from levanter.lora import (
    LoraConfig,
    LoraError,
    LoraLinear,
    apply_lora,
    count_trainable_parameters,
    export_merged_to_hf,
    export_peft_adapter,
    has_lora,
    lora_trainable_filter,
    merge_lora,
    with_lora_dropout,
)
from levanter.models import LlamaConfig, LlamaLMHeadModel

VOCAB = 64
ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKENS = np.random.RandomState(0).randint(0, VOCAB, size=(2, 11)).astype(np.int32)


def tiny_llama(use_scan: bool) -> LlamaLMHeadModel:
    # Grouped-query attention, so k/v projections are narrower than q/o and in != out.
    config = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64,
                         use_scan=use_scan)
    return config.build(VOCAB, key=jax.random.PRNGKey(0))


def with_random_b(model, key, std=0.1):
    """Adapters whose B is no longer zero, so they change what the model computes."""
    counter = iter(range(1_000))

    def fill(node):
        if not isinstance(node, LoraLinear):
            return node
        b = std * jax.random.normal(jax.random.fold_in(key, next(counter)), node.lora_b.shape)
        return eqx.tree_at(lambda m: m.lora_b, node, b)

    return jax.tree.map(fill, model, is_leaf=lambda x: isinstance(x, LoraLinear))


@eqx.filter_jit
def logits(model, tokens):
    return model(tokens)


@pytest.mark.parametrize("use_scan", [False, True])
def test_fresh_adapters_leave_logits_exactly_unchanged(use_scan):
    base = tiny_llama(use_scan)
    adapted = apply_lora(base, LoraConfig(r=4, alpha=8, target_modules=ALL_PROJECTIONS), key=jax.random.PRNGKey(1))
    assert type(adapted) is LlamaLMHeadModel and has_lora(adapted)
    np.testing.assert_array_equal(logits(adapted, TOKENS), logits(base, TOKENS))


def test_stacked_and_unrolled_layers_get_the_same_adapters():
    config = LoraConfig(r=4, target_modules=("q_proj", "down_proj"))
    unrolled = apply_lora(tiny_llama(False), config, key=jax.random.PRNGKey(1))
    stacked = apply_lora(tiny_llama(True), config, key=jax.random.PRNGKey(1))
    for i, layer in enumerate(stacked.layers.unstack()):
        np.testing.assert_array_equal(layer.attention.q_proj.lora_a, unrolled.layers[i].attention.q_proj.lora_a)
        np.testing.assert_array_equal(layer.mlp.down_proj.lora_a, unrolled.layers[i].mlp.down_proj.lora_a)
    # The rank dimension has its own logical name, so the adapted model shards like the base one.
    assert haliax.logical_axes(stacked).layers.inner.attention.q_proj.lora_a.names == ("layers", "embed", "lora_rank")


@pytest.mark.parametrize("use_scan", [False, True])
def test_merged_model_computes_what_the_adapted_model_does(use_scan):
    adapted = apply_lora(tiny_llama(use_scan), LoraConfig(r=4, alpha=8, target_modules=ALL_PROJECTIONS), key=jax.random.PRNGKey(1))
    adapted = with_random_b(adapted, jax.random.PRNGKey(2))
    merged = merge_lora(adapted)
    assert type(merged) is LlamaLMHeadModel and not has_lora(merged)
    assert jax.tree.structure(merged) == jax.tree.structure(tiny_llama(use_scan))
    ours = logits(adapted, TOKENS)
    assert np.abs(ours - logits(tiny_llama(use_scan), TOKENS)).max() > 1e-2  # the adapters matter
    np.testing.assert_allclose(logits(merged, TOKENS), ours, atol=1e-5, rtol=1e-5)


def test_peft_loads_our_adapter_with_matching_logits(tmp_path, assert_same_logits_as_transformers):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft", reason="peft (the `test` extra) checks our adapter folders against PEFT's LoRA")
    base = tiny_llama(use_scan=True)
    adapted = apply_lora(base, LoraConfig(r=4, alpha=8, dropout=0.05, target_modules=ALL_PROJECTIONS), key=jax.random.PRNGKey(1))
    adapted = with_random_b(adapted, jax.random.PRNGKey(2))

    from levanter.compat.hf_checkpoints import export_to_hf

    export_to_hf(base, tmp_path / "base")
    export_peft_adapter(adapted, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))

    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert {k: saved[k] for k in ("peft_type", "task_type", "r", "lora_alpha", "lora_dropout", "bias")} == {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8, "lora_dropout": 0.05, "bias": "none"
    }
    assert saved["target_modules"] == sorted(ALL_PROJECTIONS)
    tensors = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(tensors) == 2 * 2 * len(ALL_PROJECTIONS)
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"].shape == (4, 32)
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (16, 4)
    assert tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape == (4, 64)

    hf_base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    hf_adapted = peft.PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()  # eval: no dropout
    assert_same_logits_as_transformers(adapted, hf_adapted)


def test_merged_export_loads_in_transformers_with_matching_logits(tmp_path, assert_same_logits_as_transformers):
    transformers = pytest.importorskip("transformers")
    adapted = apply_lora(tiny_llama(False), LoraConfig(r=4, target_modules=("q_proj", "v_proj", "up_proj")), key=jax.random.PRNGKey(1))
    adapted = with_random_b(adapted, jax.random.PRNGKey(2))
    export_merged_to_hf(adapted, tmp_path)
    assert_same_logits_as_transformers(adapted, transformers.AutoModelForCausalLM.from_pretrained(tmp_path))


def test_only_adapter_arrays_are_trainable():
    r = 4
    adapted = apply_lora(tiny_llama(True), LoraConfig(r=r, target_modules=ALL_PROJECTIONS), key=jax.random.PRNGKey(1))
    trainable = lora_trainable_filter(adapted)
    marked = [jax.tree_util.keystr(path) for path, flag in jax.tree_util.tree_leaves_with_path(trainable) if flag]
    assert len(marked) == 2 * len(ALL_PROJECTIONS)  # one stacked A and B per projection
    assert all(path.endswith((".lora_a", ".lora_b")) for path in marked)

    # (in, out) of each projection: hidden 32, 4 heads and 2 kv heads of 8, MLP 64.
    shapes = {"q_proj": (32, 32), "k_proj": (32, 16), "v_proj": (32, 16), "o_proj": (32, 32),
              "gate_proj": (32, 64), "up_proj": (32, 64), "down_proj": (64, 32)}
    expected = 2 * sum(r * (n_in + n_out) for n_in, n_out in shapes.values())  # 2 layers
    assert count_trainable_parameters(adapted) == expected
    base = tiny_llama(True)
    assert count_trainable_parameters(adapted, eqx.is_inexact_array) == expected + base.config.num_parameters(VOCAB)


def test_optimizer_steps_on_adapters_leave_base_weights_bit_identical():
    adapted = apply_lora(tiny_llama(True), LoraConfig(r=4, alpha=8, target_modules=ALL_PROJECTIONS), key=jax.random.PRNGKey(1))
    params, frozen = eqx.partition(adapted, lora_trainable_filter(adapted))
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    # Adam's two moments exist for the adapters alone.
    moments = sum(x.size for x in jax.tree.leaves(opt_state) if x.ndim > 0)
    assert moments == 2 * count_trainable_parameters(adapted)

    inputs, targets = TOKENS[:, :-1], TOKENS[:, 1:]

    def loss_fn(params):
        out = eqx.combine(params, frozen)(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(out, targets).mean()

    @jax.jit
    def step(params, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(3):
        params, opt_state, loss = step(params, opt_state)
        losses.append(float(loss))
    trained = eqx.combine(params, frozen)

    assert losses[-1] < losses[0]
    flags = jax.tree.leaves(lora_trainable_filter(adapted))
    for flag, before, after in zip(flags, jax.tree.leaves(adapted), jax.tree.leaves(trained), strict=True):
        if flag:
            assert not np.array_equal(before, after)
        else:
            np.testing.assert_array_equal(before, after)


def test_dropout_acts_only_when_armed_with_a_key():
    adapted = apply_lora(tiny_llama(True), LoraConfig(r=4, dropout=0.5, target_modules=("q_proj", "v_proj")), key=jax.random.PRNGKey(1))
    adapted = with_random_b(adapted, jax.random.PRNGKey(2), std=1.0)
    plain = logits(adapted, TOKENS)
    first = logits(with_lora_dropout(adapted, jax.random.PRNGKey(3)), TOKENS)
    again = logits(with_lora_dropout(adapted, jax.random.PRNGKey(3)), TOKENS)
    other = logits(with_lora_dropout(adapted, jax.random.PRNGKey(4)), TOKENS)
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, plain) and not np.allclose(first, other)
    # Merging ignores dropout: the merged model is the deterministic adapted one.
    np.testing.assert_allclose(logits(merge_lora(adapted), TOKENS), plain, atol=1e-5)


def test_misuse_is_refused_with_the_names_that_fit():
    base = tiny_llama(False)
    with pytest.raises(LoraError, match=r"qkv_proj.*projections are \['down_proj', 'gate_proj'"):
        apply_lora(base, LoraConfig(target_modules=("qkv_proj",)), key=jax.random.PRNGKey(0))
    adapted = apply_lora(base, LoraConfig(), key=jax.random.PRNGKey(0))
    with pytest.raises(LoraError, match="already has LoRA adapters"):
        apply_lora(adapted, LoraConfig(), key=jax.random.PRNGKey(0))
    with pytest.raises(LoraError, match="no LoRA adapters"):
        lora_trainable_filter(base)
    with pytest.raises(LoraError, match="target_modules"):
        LoraConfig(target_modules="q_proj")
    with pytest.raises(LoraError, match="positive integer"):
        LoraConfig(r=0)
    assert jnp.all(adapted.layers[0].attention.q_proj.lora_b == 0)


def test_exporting_an_adapted_model_as_a_plain_checkpoint_says_what_to_call(tmp_path):
    import jax

    from levanter.compat.hf_checkpoints import HfFormatError, export_to_hf
    from levanter.lora import LoraConfig, apply_lora
    from levanter.models.llama import LlamaConfig, LlamaLMHeadModel

    config = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=16)
    adapted = apply_lora(LlamaLMHeadModel(config, 50, key=jax.random.PRNGKey(0)), LoraConfig(r=2), key=jax.random.PRNGKey(1))
    with pytest.raises(HfFormatError, match="export_merged_to_hf"):
        export_to_hf(adapted, tmp_path / "hf")
