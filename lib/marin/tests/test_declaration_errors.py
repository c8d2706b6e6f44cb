"""train_lm refuses requests that cannot train a model when they are declared, not mid-run."""

from __future__ import annotations

import json

import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig, OptimizerConfigError
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.experiment.data import tokenized
from marin.experiment.train import TrainConfigError, train_lm

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # Declaring reads the files' digests and the tokenizer's identity; nothing is tokenized.
    root = tmp_path_factory.mktemp("declared")
    texts = [f"the cat number {i} sat on the mat" for i in range(20)]
    source = root / "train.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tokenizer = save_tokenizer(train_bpe_tokenizer(texts, 300), str(root / "tokenizer"))
    return tokenized("tokenized/t", str(source), tokenizer)


def _train(data, **overrides):
    request = dict(model=TINY, datasets={data: 1.0}, batch_size=4, seq_len=16, num_train_steps=2) | overrides
    return train_lm("checkpoints/declared", **request)


def test_seq_len_of_one_is_refused_saying_a_prediction_needs_two_tokens(data):
    with pytest.raises(TrainConfigError) as caught:
        _train(data, seq_len=1)
    message = str(caught.value)
    assert "seq_len=1" in message and "at least 2" in message and "next token" in message


@pytest.mark.parametrize("field", ["batch_size", "seq_len", "num_train_steps"])
def test_a_bool_is_not_a_count(data, field):
    with pytest.raises(TrainConfigError, match=f"{field}.*True"):
        _train(data, **{field: True})


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), True])
def test_a_mixture_weight_must_be_a_finite_positive_number(data, weight):
    with pytest.raises(TrainConfigError, match="weight"):
        _train(data, datasets={data: weight})


def test_a_nan_learning_rate_is_refused_where_the_optimizer_is_declared(data):
    with pytest.raises(OptimizerConfigError, match="learning_rate"):
        _train(data, optimizer=AdamConfig(learning_rate=float("nan")))


def test_a_sound_request_is_accepted(data):
    assert _train(data, seq_len=2).name == "checkpoints/declared"


def test_an_optimizer_that_is_not_an_optimizer_config_is_refused(data):
    with pytest.raises(TrainConfigError, match="AdamConfig"):
        _train(data, optimizer={"learning_rate": 1e-3})
