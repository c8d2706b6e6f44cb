"""GPT-2 against transformers' own ``GPT2LMHeadModel`` (torch, CPU, float32): logits, greedy
decoding, export and re-import, refusals, training that starts from an import, and sizes."""

import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.numpy import load_file, save_file  # noqa: E402

from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf  # noqa: E402
from levanter.compat.hf_family import UnsupportedConfigError  # noqa: E402
from levanter.models.gpt2 import Gpt2Config, Gpt2LMHeadModel  # noqa: E402
from levanter.models.transformer import ConfigError  # noqa: E402

from experiments.gpt2 import GPT2_SIZES, GPT2_VOCAB_SIZE  # noqa: E402

VOCAB = 64
TOKENS = np.random.RandomState(0).randint(0, VOCAB, size=(2, 11)).astype(np.int32)
HF_CONFIG = dict(vocab_size=VOCAB, n_positions=48, n_embd=32, n_layer=2, n_head=4, n_inner=48, layer_norm_epsilon=1e-5,
                 bos_token_id=None, eos_token_id=None)


def hf_gpt2(hf_comparison, **overrides):
    """A transformers GPT-2 with every parameter random (LayerNorm scales and biases included)."""
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**HF_CONFIG, **overrides}))
    return hf_comparison.randomized(model, is_norm=lambda name: name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")))


@pytest.fixture(scope="module")
def imported(tmp_path_factory, hf_comparison):
    """(transformers model, its folder, our import of it)."""
    folder = tmp_path_factory.mktemp("gpt2")
    reference = hf_gpt2(hf_comparison)
    return reference, folder, hf_comparison.saved_and_imported(reference, folder)


def test_import_matches_transformers_logits(imported, hf_comparison):
    reference, _, ours = imported
    assert isinstance(ours, Gpt2LMHeadModel)
    assert ours.config == Gpt2Config(hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4, max_seq_len=48)
    hf_comparison.assert_same_logits(ours, reference, TOKENS)


def test_greedy_decoding_matches_transformers_generate(imported, hf_comparison):
    reference, _, ours = imported
    hf_comparison.assert_same_greedy_decoding(ours, reference, TOKENS[:, :5])


def test_export_loads_in_transformers_with_the_same_logits(imported, tmp_path, hf_comparison):
    _, _, ours = imported
    export_to_hf(ours, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"
    assert "transformer.h.0.attn.c_attn.weight" in load_file(str(tmp_path / "model.safetensors"))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(again).__name__ == "GPT2LMHeadModel"
    hf_comparison.assert_same_logits(ours, again, TOKENS)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(import_from_hf(tmp_path)), strict=True):
        np.testing.assert_array_equal(a, b)
    scanned = import_from_hf(tmp_path, use_scan=True)
    assert scanned.config.use_scan
    np.testing.assert_allclose(hf_comparison.our_logits(scanned, TOKENS), hf_comparison.our_logits(ours, TOKENS), atol=1e-5)


def test_published_file_names_without_the_transformer_prefix_are_read(imported, tmp_path, hf_comparison):
    # The published gpt2 weights were saved from the bare GPT2Model: "h.0.attn.c_attn.weight", "wte.weight".
    reference, folder, ours = imported
    reference.config.save_pretrained(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({name.removeprefix("transformer."): t for name, t in tensors.items()}, str(tmp_path / "model.safetensors"))
    hf_comparison.assert_same_logits(import_from_hf(tmp_path), reference, TOKENS)


def test_an_untied_head_round_trips(tmp_path, hf_comparison):
    reference = hf_gpt2(hf_comparison, tie_word_embeddings=False)
    reference.save_pretrained(tmp_path / "theirs")
    ours = import_from_hf(tmp_path / "theirs")
    assert ours.lm_head is not None
    hf_comparison.assert_same_logits(ours, reference, TOKENS)
    export_to_hf(ours, tmp_path / "ours")
    hf_comparison.assert_same_logits(ours, transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours").eval(), TOKENS)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scale_attn_weights": False}, "scale_attn_weights=False"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=True"),
        ({"add_cross_attention": True}, "add_cross_attention=True"),
        ({"activation_function": "relu"}, "activation_function='relu'"),
    ],
)
def test_what_cannot_be_expressed_is_refused_naming_the_field(tmp_path, fields, message):
    hf = {"model_type": "gpt2", **HF_CONFIG, **fields}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(UnsupportedConfigError, match=message):
        import_from_hf(tmp_path)


def test_positions_beyond_the_table_are_refused():
    model = Gpt2Config(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, max_seq_len=8).build(VOCAB, key=jax.random.PRNGKey(0))
    with pytest.raises(ConfigError, match="exceeds the model's max_seq_len 8"):
        model(np.zeros((1, 9), np.int32))


def test_training_starts_from_an_import(imported, tmp_path, hf_comparison):
    _, folder, ours = imported
    hf_comparison.assert_training_starts_from(folder, ours.config, VOCAB, str(tmp_path / "run"))


def test_published_sizes_have_their_exact_counts():
    # GPT-2's published parameter counts (tied head, position table included).
    counts = {"gpt2_small": 124_439_808, "gpt2_medium": 354_823_168, "gpt2_large": 774_030_080, "gpt2_xl": 1_557_611_200}
    assert {name: config.num_parameters(GPT2_VOCAB_SIZE) for name, config in GPT2_SIZES.items()} == counts
