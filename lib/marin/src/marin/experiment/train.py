"""``train_lm(...)``: declare a language-model training run as a lazy step.

The handle depends on its datasets' tokenize handles. Its identity covers what determines the
trained weights: the model config, the optimizer config, the data mixture (through the datasets'
identities and their weights), batch size, sequence length, number of steps, seed and numerics.
Where it runs (``resources``), how often it checkpoints or logs, whether it is profiled, and where
it writes are placement and never enter the hash.

The output folder holds ``checkpoints/``, ``metrics.jsonl``, ``eval.json`` and ``hf/`` (the final
model in Hugging Face format, with its tokenizer), and ``profile/`` when ``profile=`` asks for a
trace; the artifact is a :class:`TrainedModel`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax

from fray.cluster import ResourceConfig
from levanter.data import build_text_data
from levanter.distributed import initialize_distributed
from levanter.inference import SamplingConfig, generate_text
from levanter.main.train_lm import TrainLmConfig
from levanter.main.train_lm import train_lm as run_training
from levanter.optim import AdamConfig, OptimizerConfig
from levanter.tokenization import load_tokenizer
from levanter.trainer import ProfileConfig, TrainerConfig
from levanter.trainer.stopping import StopAction, StopRequest, StopSource
from marin.datasets.builtin_tokenizer import STEP_NAME as BUILTIN_TOKENIZER_STEP
from marin.execution.artifact import register_result_type
from marin.execution.lazy import LazyStep, lazy_step
from marin.execution.step_context import StopReason
from marin.experiment.data import cache_sources
from marin.processing.tokenize import TokenizedDataset

logger = logging.getLogger(__name__)

# Bumped when the training step's outputs change meaning, so old runs are never reused for it.
TRAIN_STEP_VERSION = "1"

SAMPLE_PROMPTS = ("Once upon a time", "One day, a little", "There was a")


class TrainConfigError(ValueError):
    """A training request that cannot work as written (caught when it is declared)."""


@dataclass(frozen=True)
class DatasetUsed:
    """One dataset of the mixture, as the trained model saw it."""

    name: str
    weight: float
    source: str
    builtin_source: bool
    train_tokens: int
    validation_tokens: int | None


@register_result_type
@dataclass(frozen=True)
class TrainedModel:
    """The result of a ``train_lm`` step (its ``.artifact.json``)."""

    model_type: str
    parameters: int
    vocab_size: int
    final_step: int
    tokens_trained: int
    final_train_loss: float | None
    validation_losses: dict[str, float]
    train_seconds: float
    output_path: str
    checkpoint_dir: str
    metrics_path: str
    eval_path: str
    hf_path: str | None
    tokenizer: str
    tokenizer_identity: str
    builtin_tokenizer: bool
    datasets: list[DatasetUsed] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """What a person wants to see when the run ends (printed by the runner)."""
        family = self.model_type.removesuffix("Config")
        lines = [f"Trained {family} ({self.parameters:,} parameters) for {self.final_step} steps, "
                 f"{self.tokens_trained:,} tokens, in {self.train_seconds:.0f} s."]
        for d in self.datasets:
            origin = "BUILT-IN OFFLINE corpus" if d.builtin_source else "source"
            lines.append(f"  data:        {d.name} (weight {d.weight:g}), {origin}: {d.source}")
        tok_origin = "BUILT-IN OFFLINE tokenizer trained by this project" if self.builtin_tokenizer else "tokenizer"
        lines.append(f"  tokenizer:   {tok_origin} at {self.tokenizer} (vocab {self.vocab_size:,})")
        loss = "n/a" if self.final_train_loss is None else f"{self.final_train_loss:.3f}"
        lines.append(f"  train loss:  {loss}")
        for name, value in self.validation_losses.items():
            lines.append(f"  valid loss:  {value:.3f} ({name})")
        lines.append(f"  checkpoints: {self.checkpoint_dir}")
        lines.append(f"  metrics:     {self.metrics_path}")
        lines.append(f"  HF export:   {self.hf_path or 'none (no Hugging Face format for this model family)'}")
        for i, text in enumerate(self.samples, 1):
            lines.append(f"  sample {i}:    " + " ".join(text.split()))
        return "\n".join(lines)


def train_lm(
    name: str,
    *,
    model: Any,
    datasets: Mapping[LazyStep, float],
    batch_size: int,
    seq_len: int,
    num_train_steps: int,
    optimizer: OptimizerConfig | None = None,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    seed: int = 0,
    microbatch_size: int | None = None,
    z_loss_weight: float = 0.0,
    compute_dtype: str = "auto",
    eval_every: int | None = None,
    steps_per_checkpoint: int | None = None,
    minutes_per_checkpoint: float | None = 10.0,
    trackers: Sequence[str] = ("jsonl",),
    num_samples: int = len(SAMPLE_PROMPTS),
    output_path: str | None = None,
    profile: ProfileConfig | None = None,
) -> LazyStep:
    """A lazy handle that trains ``model`` on the weighted mixture ``datasets`` (``{tokenized handle: weight}``).

    ``resources`` defaults to the local CPU. ``profile=ProfileConfig(start_step, num_steps)``
    writes a ``jax.profiler`` trace of those steps to ``<output>/profile/`` (docs/training.md).
    Nothing runs until the handle is lowered and run.
    """
    optimizer = optimizer or AdamConfig(learning_rate=3e-4)
    if not isinstance(optimizer, OptimizerConfig):
        raise TrainConfigError(
            f"optimizer must be an optimizer config such as AdamConfig(learning_rate=6e-4), got {type(optimizer).__name__}."
        )
    resources = resources or ResourceConfig.with_cpu()
    _check_request(model, datasets, batch_size, seq_len, num_train_steps)
    trainer = TrainerConfig(
        num_train_steps=num_train_steps,
        batch_size=batch_size,
        microbatch_size=microbatch_size,
        z_loss_weight=z_loss_weight,
        compute_dtype=compute_dtype,
        seed=seed,
        eval_every=eval_every,
        steps_per_checkpoint=steps_per_checkpoint,
        minutes_per_checkpoint=minutes_per_checkpoint,
        trackers=tuple(trackers),
        profile=profile,
    )
    weights = {handle: float(weight) for handle, weight in datasets.items()}

    def run(ctx) -> TrainedModel:
        return _train(ctx, model, optimizer, trainer, weights, seq_len, num_samples)

    return lazy_step(
        name,
        run,
        deps=tuple(weights),
        hash_attrs={
            "model": model,  # a frozen dataclass: hashed with its class name
            "optimizer": optimizer.to_dict(),
            # Weights are listed in dependency order; the engine hashes each dependency's identity.
            "mixture": [[handle.name, weight] for handle, weight in weights.items()],
            "batch_size": batch_size,
            "seq_len": seq_len,
            "num_train_steps": num_train_steps,
            "seed": seed,
            "microbatch_size": microbatch_size,
            "z_loss_weight": z_loss_weight,
            "compute_dtype": compute_dtype,
            "format": TRAIN_STEP_VERSION,
        },
        version=version,
        resources=resources,
        output_path=output_path,
    )


def _check_request(model: Any, datasets: Mapping[LazyStep, float], batch_size: int, seq_len: int, steps: int) -> None:
    for label, value in (("batch_size", batch_size), ("seq_len", seq_len), ("num_train_steps", steps)):
        # bool is an int subclass, but True as a count is always a slip (a flag passed by mistake).
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TrainConfigError(f"{label} must be a positive integer, got {value!r}.")
    if seq_len < 2:
        raise TrainConfigError(
            f"seq_len={seq_len} is too short: a training window needs at least 2 tokens, since each position "
            "learns to predict the next token (seq_len tokens give seq_len - 1 predictions)."
        )
    if not datasets:
        raise TrainConfigError("train_lm needs at least one dataset: datasets={tokenized(...): 1.0}.")
    for handle, weight in datasets.items():
        if not isinstance(handle, LazyStep):
            raise TrainConfigError(
                f"datasets keys must be tokenized(...) handles, got {type(handle).__name__}; "
                "write datasets={tokenized(name=..., source=..., tokenizer=...): 1.0}."
            )
        try:
            usable = not isinstance(weight, (bool, str)) and 0 < float(weight) < float("inf")  # NaN fails both
        except (TypeError, ValueError):
            usable = False
        if not usable:
            raise TrainConfigError(f"dataset {handle.name!r} has weight {weight!r}; weights must be positive, finite numbers.")
    max_len = getattr(model, "max_seq_len", None)
    if max_len is not None and seq_len > max_len:
        raise TrainConfigError(
            f"seq_len={seq_len} is longer than the model's max_seq_len={max_len}. Use seq_len <= {max_len}, "
            f"or a model config with max_seq_len >= {seq_len} (dataclasses.replace(model, max_seq_len={seq_len}))."
        )


def _train(ctx, model_config, optimizer, trainer: TrainerConfig, weights, seq_len: int, num_samples: int) -> TrainedModel:
    tokenized = {handle: ctx.load_artifact(handle, TokenizedDataset).result for handle in weights}
    identities = {result.tokenizer_identity for result in tokenized.values()}
    if len(identities) > 1:
        names = ", ".join(f"{h.name}: {r.tokenizer_identity[:19]}" for h, r in tokenized.items())
        raise TrainConfigError(f"All datasets of one training run must share a tokenizer; got {names}.")
    first = next(iter(tokenized.values()))
    # Under replicas > 1 each process joins the JAX run first, then reads only its rows of each batch.
    initialize_distributed()
    data = build_text_data(
        cache_sources(ctx, weights),
        seq_len=seq_len,
        batch_size=trainer.batch_size,
        seed=trainer.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        # Every cache's largest token id must fit the model's embedding table (an id past it is an
        # out-of-range gather, which XLA turns into silent garbage, not an error).
        vocab_size=first.vocab_size,
    )

    started = time.perf_counter()
    result = run_training(
        TrainLmConfig(
            model=model_config,
            optimizer=optimizer,
            trainer=trainer,
            vocab_size=first.vocab_size,
            output_path=ctx.output_path,
            tokenizer=first.tokenizer_source,
        ),
        data.train,
        data.validation,
        stop_sources=[_trainer_stop_source(ctx)],
    )
    seconds = time.perf_counter() - started
    samples = _samples(result.hf_path, first.tokenizer_source, num_samples)
    return TrainedModel(
        model_type=type(model_config).__name__,
        parameters=int(model_config.num_parameters(first.vocab_size)),
        vocab_size=first.vocab_size,
        final_step=result.final_step,
        tokens_trained=result.final_step * trainer.batch_size * seq_len,
        final_train_loss=result.final_train_loss,
        validation_losses=dict(result.eval_losses),
        train_seconds=seconds,
        output_path=result.output_path,
        checkpoint_dir=result.checkpoint_dir,
        metrics_path=result.metrics_path,
        eval_path=result.eval_path,
        hf_path=result.hf_path,
        tokenizer=first.tokenizer_source,
        tokenizer_identity=first.tokenizer_identity,
        builtin_tokenizer=_is_builtin_tokenizer(ctx, weights),
        datasets=[
            DatasetUsed(
                name=handle.name,
                weight=weight,
                source=_describe(tokenized[handle].source),
                builtin_source=tokenized[handle].source.get("kind") == "builtin",
                train_tokens=tokenized[handle].splits["train"].tokens,
                validation_tokens=(tokenized[handle].splits["validation"].tokens if "validation" in tokenized[handle].splits else None),
            )
            for handle, weight in weights.items()
        ],
        samples=samples,
    )


def _trainer_stop_source(ctx) -> StopSource:
    """The step's reasons to stop, as the trainer's requests, polled between training steps.

    A lost lease abandons (another runner may be writing this folder: not even a checkpoint);
    Ctrl-C and SIGTERM preempt (checkpoint, then stop, so a rerun resumes there).
    """
    requests = {
        StopReason.LEASE_LOST: StopRequest(
            StopAction.ABANDON,
            f"step {ctx.step.name!r} lost its lease on {ctx.output_path} (another runner may be writing there)",
        ),
        StopReason.INTERRUPTED: StopRequest(StopAction.PREEMPT, "the run was interrupted (Ctrl-C)"),
        StopReason.PREEMPTED: StopRequest(StopAction.PREEMPT, "the runner received SIGTERM (preemption)"),
    }
    return lambda: requests.get(ctx.stop_reason())


def _describe(source: Mapping[str, Any]) -> str:
    if source.get("kind") == "builtin":
        return (f"{source.get('generator')} v{source.get('generator_version')} (seed {source.get('seed')}), "
                f"standing in for {source.get('stands_in_for')}")
    for key in ("description", "repo_id"):
        if isinstance(source.get(key), str):
            return source[key]
    splits = source.get("splits")
    if isinstance(splits, Mapping):
        # Local files: name each split's files (their digests are in the artifact, not the summary).
        parts = []
        for split, files in splits.items():
            names = [f.get("name", "?") if isinstance(f, Mapping) else str(f) for f in files]
            parts.append(f"{split}: {', '.join(names)}")
        return "files (" + "; ".join(parts) + ")"
    return str(dict(source))


def _is_builtin_tokenizer(ctx, weights) -> bool:
    # The project's own offline tokenizer is the only one built by a step of the DAG.
    return any(dep.name == BUILTIN_TOKENIZER_STEP for handle in weights for dep in handle.deps)


def _samples(hf_path: str | None, tokenizer_location: str, count: int) -> list[str]:
    if not hf_path or count <= 0:
        return []
    from levanter.compat.hf_checkpoints import import_from_hf

    model = import_from_hf(hf_path)
    tokenizer = load_tokenizer(tokenizer_location)
    prompts = list(SAMPLE_PROMPTS[:count])
    return generate_text(model, tokenizer, prompts, SamplingConfig(max_new_tokens=160, temperature=0.7, top_k=40))
