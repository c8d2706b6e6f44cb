"""Train a language model end to end: the entry point the experiment layer calls.

Output folder (a local path or any fsspec URL, e.g. ``s3://bucket/run``)::

    <output_path>/
      checkpoints/<step>/   Orbax checkpoints (resume from the newest automatically)
      metrics.jsonl         one line per step, plus eval lines at eval steps
      eval.json             final step, train loss and validation losses (and the checkpoint resumed
                            from unverified, when allow_unverified_checkpoints let it)
      hf/                   the final model in Hugging Face format (Llama or Mixtral); under LoRA the
                            merged model (base + adapters), loadable without PEFT
      hf-adapter/           under LoRA only: the adapters as a PEFT adapter folder
      profile/              a jax.profiler trace, when TrainerConfig.profile asks for one

A run can start from existing weights instead of random ones (:class:`InitialWeights`): a Hugging
Face folder, or a step of another run's checkpoints, with or without its optimizer state. They are
checked against the run before anything is trained: the same model family, the same parameter
shapes (a difference names the config field) and the same vocabulary as the data.

``lora=`` trains low-rank adapters on the initial model instead of its weights
(:mod:`levanter.lora`): the base weights are the trainer's frozen arrays, the optimizer state exists
for the adapters only. ``dpo=`` trains on preference pairs with the DPO objective
(:mod:`levanter.trainer.dpo`) against a frozen reference: the weights training starts from.
``grpo=`` trains a policy on sampled completions and their rewards (:mod:`levanter.trainer.grpo`);
its data source makes each batch with the weights the ``model_publishers`` hand it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp

from rigging import filesystem as fsx

from levanter.distributed import gathered_on_process_0, wait_for_every_process
from levanter.errors import LevanterError
from levanter.lora import (
    LoraConfig,
    LoraError,
    LoraLinear,
    apply_lora,
    export_peft_adapter,
    lora_trainable_filter,
    merge_lora,
    with_lora_dropout,
)
from levanter.optim import OptimizerConfig
from levanter.trainer import EvalSources, Trainer, TrainerConfig, TrainState
from levanter.trainer.checkpoint_errors import CheckpointMismatchError
from levanter.trainer.checkpoint_keys import flatten_state
from levanter.trainer.checkpoint_reading import read_state_fields
from levanter.trainer.compilation_cache import enable_compilation_cache
from levanter.trainer.dpo import DpoConfig, DpoObjective
from levanter.trainer.grpo import GrpoConfigError, GrpoObjective
from levanter.trainer.hooks import ModelEvaluation, ModelPublisher
from levanter.trainer.state import FrozenArrays
from levanter.trainer.stopping import StopSource
from levanter.trainer.trainer import DataSource

logger = logging.getLogger("levanter.train_lm")


class InitialWeightsError(LevanterError, ValueError):
    """Existing weights that cannot start this run: another model family, other shapes or another vocabulary."""


@dataclass(frozen=True)
class InitialWeights:
    """Weights a run starts from instead of a random initialisation.

    ``path`` (a local path or any URL) is a Hugging Face folder (``format="hf"``: config.json and
    safetensors) or one step of our own checkpoints (``format="checkpoint"``:
    ``<run>/checkpoints/<step>``). ``load_optimizer_state`` also takes the optimizer state from
    such a checkpoint, which must then come from the same model and optimizer. Either way the run
    counts its own steps from 0, so its learning-rate schedule starts from the beginning, and a run
    that already has checkpoints of its own resumes from them instead.
    """

    path: str
    format: Literal["hf", "checkpoint"]
    load_optimizer_state: bool = False

    def __post_init__(self) -> None:
        if self.format not in ("hf", "checkpoint"):
            raise InitialWeightsError(f"InitialWeights.format must be 'hf' or 'checkpoint', got {self.format!r}.")
        if self.load_optimizer_state and self.format != "checkpoint":
            raise InitialWeightsError(
                f"{self.path} is a Hugging Face folder, which holds no optimizer state; load_optimizer_state "
                "needs one of our own checkpoints (of the same model and optimizer)."
            )

    @property
    def fields(self) -> tuple[str, ...]:
        """The parts of the train state taken from the weights."""
        return ("params", "opt_state") if self.load_optimizer_state else ("params",)


@dataclass(frozen=True)
class TrainLmConfig:
    model: Any  # LlamaConfig, MoeConfig, or any config with build(vocab_size, key=) and flops_per_token()
    optimizer: OptimizerConfig
    trainer: TrainerConfig
    vocab_size: int
    output_path: str
    # Tokenizer files to put beside the HF export (a folder or a tokenizers.Tokenizer json file).
    tokenizer: str | None = None
    export_hf: bool = True
    # Start from these weights instead of random ones (when the run has no checkpoint of its own).
    initialize_from: InitialWeights | None = None
    # Train LoRA adapters on the (initial) model instead of its weights.
    lora: LoraConfig | None = None
    # Train on preference pairs (rows 2i chosen, 2i + 1 rejected) with DPO instead of next-token loss.
    dpo: DpoConfig | None = None
    # Train a policy on sampled completions with a GRPO loss instead of next-token loss.
    grpo: GrpoObjective | None = None

    def __post_init__(self) -> None:
        if self.dpo is not None and self.grpo is not None:
            raise GrpoConfigError("A run trains with one objective: dpo= or grpo=, not both.")
        if self.lora is not None and self.initialize_from is not None and self.initialize_from.load_optimizer_state:
            raise LoraError("A LoRA run trains new adapters, so it has no optimizer state to take from the initial "
                            "checkpoint; leave load_optimizer_state off.")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (model type included) for hashing and provenance."""
        record = {
            "model": {"type": type(self.model).__name__, **dataclasses.asdict(self.model)},
            "optimizer": self.optimizer.to_dict(),
            "trainer": self.trainer.to_dict(),
            "vocab_size": self.vocab_size,
            "output_path": self.output_path,
            "tokenizer": self.tokenizer,
            "export_hf": self.export_hf,
        }
        if self.initialize_from is not None:
            record["initialize_from"] = dataclasses.asdict(self.initialize_from)
        for name in ("lora", "dpo", "grpo"):  # only when given: a plain run's record is unchanged
            if getattr(self, name) is not None:
                record[name] = dataclasses.asdict(getattr(self, name))
        return record


@dataclass(frozen=True)
class TrainLmResult:
    final_step: int
    final_train_loss: float | None
    eval_losses: dict[str, float]
    output_path: str
    checkpoint_dir: str
    checkpoint_paths: list[str]
    metrics_path: str
    eval_path: str
    hf_path: str | None
    adapter_path: str | None = None  # under LoRA: the PEFT adapter folder
    # The mesh the run trained on, each axis's size by name (data, fsdp, experts, model), and the
    # number of processes (hosts) that fed it.
    mesh: dict[str, int] = field(default_factory=dict)
    process_count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ensure_logging() -> None:
    """Make the progress lines visible when the caller has not configured logging.

    absl (imported by Orbax) puts its own handler on the root logger, so "root has handlers" does
    not mean the user configured anything; look at whether INFO from levanter would be emitted.
    """
    levanter_logger = logging.getLogger("levanter")
    user_handlers = [h for h in logging.getLogger().handlers if "absl" not in type(h).__module__]
    if levanter_logger.getEffectiveLevel() > logging.INFO or not user_handlers:
        if not levanter_logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            levanter_logger.addHandler(handler)
            levanter_logger.propagate = False
        levanter_logger.setLevel(logging.INFO)
    # Orbax logs every phase of every save at INFO through absl; keep progress lines readable.
    logging.getLogger("absl").setLevel(logging.WARNING)


def _write_json_atomically(path: str, record: dict[str, Any]) -> None:
    fsx.atomic_write(path, json.dumps(record, indent=2))


def _export(model: Any, out: str, config: TrainLmConfig) -> tuple[str | None, str | None]:
    """Write ``hf/`` (and, under LoRA, ``hf-adapter/``) from process 0; the folders, on every process.

    Every process takes part in gathering the weights (:func:`gathered_on_process_0`) and waits
    until process 0 has written them, so that any process may read them next.
    """
    merged = merge_lora(model) if config.lora is not None else model
    hf_path = fsx.join(out, "hf") if _has_hf_family(merged) else None
    adapter_path = fsx.join(out, "hf-adapter") if config.lora is not None and hf_path is not None else None
    whole = gathered_on_process_0((merged, model if adapter_path is not None else None))
    if whole is not None:
        if hf_path is not None:
            _export_hf(whole[0], hf_path, config.tokenizer)
        if adapter_path is not None:
            base = config.initialize_from.path if config.initialize_from is not None else "random initialisation"
            export_peft_adapter(whole[1], adapter_path, base_model_name_or_path=base)
    wait_for_every_process("levanter.main.train_lm: the export is written")
    return hf_path, adapter_path


def _has_hf_family(model: Any) -> bool:
    try:
        from levanter.compat.hf_checkpoints import family_of_model
    except ImportError:
        logger.warning("Hugging Face export unavailable (levanter.compat.hf_checkpoints missing); skipped.")
        return False
    if family_of_model(model) is None:
        logger.info("No Hugging Face export for %s models; skipped.", type(model).__name__)
        return False
    return True


def _export_hf(model, out_dir: str, tokenizer: str | None) -> str:
    from levanter.compat.hf_checkpoints import export_to_hf

    tokenizer_arg: Any = tokenizer
    if tokenizer is not None and _is_file(tokenizer):
        from tokenizers import Tokenizer

        with fsx.open_url(tokenizer, "rb") as f:
            tokenizer_arg = Tokenizer.from_str(f.read().decode("utf-8"))
    return export_to_hf(model, out_dir, tokenizer_dir_or_obj=tokenizer_arg)


def _is_file(url: str) -> bool:
    fs, path = fsx.filesystem(url)
    return fs.isfile(path)


def train_lm(
    config: TrainLmConfig,
    train_source: DataSource,
    eval_sources: EvalSources | None = None,
    *,
    stop_sources: Iterable[StopSource] = (),
    model_evaluations: Iterable[ModelEvaluation] = (),
    model_publishers: Iterable[ModelPublisher] = (),
) -> TrainLmResult:
    """Train ``config.model`` on ``train_source`` (resuming from ``output_path/checkpoints`` if a
    checkpoint is there), evaluate on ``eval_sources``, and write the output folder.

    ``stop_sources`` are polled between steps (:mod:`levanter.trainer.stopping`); an ABANDON
    request also keeps ``eval.json`` and the Hugging Face export from being written. Compiled
    programs go to the persistent compilation cache (:mod:`levanter.trainer.compilation_cache`).
    ``model_evaluations`` are the caller's evaluations of the live model, ``model_publishers`` hand
    the live weights to whoever makes the batches (see :class:`Trainer`).
    """
    _ensure_logging()
    enable_compilation_cache()
    out = fsx.absolute(config.output_path)
    if fsx.is_local(out):
        os.makedirs(out, exist_ok=True)
    model_config = config.model
    flops = None
    if hasattr(model_config, "flops_per_token"):
        flops = lambda seq_len: model_config.flops_per_token(config.vocab_size, seq_len)  # noqa: E731
    trainer = Trainer(
        config.trainer,
        config.optimizer,
        output_dir=out,
        flops_per_token=flops,
        run_config=config.to_dict(),
        stop_sources=stop_sources,
        trainable=lora_trainable_filter if config.lora is not None else None,
        keep_reference=config.dpo is not None or (config.grpo is not None and config.grpo.settings.needs_reference),
        objective=DpoObjective(beta=config.dpo.beta) if config.dpo is not None else config.grpo,
        # LoRA dropout: the adapters drop their inputs with a key fresh each step, in training only.
        train_model_transform=with_lora_dropout if config.lora is not None and config.lora.dropout > 0 else None,
        model_evaluations=model_evaluations,
        model_publishers=model_publishers,
    )
    initialize = None
    if config.initialize_from is not None:
        initialize = initializer(config.initialize_from, model_config, config.vocab_size)
        if config.lora is not None:
            initialize = _under_lora(initialize)
    result = trainer.train(build_model_fn(config), train_source, eval_sources, initialize=initialize)

    eval_path = fsx.join(out, "eval.json")
    trainer.raise_if_abandoned(result.final_step)
    record = {"step": result.final_step, "train_loss": result.final_train_loss, "eval": result.eval_losses}
    if result.unverified_checkpoint is not None:  # only then: a verified run's record is unchanged
        record["unverified_checkpoint"] = result.unverified_checkpoint
    if result.ema_eval_losses:  # the weight average's losses: it is the model exported below
        record["eval_ema"] = result.ema_eval_losses
    _write_json_atomically(eval_path, record)
    trainer.raise_if_abandoned(result.final_step)
    hf_path = adapter_path = None
    if config.export_hf:
        hf_path, adapter_path = _export(result.model, out, config)
    trainer.checkpointer.close()
    return TrainLmResult(
        final_step=result.final_step,
        final_train_loss=result.final_train_loss,
        eval_losses=result.eval_losses,
        output_path=out,
        checkpoint_dir=result.checkpoint_dir,
        checkpoint_paths=[trainer.checkpointer.path_of(s) for s in result.checkpoint_steps],
        metrics_path=result.metrics_path,
        eval_path=eval_path,
        hf_path=hf_path,
        adapter_path=adapter_path,
        mesh={axis: int(size) for axis, size in trainer.mesh.shape.items()},
        process_count=jax.process_count(),
    )


# Folded into the run's model key for the adapters' initialisation (the base model keeps the key it had).
_LORA_KEY = 0x10FA


def build_model_fn(config: TrainLmConfig) -> Callable[[jax.Array], Any]:
    """``key -> model`` for the run: the config's model, with adapters when ``config.lora`` asks for them."""

    def build(key):
        model = config.model.build(config.vocab_size, key=key)
        if config.lora is not None:
            model = apply_lora(model, config.lora, key=jax.random.fold_in(key, _LORA_KEY))
        return model

    return build


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoraLinear)


def _under_lora(initialize: Callable[[TrainState], TrainState]) -> Callable[[TrainState], TrainState]:
    """``initialize`` for a run whose weights are frozen under adapters: the weights go to the frozen base.

    ``initialize`` is given a state of the plain model (its floating arrays as ``params``), as for a
    run without adapters, and what it loads is put back under the adapters, which keep their fresh
    (zero-effect) values.
    """

    def initialize_base(fresh: TrainState) -> TrainState:
        frozen = fresh.frozen.model
        base = jax.tree.map(lambda x: x.base if _is_lora(x) else x, frozen, is_leaf=_is_lora)
        loaded = initialize(dataclasses.replace(fresh, params=base, frozen=None)).params
        rewrapped = jax.tree.map(lambda f, b: eqx.tree_at(lambda m: m.base, f, b) if _is_lora(f) else b,
                                 frozen, loaded, is_leaf=_is_lora)
        return dataclasses.replace(fresh, frozen=FrozenArrays(model=rewrapped, reference=fresh.frozen.reference))

    return initialize_base


# -- starting from existing weights ------------------------------------------------------------------

# Config fields that do not describe the weights (how the model runs, how random weights would be
# drawn): they may differ from the weights' own.
_EXECUTION_FIELDS = frozenset({"use_scan", "remat", "attention", "initializer_range"})
# Any vocabulary will do to compare parameter shapes; the vocabulary is compared on its own.
_SHAPE_PROBE_VOCAB = 8


def hf_model_config(path: str) -> tuple[Any, int]:
    """Our model config and the vocabulary size a Hugging Face folder's ``config.json`` describes."""
    from levanter.compat.hf_checkpoints import FAMILIES, read_hf_config

    hf = read_hf_config(path)
    model_type = hf.get("model_type") or FAMILIES[0].model_type
    families = {family.model_type: family for family in FAMILIES}
    if model_type not in families:
        raise InitialWeightsError(f"{path} holds a {model_type!r} model; supported model_types: {', '.join(families)}.")
    return families[model_type].config_from_hf(hf)


def check_vocab_size(weights_vocab: int, data_vocab: int, where: str) -> None:
    if weights_vocab != data_vocab:
        raise InitialWeightsError(
            f"Vocabulary mismatch: the weights in {where} have a vocabulary of {weights_vocab:,} tokens, but the "
            f"training data's tokenizer has {data_vocab:,}. Tokenize the data with the tokenizer the weights were "
            "trained with."
        )


def check_model_matches(declared: Any, weights: Any, where: str) -> None:
    """Refuse a model config whose parameters would not have the shapes of the weights' config.

    The error names each field that changes a shape. Fields that say how the model runs (scan,
    remat, attention implementation) may differ; other differences (``rope_theta``, ``max_seq_len``
    ...) are allowed, since continued training may change them on purpose, and logged.
    """
    if type(declared) is not type(weights):
        raise InitialWeightsError(
            f"The weights in {where} are a {type(weights).__name__} model, but the run's model is a {type(declared).__name__}."
        )
    names = [f.name for f in dataclasses.fields(declared)]
    # The weights' config, running the way the declared one runs: only what the weights are remains to compare.
    weights = dataclasses.replace(weights, **{n: getattr(declared, n) for n in names if n in _EXECUTION_FIELDS})
    differing = [n for n in names if getattr(declared, n) != getattr(weights, n)]
    if not differing:
        return
    expected = _parameter_shapes(weights)
    if _parameter_shapes(declared) == expected:
        logger.warning(
            "The run's model config differs from the weights' in %s (%s): continuing with the run's values.",
            ", ".join(differing), where,
        )
        return
    shaping = [n for n in differing if _changes_shapes(weights, n, getattr(declared, n), expected)] or differing
    details = "; ".join(f"{n}={getattr(declared, n)!r} where the weights have {n}={getattr(weights, n)!r}" for n in shaping)
    raise InitialWeightsError(
        f"The run's model does not fit the weights in {where}: {details}. Use the weights' values "
        "(or leave the model out, where its config can be read from the weights)."
    )


def _parameter_shapes(config: Any) -> list[tuple[str, tuple[int, ...]]] | None:
    try:
        model = eqx.filter_eval_shape(lambda key: config.build(_SHAPE_PROBE_VOCAB, key=key), jax.random.PRNGKey(0))
    except (ValueError, TypeError):  # a combination of fields no model can have (heads not dividing hidden_dim...)
        return None
    leaves = jax.tree_util.tree_flatten_with_path(model)[0]
    return [(jax.tree_util.keystr(path), tuple(leaf.shape)) for path, leaf in leaves if hasattr(leaf, "shape")]


def _changes_shapes(weights: Any, name: str, value: Any, expected: Any) -> bool:
    try:
        changed = dataclasses.replace(weights, **{name: value})
    except (ValueError, TypeError):  # refused by the config itself: it cannot have the weights' shapes either
        return True
    return _parameter_shapes(changed) != expected


def check_hf_weights(path: str, model_config: Any, vocab_size: int) -> None:
    """Whether a Hugging Face folder can start a run of ``model_config`` on data of ``vocab_size`` tokens."""
    weights_config, weights_vocab = hf_model_config(path)
    check_vocab_size(weights_vocab, vocab_size, path)
    check_model_matches(model_config, weights_config, path)


def initializer(initial: InitialWeights, model_config: Any, vocab_size: int) -> Callable[[TrainState], TrainState]:
    """What replaces a fresh train state with ``initial``'s weights (see :meth:`Trainer.starting_state`)."""

    def from_hf(fresh: TrainState) -> TrainState:
        from levanter.compat.hf_checkpoints import import_from_hf

        check_hf_weights(initial.path, model_config, vocab_size)  # from config.json, before reading any weight
        model = import_from_hf(initial.path, use_scan=getattr(model_config, "use_scan", False))
        state = dataclasses.replace(fresh, params=_params_like(model, fresh.params, initial.path))
        logger.info("Starting from the weights in %s (Hugging Face format).", initial.path)
        return state

    def from_checkpoint(fresh: TrainState) -> TrainState:
        try:
            state = read_state_fields(initial.path, fresh, initial.fields)
        except CheckpointMismatchError as error:
            _check_checkpoint_vocab(error.stored, fresh, vocab_size, initial.path)
            if initial.load_optimizer_state:
                raise InitialWeightsError(
                    f"{error} Taking the optimizer state needs a checkpoint of the same model and optimizer; "
                    "start with a fresh optimizer state instead to take only the weights."
                ) from error
            raise InitialWeightsError(str(error)) from error
        what = "weights and optimizer state" if initial.load_optimizer_state else "weights"
        logger.info("Starting from the %s of checkpoint %s.", what, initial.path)
        return state

    return from_hf if initial.format == "hf" else from_checkpoint


def _params_like(model: Any, template: Any, where: str) -> Any:
    """``model``'s floating arrays, as f32, in ``template``'s structure and shardings (matched by path)."""
    loaded = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(model)[0]}
    wanted, treedef = jax.tree_util.tree_flatten_with_path(template)
    problems = []
    for path, leaf in wanted:
        name = jax.tree_util.keystr(path)
        if name not in loaded:
            problems.append(f"{name}: missing")
        elif tuple(loaded[name].shape) != tuple(leaf.shape):
            problems.append(f"{name}: {tuple(loaded[name].shape)} in the weights, {tuple(leaf.shape)} in the run")
    used = {jax.tree_util.keystr(path) for path, _ in wanted}
    problems += [f"{name}: in the weights, not in the run's model" for name, leaf in loaded.items()
                 if name not in used and hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)]
    if problems:
        raise InitialWeightsError(f"The weights in {where} do not fit the run's model: {'; '.join(problems[:5])}.")
    leaves = [jax.device_put(jnp.asarray(loaded[jax.tree_util.keystr(p)], leaf.dtype), leaf.sharding) for p, leaf in wanted]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _check_checkpoint_vocab(stored: dict[str, Any], fresh: TrainState, vocab_size: int, where: str) -> None:
    """Name a vocabulary mismatch as such: the token embedding's rows are the vocabulary."""
    embedding = getattr(getattr(fresh.params, "embed", None), "weight", None)
    if embedding is None:
        return
    flat, _ = flatten_state(fresh)
    name = next((n for n, leaf in flat.items() if leaf is embedding), None)
    if name in stored and stored[name].shape[1:] == embedding.shape[1:]:
        check_vocab_size(stored[name].shape[0], vocab_size, where)
