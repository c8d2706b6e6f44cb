"""Hugging Face Llama export/import, checked against transformers' own LlamaForCausalLM (torch, CPU)."""

import json

import jax
import numpy as np
import pytest
import tokenizers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from levanter.compat.hf_checkpoints import HfFormatError, export_llama_to_hf, import_llama_from_hf  # noqa: E402
from levanter.models import LlamaConfig  # noqa: E402
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer  # noqa: E402

VOCAB = 64


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory, synthetic_stories):
    return save_tokenizer(train_bpe_tokenizer(synthetic_stories[:50], 300), tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("tied", [False, True])
def test_export_loads_in_transformers_with_matching_logits(tmp_path, assert_same_logits_as_transformers, tied,
                                                           tokenizer_folder):
    config = LlamaConfig(
        hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64,
        rope_theta=5000.0, tie_word_embeddings=tied, use_scan=tied,
    )
    model = config.build(VOCAB, key=jax.random.PRNGKey(4))
    # The tied model is also written in small shards with an index, as large models are.
    shard_bytes = 20_000 if tied else 5 * 2**30
    export_llama_to_hf(model, tmp_path, tokenizer_dir_or_obj=tokenizer_folder if tied else None, max_shard_bytes=shard_bytes)
    assert (tmp_path / "model.safetensors.index.json").exists() == tied

    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    assert_same_logits_as_transformers(model, hf_model)
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is tied
    if tied:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
        expected = tokenizers.Tokenizer.from_file(f"{tokenizer_folder}/tokenizer.json").encode("Once upon a time").ids
        assert tokenizer("Once upon a time")["input_ids"] == expected
    # Reading our own export back (sharded or not) gives the very same parameters.
    again = import_llama_from_hf(tmp_path, use_scan=config.use_scan)
    for ours, back in zip(jax.tree.leaves(model), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(ours, back)


def test_transformers_model_imports_with_matching_logits(tmp_path, assert_same_logits_as_transformers):
    hf_config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=20000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(hf_config).eval()
    hf_model.save_pretrained(tmp_path)

    model = import_llama_from_hf(tmp_path, use_scan=True)
    assert model.config.num_kv_heads == 2 and model.config.rope_theta == 20000.0 and model.config.norm_eps == 1e-6
    assert_same_logits_as_transformers(model, hf_model)


def test_unsupported_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(HfFormatError, match="config.json"):
        import_llama_from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "vocab_size": 10, "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
    }))
    with pytest.raises(HfFormatError, match="llama3"):
        import_llama_from_hf(tmp_path)
