"""A file passed as the tokenizer that is not one (a dataset, a model config, text) is named as such."""

from __future__ import annotations

import json

import pytest

from levanter.tokenization import TokenizerFormatError, load_tokenizer

STORY_LINES = [json.dumps({"text": text}) for text in ("Once upon a time.", "A cat sat.", "The end.")]


@pytest.mark.parametrize(
    ("file_name", "lines", "why"),
    [
        ("train.jsonl", STORY_LINES, "JSON Lines"),
        ("config.json", [json.dumps({"model_type": "llama", "hidden_size": 32})], "no 'model' section"),
        ("list.json", ["[1, 2, 3]"], "not a JSON object"),
        ("notes.txt", ["just some words"], "not JSON"),
    ],
)
def test_a_file_that_is_not_a_tokenizer_is_named_as_such(tmp_path, file_name, lines, why):
    path = tmp_path / file_name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(TokenizerFormatError) as caught:
        load_tokenizer(path)
    message = str(caught.value)
    assert str(path) in message and "is not a tokenizer" in message and why in message
    assert "tokenizer.json" in message and "hub id" in message
    assert "tokenizer.json is not valid JSON" not in message
