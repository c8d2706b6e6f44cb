"""An exported checkpoint loads as it is in transformers and in lm-eval's own Hugging Face backend,
and that backend scores requests exactly as our adapter does once both condition on the same tokens.

Our adapter (``levanter.eval.harness``) puts the prefix token (BOS, else EOS: our models are trained
on documents packed behind it) before every context. lm-eval's backend prepends BOS only when the
tokenizer adds it itself, and the export keeps the source tokenizer's encoding, which for
GPT-2-style tokenizers adds nothing. So, per request:

* with ``add_bos_token=True`` (``--model_args pretrained=DIR,add_bos_token=True``) its
  ``loglikelihood`` equals ours within float32 tolerance;
* by default it scores the continuation after the bare context: exactly what our adapter gives
  for those same token ids, but a different number from ours (no prefix token before the context);
* ``loglikelihood_rolling`` equals ours by default (both start documents after the prefix token);
  with ``add_bos_token=True`` the document gains the tokenizer's BOS after the prefix token (the
  same token twice): that BOS is scored too, and the rest of the document follows both.

The accuracy of our built-in task measured through lm-eval's backend (0.229 against our 0.250,
with a hand-copied tokenizer config) differed for this reason alone: one item in 48 flipped when
its context lost the prefix token.
"""

from __future__ import annotations

import json

import jax
import pytest
import tokenizers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("lm_eval")
huggingface = pytest.importorskip("lm_eval.models.huggingface", reason="lm-eval's Hugging Face backend needs accelerate")

from lm_eval.api.instance import Instance  # noqa: E402

from levanter.compat.hf_checkpoints import export_to_hf  # noqa: E402
from levanter.eval.harness import LevanterHarnessLM  # noqa: E402
from levanter.models import LlamaConfig  # noqa: E402
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer  # noqa: E402

CONFIG = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=64,
                     initializer_range=0.5)  # far from uniform, so conditioning on one token more shows
END = "<|endoftext|>"
PAIRS = [
    ("Once upon a time, a little", " fox found a red ball."),
    ("The cat sat on the ", "mat."),  # lm-eval moves the trailing space into the continuation
    ("", "Once upon a time"),  # empty context: the prefix token is the whole context, for both
    ("Lily went to the park. She", " played with her dog and they were happy."),
]
DOCUMENTS = ["Once upon a time, there was a little girl named Lily.", "The sun was warm and the sky was blue."]
TOL = dict(rel=1e-4, abs=1e-4)


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def _read(folder, name: str) -> dict:
    return json.loads((folder / name).read_text())


@pytest.fixture(scope="module")
def builtin_tokenizer(synthetic_stories) -> tokenizers.Tokenizer:
    """The project's built-in kind of tokenizer: byte-level BPE whose only special token is ``<|endoftext|>``."""
    return train_bpe_tokenizer(synthetic_stories[:50], 300)


def _export(folder, tokenizer, vocab_size: int):
    model = CONFIG.build(vocab_size, key=jax.random.PRNGKey(7))
    export_to_hf(model, folder, tokenizer_dir_or_obj=tokenizer)
    return model


@pytest.fixture(scope="module", params=["builtin", "gpt2"])
def exported(request, builtin_tokenizer, tmp_path_factory):
    """(folder, our model) exported with the bare built-in tokenizer, or with the GPT-2 tokenizer's folder."""
    folder = tmp_path_factory.mktemp(f"hf-{request.param}")
    if request.param == "builtin":
        return folder, _export(folder, builtin_tokenizer, builtin_tokenizer.get_vocab_size())
    gpt2 = request.getfixturevalue("real_data").gpt2
    return folder, _export(folder, str(gpt2), 50257)


def test_bare_builtin_tokenizer_gets_its_special_tokens_named(tmp_path, builtin_tokenizer):
    _export(tmp_path, builtin_tokenizer, builtin_tokenizer.get_vocab_size())
    end = builtin_tokenizer.token_to_id(END)
    named = {"bos_token": END, "eos_token": END, "pad_token": END}
    assert _read(tmp_path, "special_tokens_map.json") == named
    assert _read(tmp_path, "tokenizer_config.json") == {
        **named, "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "model_max_length": CONFIG.max_seq_len,
    }
    ids = {"bos_token_id": end, "eos_token_id": end, "pad_token_id": end}
    assert _read(tmp_path, "generation_config.json") == ids  # no max_length: generate(max_new_tokens=...) warns of none
    assert ids.items() <= _read(tmp_path, "config.json").items()

    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (end, end, end)
    text = "Once upon a time , the fox said: \"Hello!\""
    assert tokenizer(text)["input_ids"] == builtin_tokenizer.encode(text).ids  # encodes as the source does
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    generation = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (generation.eos_token_id, generation.pad_token_id) == (end, end)


def test_source_folder_metadata_is_carried_over(tmp_path, synthetic_stories):
    source = tmp_path / "source"
    tok = train_bpe_tokenizer(synthetic_stories[:50], 300, special_tokens=(END, "<pad>"))
    save_tokenizer(tok, source, eos_token=END)
    config = _read(source, "tokenizer_config.json")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config.update(pad_token="<pad>", chat_template=template, model_max_length=int(1e30))
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "hf"
    _export(out, str(source), tok.get_vocab_size())

    written = _read(out, "tokenizer_config.json")
    assert written["chat_template"] == template
    assert (written["bos_token"], written["eos_token"], written["pad_token"]) == (END, END, "<pad>")
    assert written["model_max_length"] == CONFIG.max_seq_len  # "no limit" becomes the model's limit
    assert _read(out, "special_tokens_map.json") == {"bos_token": END, "eos_token": END, "pad_token": "<pad>"}
    assert _read(out, "generation_config.json")["pad_token_id"] == tok.token_to_id("<pad>") == 1
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False) == "Hi"


def test_gpt2_folder_keeps_its_own_config(tmp_path, real_data):
    _export(tmp_path, str(real_data.gpt2), 50257)
    source = _read(real_data.gpt2, "tokenizer_config.json")
    written = _read(tmp_path, "tokenizer_config.json")
    # Everything the source says stays, except a length beyond the model's; padding is EOS.
    assert written == {**source, "model_max_length": CONFIG.max_seq_len, "pad_token": END}
    assert _read(tmp_path, "special_tokens_map.json")["bos_token"]["content"] == END  # as the source spells it
    assert _read(tmp_path, "generation_config.json") == {
        "bos_token_id": 50256, "eos_token_id": 50256, "pad_token_id": 50256,
    }


def test_transformers_generates_from_an_export_without_warnings(exported, caplog, recwarn):
    import torch

    folder, _ = exported
    model, tokenizer = transformers.AutoModelForCausalLM.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)
    with caplog.at_level("WARNING"), torch.no_grad():
        out = model.generate(**tokenizer("Once upon a time", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(tokenizer("Once upon a time")["input_ids"]) + 4
    said = [record.getMessage() for record in caplog.records] + [str(w.message) for w in recwarn]
    assert not any("max_length" in message for message in said), said


def test_transformers_logits_match_ours(exported, assert_same_logits_as_transformers):
    folder, model = exported
    assert_same_logits_as_transformers(model, transformers.AutoModelForCausalLM.from_pretrained(folder))


@pytest.fixture(scope="module")
def scored(exported):
    """Each backend's answers to the same requests: ours, lm-eval HF by default and with add_bos_token=True."""
    folder, model = exported
    ours = LevanterHarnessLM(model, load_tokenizer(folder), batch_size=4, compute_dtype="float32")
    hf = huggingface.HFLM(pretrained=str(folder), device="cpu", batch_size=4)
    hf_bos = huggingface.HFLM(pretrained=str(folder), device="cpu", batch_size=4, add_bos_token=True)
    return ours, hf, hf_bos


def _assert_same(actual, expected):
    for (log_prob, greedy), (want, want_greedy) in zip(actual, expected, strict=True):
        assert log_prob == pytest.approx(want, **TOL)
        assert greedy == want_greedy


def test_lm_eval_hf_backend_with_bos_scores_exactly_as_our_adapter(scored):
    ours, _, hf_bos = scored
    requests = _requests("loglikelihood", PAIRS)
    assert hf_bos.prefix_token_id == ours.prefix_token_id
    _assert_same(hf_bos.loglikelihood(requests), ours.loglikelihood(requests))


def test_lm_eval_hf_backend_by_default_drops_only_the_prefix_token(scored):
    ours, hf, _ = scored
    requests = _requests("loglikelihood", PAIRS)
    by_default = hf.loglikelihood(requests)
    # The same token ids as lm-eval's backend encodes them (no prefix before a non-empty context),
    # scored by our adapter, give the same numbers...
    encoded = [hf._encode_pair(c, x) if c else ([hf.prefix_token_id], hf.tok_encode(x, add_special_tokens=False))
               for c, x in PAIRS]
    _assert_same(by_default, ours._loglikelihood_tokens([(None, c, x) for c, x in encoded]))
    # ...which differ from ours for exactly the requests whose context lacks the prefix token.
    with_prefix = ours.loglikelihood(requests)
    for (context, _), (theirs, _), (mine, _) in zip(PAIRS, by_default, with_prefix):
        assert (theirs == pytest.approx(mine, **TOL)) == (context == "")


def test_rolling_log_likelihoods(scored):
    ours, hf, hf_bos = scored
    requests = _requests("loglikelihood_rolling", [(d,) for d in DOCUMENTS])
    expected = ours.loglikelihood_rolling(requests)
    assert hf.loglikelihood_rolling(requests) == pytest.approx(expected, **TOL)
    # With add_bos_token the document is [BOS, ...] after the prefix token BOS: one token more is scored.
    bos = ours.prefix_token_id
    doubled = [(None, [bos], [bos, *ours.tok_encode(d, add_special_tokens=False)]) for d in DOCUMENTS]
    assert hf_bos.loglikelihood_rolling(requests) == pytest.approx([lp for lp, _ in ours._loglikelihood_tokens(doubled)], **TOL)
