"""Every step output on object storage: a prefix of ``s3://`` (a local S3 server) or ``memory://``.

The same graphs as on local disk (tokenize, eval, model card) run under a URL prefix; ``marin
status``, ``explain``, ``report`` and ``generate`` read them back from there; and nothing lands on
the local disk (a URL mistaken for a path would leave a folder named ``s3:`` in the working
directory).
"""

from __future__ import annotations

import json
import os
import uuid

import jax
import pytest
import tokenizers

from levanter.compat.hf_checkpoints import export_llama_to_hf
from levanter.inference import SamplingConfig
from levanter.models.llama import LlamaConfig, LlamaLMHeadModel
from levanter.tokenization import load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin import cli
from marin.evaluation import DatasetScore, EvalResults
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.eval import evaluate_lm
from marin.experiment.train import DatasetUsed, TrainedModel
from marin.generate import generate
from marin.processing.tokenize import TokenizedDataset
from marin.reports import ModelCard, model_report, write_model_card
from rigging import filesystem as fsx
from zephyr.token_cache import TokenCache

EOS = 0  # train_bpe_tokenizer puts <|endoftext|> first: the EOS appended to each document
TINY = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=64,
                   tie_word_embeddings=True)
VOCAB = 300


@pytest.fixture(params=["s3", "memory"])
def prefix(request, tmp_path, monkeypatch) -> str:
    """A fresh URL prefix; the test runs in an empty working directory, which must stay empty."""
    url = request.getfixturevalue("s3_prefix") if request.param == "s3" else f"memory://objstore-{uuid.uuid4().hex[:12]}/marin"
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    yield url
    assert sorted(os.listdir(workdir)) == [], "a step wrote to the local disk instead of the prefix"


@pytest.fixture(scope="module")
def local_inputs(tmp_path_factory, synthetic_stories) -> dict[str, str]:
    root = tmp_path_factory.mktemp("inputs")
    texts = {"train": synthetic_stories[:40], "validation": synthetic_stories[300:310]}
    paths = {}
    for split, stories in texts.items():
        paths[split] = str(root / f"{split}.jsonl")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": text}) + "\n" for text in stories)
    paths["tokenizer"] = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:40], VOCAB), str(root / "tokenizer"))
    return paths


def _upload(local_folder_or_file: str, url: str) -> str:
    fs, path = fsx.filesystem(url)
    fs.put(local_folder_or_file, path, recursive=os.path.isdir(local_folder_or_file))
    return url


def _stories(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _marin(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- tokenize, status, explain --------------------------------------------------------------------


def test_tokenize_graph_runs_under_a_url_prefix_and_is_cached_there(prefix, local_inputs):
    handle = tokenized("tokenized/stories", local_inputs["train"], local_inputs["tokenizer"],
                       validation=local_inputs["validation"])
    report = StepRunner(prefix=prefix).run([handle])
    assert report.ran == ["tokenized/stories"]
    output = StepRunner(prefix=prefix).output_path_for(handle)
    assert output.startswith(prefix + "/tokenized/stories-")
    result = load_artifact(output, TokenizedDataset).result
    assert result.cache_path("train").startswith(output)
    expected = tokenizers.Tokenizer.from_file(os.path.join(local_inputs["tokenizer"], "tokenizer.json"))
    cache = TokenCache.open(result.cache_path("validation"))
    first = _stories(local_inputs["validation"])[0]
    assert cache.num_documents == 10 and cache.document(0).tolist() == expected.encode(first).ids + [EOS]
    assert StepRunner(prefix=prefix).run([handle]).cached == ["tokenized/stories"]


def test_inputs_and_tokenizer_on_the_object_store_are_read_from_there(prefix, local_inputs):
    inputs = prefix.rsplit("/", 1)[0] + "/inputs"
    train = _upload(local_inputs["train"], fsx.join(inputs, "train.jsonl"))
    validation = _upload(local_inputs["validation"], fsx.join(inputs, "validation.jsonl"))
    tokenizer = _upload(local_inputs["tokenizer"], fsx.join(inputs, "tokenizer"))
    remote = tokenized("tokenized/stories", train, tokenizer, validation=validation)
    local = tokenized("tokenized/stories", local_inputs["train"], local_inputs["tokenizer"],
                      validation=local_inputs["validation"])
    StepRunner(prefix=prefix).run([remote])
    result = load_artifact(StepRunner(prefix=prefix).output_path_for(remote), TokenizedDataset).result
    assert result.splits["train"].documents == 40 and result.splits["validation"].documents == 10
    assert result.tokenizer_identity == load_tokenizer(local_inputs["tokenizer"]).identity
    assert remote.identity != local.identity  # remote files are identified by what the store reports


def test_marin_status_and_explain_read_a_url_prefix(prefix, local_inputs, capsys):
    first = tokenized("tokenized/stories", local_inputs["train"], local_inputs["tokenizer"])
    sampled = tokenized("tokenized/stories", local_inputs["train"], local_inputs["tokenizer"], 5)
    StepRunner(prefix=prefix).run([first, sampled])

    code, out, err = _marin(capsys, "status", "--prefix", prefix)
    assert code == 0, err
    assert out.count("SUCCESS") == 2 and "tokenized/stories" in out and f"{prefix}/tokenized/stories-" in out

    code, out, err = _marin(capsys, "explain", "tokenized/stories", "--prefix", prefix)
    assert code == 0, err
    assert "tokenized/stories" in out and "2 outputs exist" in out

    code, out, err = _marin(capsys, "explain", "tokenized/stories", "tokenized/stories", "--prefix", prefix)
    assert code == 0, err
    assert "sample_count changed" in out


# -- model cards ----------------------------------------------------------------------------------


def _card_graph():
    """A training step that writes what train_lm writes (without training) and an eval step on it."""

    def train(ctx) -> TrainedModel:
        fsx.atomic_write(fsx.join(ctx.output_path, "metrics.jsonl"), "".join(
            json.dumps({"step": step, "loss": 6.0 - 0.1 * step}) + "\n" for step in range(1, 11)))
        return TrainedModel(
            model_type="LlamaConfig", parameters=12_345, vocab_size=VOCAB, final_step=10, tokens_trained=640,
            final_train_loss=5.0, validation_losses={}, train_seconds=1.0, output_path=ctx.output_path,
            checkpoint_dir="", metrics_path="", eval_path="", hf_path=None, tokenizer="t",
            tokenizer_identity="sha256:" + "0" * 64, builtin_tokenizer=False,
            datasets=[DatasetUsed(name="d", weight=1.0, source="s.jsonl", builtin_source=False, train_tokens=1, validation_tokens=1)],
        )

    model = lazy_step("checkpoints/card-model", train, hash_attrs={"num_train_steps": 10})
    score = DatasetScore(loss=4.25, perplexity=70.1, bits_per_byte=3.5, tokens=100, bytes=400, documents=3,
                         split="validation", cache_path="")
    evaluation = lazy_step("evaluation/card-eval", lambda ctx: EvalResults(
        model="checkpoints/card-model", model_identity="x", model_path="", model_type="LlamaLMHeadModel",
        vocab_size=VOCAB, seq_len=32, batch_size=2, compute_dtype="float32", eval_seconds=1.0,
        datasets={"card-data": score}), deps=[model])
    return model, evaluation


def _assert_card_at(folder: str) -> None:
    text = fsx.read_text(fsx.join(folder, "MODEL_CARD.md"))
    assert text is not None and "12,345 parameters" in text and "| card-data | 4.2500 |" in text
    with fsx.open_url(fsx.join(folder, "loss_curves.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_model_card_step_reads_and_writes_the_object_store(prefix, capsys):
    model, evaluation = _card_graph()
    report = model_report("reports/card-model", model=model, evaluations=[evaluation])
    StepRunner(prefix=prefix).run([report])
    card = load_artifact(StepRunner(prefix=prefix).output_path_for(report), ModelCard).result
    assert card.markdown_path.startswith(prefix) and card.evaluations == ["evaluation/card-eval"]
    _assert_card_at(card.markdown_path.rsplit("/", 1)[0])

    # Found under the prefix without being named, and written to a URL from the command line.
    trained = StepRunner(prefix=prefix).output_path_for(model)
    elsewhere = fsx.join(prefix, "cards", "direct")
    assert write_model_card(trained, elsewhere).evaluations == ["evaluation/card-eval"]
    _assert_card_at(elsewhere)
    code, out, err = _marin(capsys, "report", "checkpoints/card-model", "--prefix", prefix,
                            "--output", fsx.join(prefix, "cards", "cli"))
    assert code == 0, err
    _assert_card_at(fsx.join(prefix, "cards", "cli"))


# -- reading a model back: eval and generate ------------------------------------------------------


def _export_step(tokenizer_folder: str, staging: str):
    """A step whose output has a train_lm-style hf/ folder (random weights), copied into the prefix."""

    def export(ctx) -> dict:
        model = LlamaLMHeadModel(TINY, VOCAB, key=jax.random.PRNGKey(0))
        local = export_llama_to_hf(model, os.path.join(staging, uuid.uuid4().hex), tokenizer_dir_or_obj=tokenizer_folder)
        hf_path = _upload(local, fsx.join(ctx.output_path, "hf"))
        return {"hf_path": hf_path}

    return lazy_step("checkpoints/tiny-random", export, hash_attrs={"seed": 0})


def test_generate_and_evaluate_read_the_hf_export_from_the_object_store(prefix, local_inputs, tmp_path):
    model = _export_step(local_inputs["tokenizer"], str(tmp_path / "staging"))
    StepRunner(prefix=prefix).run([model])
    hf = fsx.join(StepRunner(prefix=prefix).output_path_for(model), "hf")
    assert fsx.exists(fsx.join(hf, "config.json"))

    greedy = SamplingConfig(max_new_tokens=3, temperature=0.0, top_k=None, top_p=None)
    by_name = generate("checkpoints/tiny-random", ["Once upon a time"], greedy, prefix=prefix)
    assert by_name == generate(hf, ["Once upon a time"], greedy)
    assert by_name[0].startswith("Once upon a time")

    data = tokenized("tokenized/stories", local_inputs["train"], local_inputs["tokenizer"],
                     validation=local_inputs["validation"])
    evaluation = evaluate_lm("evaluation/tiny-random", model=hf, datasets=[data], batch_size=4, seq_len=32)
    StepRunner(prefix=prefix).run([evaluation])
    results = load_artifact(StepRunner(prefix=prefix).output_path_for(evaluation), EvalResults).result
    assert results.model_path == hf and results.datasets["tokenized/stories"].documents == 10


def test_a_url_no_filesystem_can_open_is_a_usage_error(capsys):
    for command in (["generate", "nosuch://bucket/run", "--prompt", "a"], ["report", "nosuch://bucket/run"]):
        code, _, err = _marin(capsys, *command)
        assert code == 2 and "the protocol 'nosuch' is unknown" in err
