"""``train_lm(...)``: declare a language-model training run as a lazy step.

The handle depends on its datasets' tokenize handles. Its identity covers what determines the
trained weights: the model config, the optimizer config, the data mixture (through the datasets'
identities and their weights), batch size, sequence length, number of steps, seed and numerics.
Where it runs (``resources``, and the device mesh they give, :mod:`levanter.trainer.mesh_choice`),
how often it checkpoints or logs, whether it is profiled, and where it writes are placement and
never enter the hash; the mesh is kept in the step's annotations (``.executor_info``) and the mesh
that ran in its artifact. A run started from existing weights
(``initialize_from=``) also depends on their identity (:mod:`marin.experiment.initial_weights`);
a run without them hashes exactly as before. So do ``lora=`` (train adapters, export the merged
model to ``hf/`` and the adapters to ``hf-adapter/``) and ``dpo=`` (preference training, declared
through :func:`marin.experiment.dpo.dpo`): in the hash only when given, as is ``evals=`` (lm-eval
tasks run on the live weights every ``eval_harness_every`` steps and at the end, logged as
``harness/<task>/<metric>``; the final results are kept in the artifact for the model card).

The output folder holds ``checkpoints/``, ``metrics.jsonl``, ``eval.json`` and ``hf/`` (the final
model in Hugging Face format, with its tokenizer), and ``profile/`` when ``profile=`` asks for a
trace; the artifact is a :class:`TrainedModel`. What the step does when it runs is in
:mod:`marin.experiment.train_step`; the record of it is built here, beside its class, whose module
every saved artifact names.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fray.cluster import ResourceConfig
from levanter.compat.hf_format import read_hf_config
from levanter.lora import LoraConfig
from levanter.optim import AdamConfig, OptimizerConfig
from levanter.trainer.dpo import DpoConfig
from levanter.trainer import MeshConfig, ProfileConfig, TrainerConfig
from levanter.trainer.mesh_choice import choose_mesh
from marin.evaluation.harness import HarnessConfigError, HarnessResults, HarnessSettings, include_path_identity, lm_eval_version
from marin.evaluation.tasks import TASKS_DIR
from marin.execution.artifact import register_result_type
from marin.execution.lazy import LazyStep, lazy_step
from marin.experiment.initial_weights import InitializeFrom, resolve_initial_weights
from marin.experiment.describe import describe_optimizer, model_family
from marin.experiment.train_step import (
    SAMPLE_PROMPTS,
    TrainConfigError,
    TrainingRequest,
    TrainingRun,
    run_training,
)
from marin.processing.preference import PreferenceTokenizeConfig
from marin.processing.tokenize import TokenizedDataset

logger = logging.getLogger(__name__)

# Bumped when the training step's outputs change meaning, so old runs are never reused for it.
TRAIN_STEP_VERSION = "1"


@dataclass(frozen=True)
class DatasetUsed:
    """One dataset of the mixture, as the trained model saw it."""

    name: str
    weight: float
    source: str
    builtin_source: bool
    train_tokens: int
    validation_tokens: int | None


@dataclass(frozen=True)
class MeshUsed:
    """The device mesh a run trained on: each axis's size, and the processes (hosts) that fed it."""

    data: int
    fsdp: int
    experts: int
    model: int
    processes: int

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.experts * self.model

    def describe(self) -> str:
        axes = MeshConfig(data=self.data, fsdp=self.fsdp, experts=self.experts, model=self.model).describe()
        hosts = f" in {self.processes} processes" if self.processes > 1 else ""
        return f"{axes}: {self.devices} device{'s' if self.devices > 1 else ''}{hosts}"


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
    initialized_from: str | None = None  # what the run started from, when not random weights
    adapter_path: str | None = None  # LoRA runs: the PEFT adapter folder (hf/ holds the merged model)
    harness: HarnessResults | None = None  # evals=...: the lm-eval tasks' results on the final weights
    # Training FLOPs per token by the model's own count (forward and backward, at this seq_len and
    # vocabulary); None for records made before it was kept, and for models that do not count them.
    flops_per_token: float | None = None
    mesh: MeshUsed | None = None  # None for records made before it was kept
    # The optimizer's record (OptimizerConfig.to_dict()), and the Hugging Face architecture the
    # export was written as ("Olmo2ForCausalLM": a Llama config with OLMo 2's norms); None for
    # records made before they were kept, and (architecture) for runs without an export.
    optimizer: dict[str, Any] | None = None
    architecture: str | None = None

    @property
    def training_flops(self) -> float | None:
        """The compute the run spent: FLOPs per token times the tokens trained."""
        return None if self.flops_per_token is None else self.flops_per_token * self.tokens_trained

    def summary(self) -> str:
        """What a person wants to see when the run ends (printed by the runner)."""
        lines = [f"Trained {model_family(self.model_type, self.architecture)} ({self.parameters:,} parameters) for "
                 f"{self.final_step} steps, {self.tokens_trained:,} tokens, in {self.train_seconds:.0f} s."]
        if self.optimizer:
            lines.append(f"  optimizer:   {describe_optimizer(self.optimizer)}")
        for d in self.datasets:
            origin = "BUILT-IN OFFLINE corpus" if d.builtin_source else "source"
            lines.append(f"  data:        {d.name} (weight {d.weight:g}), {origin}: {d.source}")
        if self.initialized_from:
            lines.append(f"  started from: {self.initialized_from}")
        tok_origin = "BUILT-IN OFFLINE tokenizer trained by this project" if self.builtin_tokenizer else "tokenizer"
        lines.append(f"  tokenizer:   {tok_origin} at {self.tokenizer} (vocab {self.vocab_size:,})")
        if self.mesh is not None:
            lines.append(f"  mesh:        {self.mesh.describe()}")
        loss = "n/a" if self.final_train_loss is None else f"{self.final_train_loss:.3f}"
        lines.append(f"  train loss:  {loss}")
        for name, value in self.validation_losses.items():
            lines.append(f"  valid loss:  {value:.3f} ({name})")
        lines.append(f"  checkpoints: {self.checkpoint_dir}")
        lines.append(f"  metrics:     {self.metrics_path}")
        lines.append(f"  HF export:   {self.hf_path or 'none (no Hugging Face format for this model family)'}")
        if self.harness is not None:
            for task, metrics in self.harness.tasks.items():
                shown = ", ".join(f"{metric} {value:.4f}" for metric, value in metrics.items() if "_stderr" not in metric)
                lines.append(f"  harness:     {task}: {shown}")
        for i, text in enumerate(self.samples, 1):
            lines.append(f"  sample {i}:    " + " ".join(text.split()))
        return "\n".join(lines)


def train_lm(
    name: str,
    *,
    model: Any = None,
    datasets: Mapping[LazyStep, float],
    batch_size: int,
    seq_len: int,
    num_train_steps: int,
    optimizer: OptimizerConfig | None = None,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    mesh: MeshConfig | None = None,
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
    initialize_from: LazyStep | str | InitializeFrom | None = None,
    resume_optimizer: bool = False,
    lora: LoraConfig | None = None,
    dpo: DpoConfig | None = None,
    on_cut_conversation: str = "warn",
    evals: Sequence[str] = (),
    eval_harness_every: int | None = None,
    eval_harness_limit: int | None = None,
) -> LazyStep:
    """A lazy handle that trains ``model`` on the weighted mixture ``datasets`` (``{tokenized handle: weight}``).

    ``resources`` defaults to the local CPU; the device mesh comes from them (every chip of a TPU
    slice on fsdp, slices on data; see :mod:`levanter.trainer.mesh_choice`) unless ``mesh=MeshConfig(
    data=..., fsdp=..., model=..., experts=...)`` names one. Either is checked here against the
    devices, the batch and the model's heads and experts (``MeshConfigError``), and neither enters
    the hash. ``profile=ProfileConfig(start_step, num_steps)``
    writes a ``jax.profiler`` trace of those steps to ``<output>/profile/`` (docs/training.md).
    ``initialize_from`` starts from existing weights instead of random ones: another ``train_lm``
    handle, a Hugging Face folder or model id, or a checkpoint folder; ``model`` may then be left
    out for a handle or a Hugging Face model (its config is read from the weights).
    ``resume_optimizer=True`` also takes the optimizer state of our own checkpoint.
    ``lora=LoraConfig(...)`` trains low-rank adapters on the (initial) model instead of its weights.
    ``dpo=`` trains on preference pairs; declare it with :func:`marin.experiment.dpo.dpo`.
    ``on_cut_conversation``: for chat datasets, ``"warn"`` logs how many conversations the
    ``seq_len`` windows cut and how many reply tokens that costs, ``"refuse"`` fails the step before
    training instead (data whose windows hold no reply at all is refused either way); not part of
    the hash, since it never changes what a run that trains learns.
    ``evals=["marin_object_colours", ...]`` runs those lm-eval tasks (lm-eval's own, or the project's
    in :data:`marin.evaluation.tasks.TASKS_DIR`) on the live weights every ``eval_harness_every``
    steps and after the last, on at most ``eval_harness_limit`` documents per task; no checkpoint
    is written for them (docs/evaluation.md).
    Nothing runs until the handle is lowered and run.
    """
    optimizer = optimizer or AdamConfig(learning_rate=3e-4)
    if not isinstance(optimizer, OptimizerConfig):
        raise TrainConfigError(
            f"optimizer must be an optimizer config such as AdamConfig(learning_rate=6e-4), got {type(optimizer).__name__}."
        )
    resources = resources or ResourceConfig.with_cpu()
    initial = _initial_weights(initialize_from, resume_optimizer)
    model = _model_of(model, initial)
    _check_request(model, datasets, batch_size, seq_len, num_train_steps)
    _check_objective_data(datasets, dpo, batch_size, microbatch_size)
    if on_cut_conversation not in ("warn", "refuse"):
        raise TrainConfigError(f"on_cut_conversation must be 'warn' or 'refuse', got {on_cut_conversation!r}.")
    if lora is not None and not isinstance(lora, LoraConfig):
        raise TrainConfigError(f"lora must be a LoraConfig(r=..., target_modules=...), got {type(lora).__name__}.")
    if lora is not None and resume_optimizer:
        raise TrainConfigError("A LoRA run trains new adapters: there is no optimizer state to resume; drop resume_optimizer.")
    if initial is not None:
        initial.check_fits(model, optimizer)
    mesh = choose_mesh(resources, model, batch_size, microbatch_size=microbatch_size, mesh=mesh)
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
        mesh=mesh,
    )
    harness = _harness_settings(evals, eval_harness_every, eval_harness_limit, compute_dtype, seed)
    weights = {handle: float(weight) for handle, weight in datasets.items()}
    request = TrainingRequest(model, optimizer, trainer, weights, seq_len, num_samples, initial, lora=lora, dpo=dpo,
                              on_cut_conversation=on_cut_conversation, harness=harness, harness_every=eval_harness_every)

    def run(ctx) -> TrainedModel:
        return _trained_model(request, run_training(ctx, request))

    run.training_request = request  # what `marin plan` compiles (training_request_of)

    hash_attrs = {
        "model": model,  # a frozen dataclass: hashed with its class name
        "optimizer": optimizer.to_dict(),
        # Weights are listed in dependency order; the engine hashes each dependency's identity.
        "mixture": [[handle.name, weight] for handle, weight in weights.items()],
        "seq_len": seq_len,
        # batch_size, num_train_steps, seed, numerics: the trainer settings marked as hashed.
        **trainer.hashed_settings(),
        "format": TRAIN_STEP_VERSION,
    }
    if initial is not None:
        # Only then: a run from random weights keeps the hash it always had.
        hash_attrs["initialize_from"] = initial.hash_attr()
    if lora is not None:
        hash_attrs["lora"] = lora
    if dpo is not None:
        hash_attrs["dpo"] = dpo
    if harness is not None:
        # What the recorded harness results depend on (the weights trained do not).
        hash_attrs["harness"] = {"tasks": list(harness.tasks), "every": eval_harness_every, "limit": harness.limit,
                                 "task_files": include_path_identity(TASKS_DIR), "lm_eval": lm_eval_version()}
    return lazy_step(
        name,
        run,
        deps=tuple(weights) + (initial.deps if initial is not None else ()),
        hash_attrs=hash_attrs,
        version=version,
        resources=resources,
        output_path=output_path,
        # Placement, beside the resources it comes from: recorded in .executor_info, shown by a dry run.
        annotations={"mesh": mesh.sizes()},
    )


def training_request_of(step: LazyStep) -> TrainingRequest | None:
    """What a training step (``train_lm``, ``sft``, ``dpo``) was declared with; None for any other step."""
    request = getattr(getattr(step.fn, "fn", None), "training_request", None)
    return request if isinstance(request, TrainingRequest) else None


def _harness_settings(evals: Any, every: Any, limit: Any, compute_dtype: str, seed: int) -> HarnessSettings | None:
    if isinstance(evals, str) or not all(isinstance(task, str) and task for task in evals):
        raise HarnessConfigError(f"evals must be a list of lm-eval task names such as ['marin_object_colours'], got {evals!r}.")
    for label, value in (("eval_harness_every", every), ("eval_harness_limit", limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise HarnessConfigError(f"{label} must be a positive integer or None, got {value!r}.")
    if not evals:
        if every is not None or limit is not None:
            raise HarnessConfigError("eval_harness_every and eval_harness_limit need evals=[task names] to run.")
        return None
    return HarnessSettings(tasks=tuple(evals), include_path=TASKS_DIR, limit=limit, compute_dtype=compute_dtype, seed=seed)


def _initial_weights(initialize_from: Any, resume_optimizer: Any) -> InitializeFrom | None:
    if initialize_from is None:
        if resume_optimizer:
            raise TrainConfigError("resume_optimizer=True needs initialize_from= (the checkpoint whose optimizer state to take).")
        return None
    return resolve_initial_weights(initialize_from, resume_optimizer=resume_optimizer)


def _model_of(model: Any, initial: InitializeFrom | None) -> Any:
    """The declared model config, else the initial weights' own."""
    if model is not None:
        return model
    if initial is not None and initial.model is not None:
        return initial.model
    if initial is not None:
        raise TrainConfigError(
            f"train_lm needs model= here: the config of {initial.source} cannot be read from the weights. Pass the "
            "config it was trained with (e.g. model=llama_nano)."
        )
    raise TrainConfigError("train_lm needs model=, a model config such as LlamaConfig(...) (see experiments/llama.py).")


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


def _check_objective_data(datasets: Mapping[LazyStep, float], dpo: DpoConfig | None, batch_size: int,
                          microbatch_size: int | None) -> None:
    """Preference pairs go to DPO only, and DPO takes nothing else."""
    pairs = [h.name for h in datasets if isinstance(h, LazyStep) and isinstance(h.hash_attrs.get("preference"), PreferenceTokenizeConfig)]
    if dpo is None:
        if pairs:
            raise TrainConfigError(
                f"{', '.join(pairs)} holds preference pairs (chosen and rejected replies); training on them as text would "
                "learn the rejected replies too. Train on them with dpo(...), or declare conversations with chat_dataset(...)."
            )
        return
    others = [h.name if isinstance(h, LazyStep) else repr(h) for h in datasets if not (isinstance(h, LazyStep) and h.name in pairs)]
    if others or len(pairs) != 1:
        raise TrainConfigError(
            "dpo trains on exactly one preference_dataset(...) of (prompt, chosen, rejected) records"
            + (f"; {', '.join(others)} {'is' if len(others) == 1 else 'are'} not one." if others else f"; got {len(pairs)}.")
        )
    for label, rows in (("batch_size", batch_size), ("microbatch_size", microbatch_size)):
        if rows is not None and rows % 2:
            raise TrainConfigError(f"dpo needs an even {label} (two rows per pair: chosen and rejected), got {rows}.")


def _trained_model(request: TrainingRequest, run: TrainingRun) -> TrainedModel:
    """The step's result record, from what the run produced and read."""
    first, training = run.first_dataset, run.training
    return TrainedModel(
        model_type=type(request.model).__name__,
        parameters=int(request.model.num_parameters(first.vocab_size)),
        vocab_size=first.vocab_size,
        final_step=training.final_step,
        tokens_trained=training.final_step * request.trainer.batch_size * request.seq_len,
        final_train_loss=training.final_train_loss,
        validation_losses=dict(training.eval_losses),
        train_seconds=run.seconds,
        output_path=training.output_path,
        checkpoint_dir=training.checkpoint_dir,
        metrics_path=training.metrics_path,
        eval_path=training.eval_path,
        hf_path=training.hf_path,
        tokenizer=first.tokenizer_source,
        tokenizer_identity=first.tokenizer_identity,
        # As the tokenize steps recorded it, from the results of the steps that built their inputs.
        builtin_tokenizer=any(result.builtin_tokenizer for result in run.datasets.values()),
        datasets=[_dataset_used(handle, weight, run.datasets[handle]) for handle, weight in request.weights.items()],
        samples=run.samples,
        initialized_from=request.initialize_from.description if request.initialize_from is not None else None,
        adapter_path=training.adapter_path,
        harness=run.harness,
        flops_per_token=flops_per_token_of(request.model, first.vocab_size, request.seq_len),
        mesh=MeshUsed(**training.mesh, processes=training.process_count) if training.mesh else None,
        optimizer=request.optimizer.to_dict(),
        architecture=_architecture(training.hf_path),
    )


def _architecture(hf_path: str | None) -> str | None:
    """The architecture the export's ``config.json`` names (``LlamaForCausalLM``), if there is an export."""
    if hf_path is None:
        return None
    architectures = read_hf_config(hf_path).get("architectures") or [None]
    return architectures[0] if isinstance(architectures[0], str) else None


def flops_per_token_of(model: Any, vocab_size: int, seq_len: int) -> float | None:
    """Training FLOPs per token by the model config's own count; None for configs that do not count them."""
    count = getattr(model, "flops_per_token", None)
    return float(count(vocab_size, seq_len)) if callable(count) else None


def _dataset_used(handle: LazyStep, weight: float, result: TokenizedDataset) -> DatasetUsed:
    validation = result.splits.get("validation")
    return DatasetUsed(
        name=handle.name,
        weight=weight,
        source=_describe(result.source, handle),
        builtin_source=result.builtin_source,
        train_tokens=result.splits["train"].tokens,
        validation_tokens=validation.tokens if validation is not None else None,
    )


def _describe(source: Mapping[str, Any], handle: LazyStep) -> str:
    """The tokenized data's source in words, for the summary a person reads."""
    if source.get("kind") == "step" and handle.deps:
        # A step source's identity is only its kind (the step's own identity is hashed through the
        # deps); tokenized() lists the source step first among the handle's deps.
        return f"the output of step {handle.deps[0].name}"
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
    return ", ".join(f"{key} {value}" for key, value in source.items()) or "unknown"
