"""``train_lm()``: a lazy training step over tokenized handles, its artifact, summary and caching."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.records.executor_files import read_info
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.train import MeshUsed, TrainConfigError, TrainedModel, train_lm

TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=128)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, synthetic_stories):
    root = tmp_path_factory.mktemp("inputs")
    for name, texts in (("train", synthetic_stories[:150]), ("validation", synthetic_stories[300:330])):
        (root / f"{name}.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    save_tokenizer(train_bpe_tokenizer(synthetic_stories[:150], 512), str(root / "tokenizer"))
    return root


def _model(inputs, steps: int, **kwargs):
    data = tokenized(
        "tokenized/stories",
        str(inputs / "train.jsonl"),
        str(inputs / "tokenizer"),
        validation=str(inputs / "validation.jsonl"),
    )
    model = train_lm(
        name="checkpoints/tiny",
        model=TINY,
        optimizer=AdamConfig(learning_rate=3e-3),
        datasets={data: 1.0},
        batch_size=8,
        seq_len=128,
        num_train_steps=steps,
        num_samples=1,
        **kwargs,
    )
    return data, model


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def first_run(inputs, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("prefix"))
    data, model = _model(inputs, steps=6)
    messages = _Messages()
    root = logging.getLogger()
    level = root.level
    root.addHandler(messages)
    root.setLevel(logging.INFO)
    # Earlier tests in the same process may have trained with nobody's logging set up, and then
    # levanter gave its logger a handler of its own and stopped it propagating (train_lm's
    # _ensure_logging): these lines must reach the root all the same.
    ours = [logging.getLogger(name) for name in ("levanter", "levanter.trainer", "marin.experiment.train_step",
                                                 "marin.execution.step_runner")]
    saved = [(logger, logger.disabled, logger.level, logger.propagate) for logger in ours]
    for logger in ours:
        logger.disabled, logger.level, logger.propagate = False, logging.NOTSET, True
    try:
        report = StepRunner(prefix=prefix).run([model])
    finally:
        root.removeHandler(messages)
        root.setLevel(level)
        for logger, disabled, logger_level, propagate in saved:
            logger.disabled, logger.level, logger.propagate = disabled, logger_level, propagate
    _run_log.extend(messages.lines)
    return prefix, data, model, report


_run_log: list[str] = []  # the log lines of first_run's training


def test_the_log_says_when_it_compiles_and_samples_and_how_long_each_took(first_run):
    def count(pattern):
        return sum(1 for line in _run_log if re.fullmatch(pattern, line))

    assert count(r"Compiling the training step \(or reading it from the compilation cache\)\.\.\.") == 1
    assert count(r"Compiled the training step in \d+\.\ds\.") == 1
    assert count(r"Compiled the evaluation step in \d+\.\ds\.") == 1
    assert count(r"Sampling 1 continuation\(s\) of up to 160 tokens from the exported model .*") == 1
    assert count(r"Sampled 1 continuation\(s\) in \d+\.\ds\.") == 1
    order = [next(i for i, line in enumerate(_run_log) if line.startswith(prefix))
             for prefix in ("Compiling the training step", "Compiled the training step", "Sampling 1", "Sampled 1")]
    assert order == sorted(order)


def test_training_step_writes_checkpoints_metrics_export_and_artifact(first_run):
    prefix, data, model, report = first_run
    assert set(report.ran) == {"tokenized/stories", "checkpoints/tiny"}
    out = StepRunner(prefix=prefix).output_path_for(model)
    result = load_artifact(out, TrainedModel).result
    assert result.final_step == 6 and result.tokens_trained == 6 * 8 * 128
    assert result.final_train_loss is not None and set(result.validation_losses) == {"tokenized/stories"}
    assert os.path.exists(os.path.join(result.hf_path, "config.json"))
    assert os.path.exists(os.path.join(result.hf_path, "tokenizer.json"))
    steps = [json.loads(line)["step"] for line in open(result.metrics_path) if '"loss"' in line]
    assert steps == list(range(1, 7))
    assert len(result.samples) == 1 and result.samples[0].startswith("Once upon a time")
    assert result.datasets[0].builtin_source is False and result.builtin_tokenizer is False
    # The mesh: the one with_cpu() gives in the step's record of what ran, the one that ran in its result.
    assert read_info(out)["annotations"]["mesh"] == {"data": 1, "fsdp": 1, "experts": 1, "model": 1}
    assert result.mesh == MeshUsed(data=1, fsdp=1, experts=1, model=1, processes=1)
    assert "  mesh:        data=1 x fsdp=1 x experts=1 x model=1: 1 device" in result.summary()


def test_rerun_is_cached_and_still_prints_the_summary(first_run, capsys):
    prefix, _, model, _ = first_run
    capsys.readouterr()
    report = StepRunner(prefix=prefix).run([model])
    assert not report.ran and report.cached == ["checkpoints/tiny"] and report.not_needed == ["tokenized/stories"]
    printed = capsys.readouterr().out
    assert "== checkpoints/tiny" in printed and "train loss:" in printed and "sample 1:" in printed


def test_changing_num_train_steps_retrains_without_retokenizing(first_run, inputs):
    prefix, data, _, _ = first_run
    _, longer = _model(inputs, steps=8)
    report = StepRunner(prefix=prefix).run([longer])
    assert report.ran == ["checkpoints/tiny"]
    assert report.cached == ["tokenized/stories"]


def test_placement_does_not_change_identity(inputs):
    from fray.cluster import ResourceConfig

    from levanter.trainer import MeshConfig

    _, on_cpu = _model(inputs, steps=6)
    _, on_gpu = _model(inputs, steps=6, resources=ResourceConfig.with_gpu("H100", 8), steps_per_checkpoint=2)
    # Two slices of four chips, then the same with tensor parallelism over the model's two heads.
    _, on_a_pod = _model(inputs, steps=6, resources=ResourceConfig.with_tpu("v5litepod-4", slice_count=2))
    _, tensor_parallel = _model(inputs, steps=6, resources=ResourceConfig.with_tpu("v5litepod-4", slice_count=2),
                                mesh=MeshConfig(data=2, fsdp=2, model=2))
    runner = StepRunner(prefix="/tmp/unused-prefix")
    assert {runner.output_path_for(step) for step in (on_cpu, on_gpu, on_a_pod, tensor_parallel)} == {runner.output_path_for(on_cpu)}
    # What does change: the mesh each one trains on.
    assert [step.annotations["mesh"] for step in (on_cpu, on_gpu, on_a_pod, tensor_parallel)] == [
        {"data": 1, "fsdp": 1, "experts": 1, "model": 1}, {"data": 1, "fsdp": 8, "experts": 1, "model": 1},
        {"data": 2, "fsdp": 4, "experts": 1, "model": 1}, {"data": 2, "fsdp": 2, "experts": 1, "model": 2}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seq_len": 4096}, "seq_len=4096 is longer than the model's max_seq_len=128"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"datasets": {}}, "needs at least one dataset"),
        ({"datasets": {"tokenized/stories": 1.0}}, "datasets keys must be tokenized"),
    ],
)
def test_impossible_requests_fail_when_declared(inputs, kwargs, message):
    data = tokenized("tokenized/unused", str(inputs / "validation.jsonl"), str(inputs / "tokenizer"))
    args = dict(name="checkpoints/bad", model=TINY, datasets={data: 1.0}, batch_size=4, seq_len=128, num_train_steps=1)
    args.update(kwargs)
    with pytest.raises(TrainConfigError, match=message):
        train_lm(**args)


def test_tutorial_variant_without_resources_uses_the_local_cpu(inputs):
    # The tutorial's variant: ResourceConfig from iris.cluster, or no resources= at all.
    from fray.cluster import ResourceConfig as FrayResourceConfig
    from iris.cluster import ResourceConfig

    assert ResourceConfig is FrayResourceConfig
    _, implicit = _model(inputs, steps=6)
    _, explicit = _model(inputs, steps=6, resources=ResourceConfig.with_cpu())
    assert implicit.resources == ResourceConfig.with_cpu()
    assert implicit == explicit
