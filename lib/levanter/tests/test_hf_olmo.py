"""OLMo 2 and OLMo 3 checkpoints against transformers' own models (torch, CPU, float32): logits,
greedy decoding, export and re-import, refusals, and training that starts from an import."""

import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_family import UnsupportedConfigError  # noqa: E402
from levanter.inference.sampling import decode, init_cache  # noqa: E402
from levanter.models import LlamaConfig  # noqa: E402
from levanter.models.transformer import ConfigError  # noqa: E402

VOCAB = 64
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, eos_token_id=None, pad_token_id=None)
CASES = {
    # A head size of its own (4 x 16 != 32), biases and a tied head: each is a separate path through the conversion.
    "olmo2": ("Olmo2Config", dict(SHAPE, head_dim=16, attention_bias=True, tie_word_embeddings=True)),
    # A window of 4 in the first layer only, over 11-token inputs: the window masks, the second layer is full.
    "olmo3": ("Olmo3Config", dict(SHAPE, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                  rope_parameters={kind: {"rope_type": "default", "rope_theta": 20000.0}
                                                   for kind in ("full_attention", "sliding_attention")})),
    # Each kind of layer its own RoPE: linear scaling in the full layer, another base in the sliding one.
    "olmo3-rope": ("Olmo3Config", dict(SHAPE, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                                       rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
                                                        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
}
TOKENS = np.random.RandomState(0).randint(0, VOCAB, size=(2, 11)).astype(np.int32)


@pytest.fixture(scope="module", params=list(CASES))
def imported(request, tmp_path_factory, hf_comparison):
    """(case, transformers model with every parameter random, its folder, our import of it)."""
    reference, folder = hf_comparison.random_model(*CASES[request.param]), tmp_path_factory.mktemp(request.param)
    return request.param, reference, folder, hf_comparison.saved_and_imported(reference, folder)


def test_import_matches_transformers_logits(imported, hf_comparison):
    case, reference, _, ours = imported
    config = ours.config
    assert config.norm_placement == "post" and config.qk_norm and config.qk_norm_scope == "projection"
    if case == "olmo3":
        assert config.layer_types == ("sliding_attention", "full_attention") and config.sliding_window == 4
        assert config.rope_theta == 20000.0 and config.window_of(0) == 4 and config.window_of(1) is None
        assert config.sliding_rope_theta is None
    elif case == "olmo3-rope":
        assert config.rope_theta == 5e5 and config.rope_scaling.rope_type == "linear" and config.rope_scaling.factor == 4.0
        assert config.sliding_rope_theta == 1e4
    else:
        assert config.qkv_bias and config.o_bias and config.head_dim == 16 and config.tie_word_embeddings
    hf_comparison.assert_same_logits(ours, reference, TOKENS)


def test_greedy_decoding_matches_transformers_generate(imported, hf_comparison):
    _, reference, _, ours = imported
    hf_comparison.assert_same_greedy_decoding(ours, reference, TOKENS[:, :5])


def test_export_loads_in_transformers_with_the_same_logits(imported, tmp_path, hf_comparison):
    case, _, _, ours = imported
    export_to_hf(ours, tmp_path)
    model_type = case.split("-")[0]
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == model_type
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == f"{model_type.capitalize()}ForCausalLM"
    hf_comparison.assert_same_logits(ours, again, TOKENS)
    assert import_from_hf(tmp_path).config == ours.config


def _config_json(tmp_path, model_type: str, **fields):
    hf = {"model_type": model_type, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
          "num_attention_heads": 4, "vocab_size": 10, "max_position_embeddings": 64, **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    return tmp_path


YARN = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 5e5}
MIXED = {"layer_types": ["sliding_attention", "full_attention"]}


@pytest.mark.parametrize(
    ("model_type", "fields", "message"),
    [
        # The published OLMo 3 models rescale the full-attention layers' RoPE with yarn.
        ("olmo3", {**MIXED, "rope_parameters": {"full_attention": YARN, "sliding_attention": {"rope_type": "default", "rope_theta": 5e5}}},
         r"rope_parameters.rope_type='yarn'.*rope_parameters.full_attention"),
        ("olmo3", {**MIXED, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                                "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}},
         r"rope_parameters.sliding_attention=.*plain \(unscaled\) RoPE"),
        ("olmo3", {"layer_types": ["sliding_attention"]}, r"layer_types=\['sliding_attention'\]"),
        ("olmo3", {"sliding_window": 0, "layer_types": ["sliding_attention", "full_attention"]}, "sliding_window=0"),
        ("olmo2", {"hidden_act": "relu"}, "hidden_act='relu'"),
    ],
)
def test_what_cannot_be_expressed_is_refused_naming_the_field(tmp_path, model_type, fields, message):
    with pytest.raises(UnsupportedConfigError, match=message):
        import_from_hf(_config_json(tmp_path, model_type, **fields))


def test_layers_of_different_attention_kinds_are_not_scanned(imported):
    case, _, folder, _ = imported
    if case == "olmo2":
        assert import_from_hf(folder, use_scan=True).config.use_scan  # one kind of layer: scanned as usual
        return
    with pytest.raises(ConfigError, match="use_scan=True cannot stack layers of different attention kinds"):
        import_from_hf(folder, use_scan=True)


def test_olmo_block_options_are_refused_by_families_without_them(tmp_path):
    olmo = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=2,
                       norm_placement="post", qk_norm=True, qk_norm_scope="projection")
    export_to_hf(olmo.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path / "olmo")
    assert json.loads((tmp_path / "olmo" / "config.json").read_text())["model_type"] == "olmo2"
    per_head = dataclasses.replace(olmo, qk_norm_scope="head")  # Qwen3's norm with OLMo's placement: nobody's
    with pytest.raises(UnsupportedConfigError, match=r"qwen3: it has no place for norm_placement.*olmo2: OLMo always norms the whole"):
        export_to_hf(per_head.build(VOCAB, key=jax.random.PRNGKey(0)), tmp_path / "neither")


def test_cached_decoding_matches_the_forward_pass_for_each_norm_placement():
    for placement in ("post", "both"):
        config = LlamaConfig(hidden_dim=32, intermediate_dim=48, num_layers=3, num_heads=4, num_kv_heads=2, max_seq_len=32,
                             norm_placement=placement, qk_norm=True, qk_norm_scope="projection", sliding_window=3,
                             layer_types=("sliding_attention", "full_attention", "sliding_attention"))
        model = config.build(VOCAB, key=jax.random.PRNGKey(0))
        leaves, treedef = jax.tree.flatten(model)
        assert sum(x.size for x in leaves) == config.num_parameters(VOCAB)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))  # norms start at one: perturb them
        model = jax.tree.unflatten(treedef, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
        prefix_logits, cache = decode(model, TOKENS[:, :6], init_cache(model, 2, 11), 0)
        rest_logits, _ = decode(model, TOKENS[:, 6:], cache, 6)
        np.testing.assert_allclose(np.concatenate([prefix_logits, rest_logits], axis=1), model(TOKENS), atol=1e-5)


def test_layer_types_are_recorded_and_read_back():
    config = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=2, sliding_window=4,
                         layer_types=("sliding_attention", "full_attention"), norm_placement="post")
    record = json.loads(json.dumps(config.to_dict()))
    assert record["layer_types"] == ["sliding_attention", "full_attention"] and record["norm_placement"] == "post"
    assert LlamaConfig(**record) == config
    with pytest.raises(ConfigError, match="layer_types has sliding_attention layers but sliding_window is None"):
        dataclasses.replace(config, sliding_window=None)
    with pytest.raises(ConfigError, match="norm_placement must be one of"):
        dataclasses.replace(config, norm_placement="middle")


def test_training_starts_from_an_import(imported, tmp_path, hf_comparison):
    case, _, folder, ours = imported
    if case == "olmo3-rope":
        pytest.skip("olmo3 covers the family; the run does not depend on the RoPE")
    hf_comparison.assert_training_starts_from(folder, ours.config, VOCAB, str(tmp_path / "run"))
    assert json.loads((tmp_path / "run" / "hf" / "config.json").read_text())["model_type"] == case


def test_declared_sizes_match_their_names():
    from experiments.olmo import OLMO_SIZES, OLMO_VOCAB_SIZE, olmo2_nano, olmo3_nano

    # Per layer 4 * 4096^2 (attention) + 3 * 4096 * 11008 (MLP) + 4 * 4096 (two norms, two q/k norms).
    assert OLMO_SIZES["olmo2_7b"].num_parameters(OLMO_VOCAB_SIZE) == 32 * 202_391_552 + 2 * 100_352 * 4096 + 4096
    for name, config in OLMO_SIZES.items():
        billions = float(name.rsplit("_", 1)[1].removesuffix("b"))
        assert config.num_parameters(OLMO_VOCAB_SIZE) == pytest.approx(billions * 1e9, rel=0.1), name
    for nano in (olmo2_nano, olmo3_nano):
        tokens = np.zeros((1, 8), np.int32)
        assert nano.build(64, key=jax.random.PRNGKey(0))(tokens).shape == (1, 8, 64)
