"""The tokenize step and ``tokenized()``: exact counts, identity, crash-resume, tokenizer steps, errors."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from levanter.tokenization import TokenizerNotFoundError, load_tokenizer, save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lazy_step, lower
from marin.execution.ownership.step_ownership import latest_work_path
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.processing.tokenize import TokenizedDataset
from zephyr.token_cache import IncompleteTokenCacheError, TokenCache

# A tokenizer from train_bpe_tokenizer has <|endoftext|> as its first token: the EOS appended to each document.
EOS = 0


def _stories(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _write_jsonl(path: Path, texts) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return path


def _run(handle, prefix: Path) -> TokenizedDataset:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    out = runner.output_path_for(lower(handle)[-1])
    return load_artifact(out, TokenizedDataset).result


@dataclass(frozen=True)
class Inputs:
    train: Path  # 300 synthetic stories
    validation: Path  # 100 others
    tokenizer: Path  # tokenizer.json of a 500-token BPE trained on the train split


@pytest.fixture(scope="module")
def inputs(synthetic_stories, tmp_path_factory) -> Inputs:
    root = tmp_path_factory.mktemp("inputs")
    train = _write_jsonl(root / "train.jsonl", synthetic_stories[:300])
    validation = _write_jsonl(root / "validation.jsonl", synthetic_stories[300:])
    folder = save_tokenizer(train_bpe_tokenizer(synthetic_stories[:300], 500), str(root / "tokenizer"))
    return Inputs(train, validation, Path(folder) / "tokenizer.json")


def _raw_ids(tokenizer: Path, texts: list[str]) -> list[list[int]]:
    """The reference: the ``tokenizers`` library's own ids, plus the EOS each document ends with."""
    return [e.ids + [EOS] for e in tokenizers.Tokenizer.from_file(str(tokenizer)).encode_batch(texts)]


def test_shared_sample_tokenizes_exactly(real_data, tmp_path):
    gpt2 = real_data.gpt2 / "tokenizer.json"
    handle = tokenized("tokenized/tinystories-sample", str(real_data.train), str(gpt2), validation=str(real_data.validation))
    result = _run(handle, tmp_path)
    train = result.splits["train"]
    assert (train.documents, train.content_tokens, train.tokens) == (1800, 368_877, 368_877 + 1800)
    assert result.splits["validation"].documents == 200
    assert result.vocab_size == 50257 and result.eos_id == 50256 and result.bos_id is None
    raw = tokenizers.Tokenizer.from_file(str(gpt2)).encode_batch(_stories(real_data.train))
    cache = TokenCache.open(train.cache_path)
    for i, expected in enumerate(raw):
        assert cache.document(i).tolist() == expected.ids + [50256], f"document {i} differs"
    assert cache.metadata["tokenizer"] == result.tokenizer_identity == load_tokenizer(gpt2).identity
    assert cache.metadata["eos_id"] == 50256 and cache.metadata["append_eos"] is True


def test_identity_follows_content_not_location(inputs, tmp_path):
    handle = tokenized("tokenized/stories", str(inputs.train), str(inputs.tokenizer), validation=str(inputs.validation))
    shutil.copy(inputs.train, tmp_path / "train.jsonl")
    shutil.copy(inputs.validation, tmp_path / "validation.jsonl")
    shutil.copytree(inputs.tokenizer.parent, tmp_path / "tok")
    moved = tokenized("tokenized/stories", str(tmp_path / "train.jsonl"), str(tmp_path / "tok"),
                      validation=str(tmp_path / "validation.jsonl"))
    assert moved.identity == handle.identity
    with open(tmp_path / "train.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "One more story."}) + "\n")
    changed = tokenized("tokenized/stories", str(tmp_path / "train.jsonl"), str(tmp_path / "tok"),
                        validation=str(tmp_path / "validation.jsonl"))
    assert changed.identity != handle.identity
    sampled = tokenized("tokenized/stories", str(inputs.train), str(inputs.tokenizer), 100, validation=str(inputs.validation))
    assert sampled.identity != handle.identity


def test_sample_count_keeps_the_first_documents(inputs, tmp_path):
    handle = tokenized("tokenized/sample", str(inputs.train), str(inputs.tokenizer), 25)
    result = _run(handle, tmp_path)
    assert result.splits["train"].documents == 25 and set(result.splits) == {"train"}
    (first,) = _raw_ids(inputs.tokenizer, [_stories(inputs.train)[24]])
    assert TokenCache.open(result.splits["train"].cache_path).document(24).tolist() == first


def test_missing_tokenizer_path_is_a_clear_error(inputs, tmp_path):
    missing = tmp_path / "no-such-tokenizer" / "tokenizer.json"
    with pytest.raises(TokenizerNotFoundError, match="no-such-tokenizer"):
        tokenized("tokenized/x", str(inputs.train), str(missing))


def test_tokenizer_built_by_a_step(inputs, tmp_path):
    def train_tokenizer(ctx):
        tok = train_bpe_tokenizer(_stories(inputs.validation), 400)
        save_tokenizer(tok, ctx.output_path)
        return {"path": ctx.output_path, "vocab_size": tok.get_vocab_size()}

    tokenizer_step = lazy_step("tokenizers/tiny-bpe", train_tokenizer, hash_attrs={"vocab_size": 400})
    handle = tokenized("tokenized/with-bpe", str(inputs.validation), tokenizer_step, 50)
    assert tokenizer_step in handle.deps
    result = _run(handle, tmp_path)
    folder = load_artifact(StepRunner(prefix=str(tmp_path)).output_path_for(lower(tokenizer_step)[0])).result["path"]
    assert result.tokenizer_identity == load_tokenizer(folder).identity
    assert result.vocab_size == 400 and result.eos_id == 0
    assert TokenCache.open(result.splits["train"].cache_path).dtype == np.dtype("<u2")


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import zephyr.token_cache as tc
    from marin.execution.step_runner import StepRunner
    from marin.experiment.data import tokenized

    files, tokenizer, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    original = tc.TokenCacheShardWriter.write

    def write(self, document):
        # Die mid-way through the third shard: two shards finished, one half-written.
        if self.url.endswith("shard-00002") and self._documents == 40:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, document)

    tc.TokenCacheShardWriter.write = write
    StepRunner(prefix=prefix).run([tokenized("tokenized/resumable", files, tokenizer, num_shards=4, backend="inline")])
    """
)


def test_sigkill_mid_tokenize_then_rerun_gives_the_same_stream(inputs, tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    lines = inputs.train.read_text(encoding="utf-8").splitlines(keepends=True)
    for i in range(4):
        (parts / f"part-{i}.jsonl").write_text("".join(lines[i * 75 : (i + 1) * 75]), encoding="utf-8")
    prefix = tmp_path / "prefix"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(parts), str(inputs.tokenizer), str(prefix)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]

    handle = tokenized("tokenized/resumable", str(parts), str(inputs.tokenizer), num_shards=4)
    out = StepRunner(prefix=str(prefix)).output_path_for(lower(handle)[-1])
    # The killed execution's shards are in its staging folder, which the rerun continues in.
    staged = Path(latest_work_path(out)) / "train"
    assert staged.parent != Path(out)
    assert (staged / "shard-00001" / "shard.json").exists()
    assert not (staged / "shard-00002" / "shard.json").exists()
    with pytest.raises(IncompleteTokenCacheError):
        TokenCache.open(str(staged))
    finished_at = (staged / "shard-00000" / "shard.json").stat().st_mtime_ns

    resumed = _run(handle, prefix)
    cache_dir = Path(out) / "train"
    assert (cache_dir / "shard-00000" / "shard.json").stat().st_mtime_ns == finished_at  # reused, not redone
    expected = _raw_ids(inputs.tokenizer, _stories(inputs.train))
    assert resumed.splits["train"].documents == 300
    assert resumed.splits["train"].content_tokens == sum(len(ids) - 1 for ids in expected)
    reference = TokenCache.open(str(cache_dir))
    np.testing.assert_array_equal(reference.read_tokens(0, reference.num_tokens), np.concatenate(expected))
    assert [s["path"] for s in reference.ledger["shards"]] == [f"shard-0000{i}" for i in range(4)]


def test_a_step_reads_tokenized_handles_through_the_loader(inputs, tmp_path):
    handle = tokenized("tokenized/stories", str(inputs.train), str(inputs.tokenizer), validation=str(inputs.validation))
    from levanter.data import build_text_data
    from marin.experiment.data import cache_sources

    prefix = tmp_path / "prefix"
    result = _run(handle, prefix)

    def first_batch(ctx):
        data = build_text_data(cache_sources(ctx, {handle: 1.0}), seq_len=64, batch_size=2)
        batch = next(data.train.iter_from(0))
        evaluation = next(data.validation[handle.name]())
        return {"tokens": batch.tokens.tolist(), "eval_rows": int(evaluation.tokens.shape[0])}

    consumer = lazy_step("consumers/first-batch", first_batch, deps=[handle])
    out = _run_plain(consumer, prefix)  # the tokenize step is cached there already
    flat = TokenCache.open(result.splits["train"].cache_path)
    starts = [flat.read_tokens(i * 64, i * 64 + 64).tolist() for i in range(flat.num_tokens // 64)]
    assert all(row in starts for row in out["tokens"]) and out["eval_rows"] == 2


def _run_plain(handle, prefix: Path):
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    return load_artifact(runner.output_path_for(lower(handle)[-1])).result


def test_process_pool_writes_the_same_cache_as_in_process(inputs, tmp_path):
    from marin.processing.tokenize import TokenizeConfig, TokenizeInputs, run_tokenize

    lines = inputs.validation.read_text(encoding="utf-8").splitlines(keepends=True)
    files = []
    for i in range(2):
        files.append(str(tmp_path / f"part-{i}.jsonl"))
        Path(files[-1]).write_text("".join(lines[i * 50 : (i + 1) * 50]), encoding="utf-8")
    config = TokenizeConfig(source={"kind": "files"}, tokenizer=None)
    pooled = run_tokenize(config, TokenizeInputs({"train": files}, str(inputs.tokenizer)), str(tmp_path / "pooled"),
                          backend="processes").splits["train"]
    inline = run_tokenize(config, TokenizeInputs({"train": files}, str(inputs.tokenizer)), str(tmp_path / "inline"),
                          backend="inline").splits["train"]
    expected_tokens = sum(map(len, _raw_ids(inputs.tokenizer, _stories(inputs.validation))))
    assert (pooled.documents, pooled.tokens) == (inline.documents, inline.tokens) == (100, expected_tokens)
    a, b = TokenCache.open(pooled.cache_path), TokenCache.open(inline.cache_path)
    np.testing.assert_array_equal(a.read_tokens(0, a.num_tokens), b.read_tokens(0, b.num_tokens))
    assert [s["documents"] for s in a.ledger["shards"]] == [50, 50]


def test_source_built_by_a_step(inputs, tmp_path):
    def write_corpus(ctx):
        Path(ctx.output_path).mkdir(parents=True, exist_ok=True)
        for split, count in (("train", 30), ("validation", 5)):
            with open(Path(ctx.output_path) / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for i in range(count):
                    f.write(json.dumps({"text": f"{split} story number {i}."}) + "\n")
        return {"path": ctx.output_path, "split_files": {"train": "train.jsonl", "validation": "validation.jsonl"}}

    corpus = lazy_step("datasets/tiny-corpus", write_corpus, hash_attrs={"count": 30})
    handle = tokenized("tokenized/tiny-corpus", corpus, str(inputs.tokenizer))
    assert corpus in handle.deps
    result = _run(handle, tmp_path)
    assert result.splits["train"].documents == 30 and result.splits["validation"].documents == 5
    (expected,) = _raw_ids(inputs.tokenizer, ["validation story number 4."])
    assert TokenCache.open(result.splits["validation"].cache_path).document(4).tolist() == expected
