"""``marin generate`` on a damaged model folder: exit 2 with the file (and tensor) at fault named,
never an empty continuation with exit 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from levanter.compat.hf_checkpoints import export_llama_to_hf
from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin import cli

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)
GREEDY = ["--max-new-tokens", "4", "--temperature", "0", "--top-k", "0", "--top-p", "1"]
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def good_export(tmp_path_factory, synthetic_stories) -> Path:
    root = tmp_path_factory.mktemp("corrupt-weights")
    texts = list(synthetic_stories[:30])
    tokenizer_folder = save_tokenizer(train_bpe_tokenizer(texts, 300), str(root / "tokenizer"))
    model = LlamaLMHeadModel(TINY, 300, key=jax.random.PRNGKey(0))
    return Path(export_llama_to_hf(model, root / "hf", tokenizer_dir_or_obj=tokenizer_folder))


@pytest.fixture
def damaged(good_export, tmp_path) -> Path:
    """A private copy of the good export, for one test to break."""
    return Path(shutil.copytree(good_export, tmp_path / "hf"))


def _marin_generate(capsys, folder: Path) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(["generate", str(folder), "--prompt", PROMPT, *GREEDY])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_undamaged_export_generates(good_export, capsys):
    code, out, err = _marin_generate(capsys, good_export)
    assert code == 0, err
    assert out.startswith(PROMPT)


def test_nan_weights_name_the_tensor_and_the_file(damaged, capsys):
    weights = damaged / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.0.mlp.up_proj.weight"][3, 5] = np.nan
    save_file(tensors, weights)
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert "model.layers.0.mlp.up_proj.weight" in err and str(weights) in err
    assert "NaN or infinite" in err


def test_a_truncated_safetensors_file_is_named(damaged, capsys):
    weights = damaged / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert str(weights) in err and "truncated or corrupt" in err


def test_a_shard_named_by_the_index_but_missing_is_named(damaged, capsys):
    (damaged / "model.safetensors").rename(damaged / "model-00001-of-00002.safetensors")
    weight_map = {name: "model-00001-of-00002.safetensors" for name in load_file(damaged / "model-00001-of-00002.safetensors")}
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    (damaged / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert "model-00002-of-00002.safetensors" in err and "missing" in err


def test_missing_config_json_beside_the_weights_is_named(damaged, capsys):
    (damaged / "config.json").unlink()
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert f"{damaged} holds weights (model.safetensors) but no config.json" in err


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"model_type": "llama", "hidden_size": 3', "is not valid JSON"),
        ("[1, 2, 3]", "is not a JSON object"),
        ('{"model_type": "llama", "vocab_size": 300}', "lacks 'hidden_size'"),
        ('{"model_type": "llama", "hidden_size": "big", "intermediate_size": 64, "num_hidden_layers": 1, '
         '"num_attention_heads": 2, "vocab_size": 300}', "hidden_size"),
    ],
)
def test_a_garbage_config_json_is_named(damaged, capsys, content, message):
    (damaged / "config.json").write_text(content)
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert str(damaged / "config.json") in err and message in err


def test_a_config_json_that_disagrees_with_the_weights_is_named(damaged, capsys):
    config = json.loads((damaged / "config.json").read_text())
    (damaged / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert f"The tensors in {damaged} do not have the shapes its config.json describes" in err


def test_finite_weights_that_overflow_the_logits_are_an_error_not_an_empty_text(damaged, capsys):
    # Every weight is finite, so loading succeeds; the logits overflow float32 to +-inf (NaN once
    # divided by a temperature or softmaxed), and NaN's argmax is token 0: this tokenizer's end-of-text.
    weights = damaged / "model.safetensors"
    tensors = load_file(weights)
    tensors["lm_head.weight"][:] = 3e38
    save_file(tensors, weights)
    code, out, err = _marin_generate(capsys, damaged)
    assert code == 2 and out == ""
    assert "NaN or infinite logits" in err
