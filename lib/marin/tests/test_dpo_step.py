"""Preference data and the dpo step: pairs as alternating masked documents, refused as plain or SFT
data, and a DPO run (with LoRA) from a Hugging Face folder that starts at log 2 and exports both forms."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest
from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.data.pairs import PAIR_LAYOUT
from levanter.lora import LoraConfig
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from levanter.trainer import MeshConfig
from levanter.trainer.config import MeshConfigError
from levanter.trainer.tracker import read_metrics
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.dpo import dpo, preference_dataset
from marin.experiment.sft import sft
from marin.experiment.train import TrainConfigError, TrainedModel, train_lm
from marin.processing.tokenize import TokenizedDataset
from zephyr.token_cache import TokenCache

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64)
FRUITS = {"apple": "red", "banana": "yellow", "lime": "green", "plum": "purple"}


def _records(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    names = sorted(FRUITS)
    records = []
    for i in range(count):
        fruit = names[int(rng.integers(len(names)))]
        wrong = FRUITS[names[(names.index(fruit) + 1) % len(names)]]
        prompt = f"What color is a {fruit}?"
        if i % 2:  # a prompt given as messages, with an earlier assistant turn that must not be trained on
            prompt = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                      {"role": "user", "content": prompt}]
        records.append({"prompt": prompt, "chosen": f"A {fruit} is {FRUITS[fruit]}.", "rejected": f"A {fruit} is {wrong}."})
    return records


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dpo")
    records = _records(32, seed=0)
    texts = ["Hi", "Hello"] + [f"What color is a {f}? A {f} is {c}." for f, c in FRUITS.items()]
    tokenizer = root / "tokenizer"
    save_tokenizer(train_bpe_tokenizer(texts * 20, 300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
                   str(tokenizer))
    source = root / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    pairs = preference_dataset("preference/fruits", source=str(source), tokenizer=str(tokenizer))
    prefix = root / "prefix"
    runner = StepRunner(prefix=str(prefix))
    runner.run([pairs])
    result = load_artifact(runner.output_path_for(pairs), TokenizedDataset).result
    base = root / "base-hf"
    export_to_hf(TINY.build(load_tokenizer(str(tokenizer)).vocab_size, key=jax.random.PRNGKey(0)), str(base))
    return {"base": base, "root": root, "pairs": pairs, "result": result, "tokenizer": tokenizer, "prefix": prefix, "records": records}


def test_pairs_alternate_chosen_and_rejected_with_the_mask_on_the_reply_only(setup):
    cache = TokenCache.open(setup["result"].cache_path("train"))
    tok = load_tokenizer(str(setup["tokenizer"])).tokenizer
    assert cache.metadata["layout"] == PAIR_LAYOUT and cache.num_documents == 2 * len(setup["records"])
    for index in (0, 1):  # a string prompt, then a prompt of messages with an assistant turn
        record = setup["records"][index]
        for j, field in enumerate(("chosen", "rejected")):
            ids, mask = cache.document(2 * index + j), cache.document_loss_mask(2 * index + j)
            trained = tok.decode([int(i) for i, m in zip(ids, mask) if m], skip_special_tokens=False)
            assert trained.replace(" ", "").startswith(record[field].replace(" ", "")), trained
            assert "Hello" not in trained


def test_preference_data_is_refused_by_train_lm_and_sft_and_dpo_refuses_other_data(setup):
    with pytest.raises(TrainConfigError, match="preference pairs"):
        train_lm("checkpoints/x", model=TINY, datasets={setup["pairs"]: 1.0}, batch_size=8, seq_len=64, num_train_steps=1)
    with pytest.raises(TrainConfigError, match="chat datasets only"):
        sft("checkpoints/y", model=TINY, datasets={setup["pairs"]: 1.0}, batch_size=8, seq_len=64, num_train_steps=1)
    text = tokenized("tokenized/fruit-text", source=str(setup["root"] / "pairs.jsonl"), tokenizer=str(setup["tokenizer"]))
    with pytest.raises(TrainConfigError, match="exactly one preference_dataset"):
        dpo("checkpoints/z", initialize_from=str(setup["base"]), model=TINY, datasets={text: 1.0},
            batch_size=8, seq_len=64, num_train_steps=1)
    with pytest.raises(TrainConfigError, match="even batch_size"):
        dpo("checkpoints/z", initialize_from=str(setup["base"]), model=TINY, datasets={setup["pairs"]: 1.0},
            batch_size=7, seq_len=64, num_train_steps=1)
    # A mesh, like any placement, is checked when declared and leaves the identity alone.
    args = dict(initialize_from=str(setup["base"]), model=TINY, datasets={setup["pairs"]: 1.0}, batch_size=8, seq_len=64,
                num_train_steps=1)
    with pytest.raises(MeshConfigError, match="batch_size=8 does not split into whole rows over the data x fsdp x experts = 16"):
        dpo("checkpoints/z", mesh=MeshConfig(data=1, fsdp=16), **args)
    assert dpo("checkpoints/z", mesh=MeshConfig(data=1, fsdp=8), **args).identity == dpo("checkpoints/z", **args).identity


def test_a_dpo_lora_run_from_a_hugging_face_folder_starts_at_log_two_and_exports_merged_and_adapter(setup):
    run = dpo("checkpoints/fruits-dpo", initialize_from=str(setup["base"]), model=TINY, datasets={setup["pairs"]: 1.0}, beta=0.1,
              lora=LoraConfig(r=4, alpha=8), optimizer=AdamConfig(learning_rate=1e-2), batch_size=8, seq_len=64,
              num_train_steps=3)
    runner = StepRunner(prefix=str(setup["prefix"]))
    runner.run([run])
    result = load_artifact(runner.output_path_for(run), TrainedModel).result
    lines = [r for r in read_metrics(result.metrics_path) if "dpo_loss" in r]
    assert len(lines) == 3 and lines[0]["dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert {"rewards/chosen", "rewards/rejected", "rewards/margin", "accuracy"} <= set(lines[0])
    import_from_hf(result.hf_path)  # the merged model loads as a plain one
    with open(f"{result.adapter_path}/adapter_config.json") as f:
        assert json.load(f)["r"] == 4
