"""``rl_train(...)``: declare a reinforcement-learning run (verifiable rewards, GRPO) as a lazy step.

The policy starts from ``model`` (a ``train_lm``/``sft`` handle, a Hugging Face folder or model id, or
a checkpoint folder), samples completions of an environment's problems, is rewarded by the
environment, and learns with a GRPO-family loss. The step's identity covers what decides the trained
weights: the starting weights (through the dependency or their files), the model config, the
environment (its class and fields), the loss, the optimizer, the sampling settings, prompts and
rollouts per step, number of steps, seed, how often weights are synchronised and how stale a rollout
may be. Where the rollout workers run and how many there are, the buffer's size, the reward timeout,
checkpoint and evaluation schedules are placement or observation: not hashed. (With
``max_staleness=0`` every batch is sampled by the weights that train on it, whoever samples it, and
a run gives the same weights every time; with more, which weights sampled a batch depends on timing.)

The output folder holds ``checkpoints/``, ``metrics.jsonl`` (per step: the GRPO loss, ``policy/kl``,
``policy/entropy``, clip fractions, ``reward/mean``, ``reward/pass_rate``, ``reward/failures``,
``rollout/response_length``, ``rollout/staleness``, ``rollout/tokens_per_second`` and the trainer's
``tokens_per_second``; ``heldout/pass_rate`` at step 0, every ``eval_every`` steps and at the end),
``rollouts/`` (every batch trained on, :mod:`marin.rl.rollout_log`), ``eval.json`` and ``hf/``; the
artifact is an :class:`RlTrainedModel`. Killing the step, or one rollout worker, loses no rollout
already trained on and trains none twice (:mod:`marin.rl.rollout_log`, :mod:`marin.rl.rollout_fleet`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fray.cluster import ResourceConfig
from levanter.optim import AdamConfig, OptimizerConfig
from levanter.trainer import TrainerConfig
from levanter.trainer.grpo import GrpoLoss, grpo
from levanter.trainer.tracker import read_metrics
from marin.execution.artifact import register_result_type
from marin.execution.lazy import LazyStep, lazy_step
from marin.experiment.initial_weights import resolve_initial_weights
from marin.rl.environments import Environment
from marin.rl.rl_run import RlConfigError, RlRequest, RlRun, run_rl
from marin.rl.rollouts import RolloutSampling

# Bumped when the step's outputs change meaning, so old runs are never reused for it.
RL_STEP_VERSION = "1"


@register_result_type
@dataclass(frozen=True)
class RlTrainedModel:
    """The result of an ``rl_train`` step (its ``.artifact.json``)."""

    model_type: str
    parameters: int
    vocab_size: int
    final_step: int
    final_train_loss: float | None
    train_seconds: float
    output_path: str
    checkpoint_dir: str
    metrics_path: str
    eval_path: str
    rollouts_path: str
    hf_path: str | None
    tokenizer: str
    tokenizer_identity: str
    initialized_from: str
    environment: str
    loss: str
    completions_trained: int  # completions in the batches of steps 1..final_step
    heldout_pass_rate_start: float | None = None  # the starting weights', greedy, on the held-out problems
    heldout_pass_rate_final: float | None = None
    worker_restarts: int = 0  # rollout workers replaced, in the attempt that finished the run
    batches_reused: int = 0  # rollout batches that attempt read back from the log (a resumed run's)

    def summary(self) -> str:
        lines = [f"RL-trained {self.model_type.removesuffix('Config')} ({self.parameters:,} parameters) for {self.final_step} "
                 f"steps, {self.completions_trained:,} completions, in {self.train_seconds:.0f} s."]
        lines.append(f"  started from: {self.initialized_from}")
        lines.append(f"  environment: {self.environment}")
        lines.append(f"  loss:        {self.loss}")
        if self.heldout_pass_rate_start is not None and self.heldout_pass_rate_final is not None:
            lines.append(f"  held-out pass rate: {self.heldout_pass_rate_start:.3f} at the start, {self.heldout_pass_rate_final:.3f} "
                         "at the end")
        lines.append(f"  checkpoints: {self.checkpoint_dir}")
        lines.append(f"  metrics:     {self.metrics_path}")
        lines.append(f"  rollouts:    {self.rollouts_path}")
        lines.append(f"  HF export:   {self.hf_path or 'none'}")
        return "\n".join(lines)


def rl_train(
    name: str,
    *,
    model: LazyStep | str,
    environment: Environment,
    num_train_steps: int,
    loss: GrpoLoss | None = None,
    optimizer: OptimizerConfig | None = None,
    prompts_per_step: int = 8,
    rollouts_per_prompt: int = 4,
    sampling: RolloutSampling | None = None,
    sync_every: int = 1,
    max_staleness: int = 1,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    rollout_workers: int = 1,
    rollout_backend: str = "threads",
    rollout_resources: ResourceConfig | None = None,
    replay_buffer_size: int = 2,
    reward_timeout_s: float = 10.0,
    eval_every: int | None = None,
    seed: int = 0,
    microbatch_size: int | None = None,
    compute_dtype: str = "auto",
    steps_per_checkpoint: int | None = None,
    minutes_per_checkpoint: float | None = 10.0,
    log_every: int = 10,
    trackers: Sequence[str] = ("jsonl",),
    model_config: Any = None,
    tokenizer: str | None = None,
    output_path: str | None = None,
) -> LazyStep:
    """A lazy handle that improves ``model`` on ``environment``'s rewards (see the module docstring).

    Each step trains on ``prompts_per_step`` problems with ``rollouts_per_prompt`` completions each
    (the trainer's batch: their product). ``loss``: :func:`~levanter.trainer.grpo.grpo` (the default),
    ``dr_grpo()`` or ``dapo()``. ``sampling``: temperature, top-p, top-k and ``max_tokens`` of the
    completions. The trainer sends the rollout workers new weights every ``sync_every`` steps; a
    batch is sampled by weights at most ``max_staleness`` steps older than those that train on it
    (0: on-policy, sampling waits for training; at least ``sync_every - 1``). ``rollout_workers``
    workers run where the fray setting ``rollout_backend`` says (``"threads"``: in the step's
    process; ``"processes"``: each in its own; ``"ray"``), each with ``rollout_resources``;
    ``replay_buffer_size`` batches may wait between them and the trainer. A reward call running
    past ``reward_timeout_s`` fails its completion. ``model_config`` is needed only when the
    weights do not say it (a checkpoint folder), ``tokenizer`` when no tokenizer lies beside them.
    """
    loss = loss or grpo()
    sampling = sampling or RolloutSampling()
    optimizer = optimizer or AdamConfig(learning_rate=1e-5, weight_decay=0.0, lr_schedule="constant")
    _check(environment, loss, optimizer, sampling, prompts_per_step, rollouts_per_prompt, sync_every, max_staleness,
           rollout_workers, replay_buffer_size, num_train_steps, eval_every)
    initial = resolve_initial_weights(model)
    config = model_config if model_config is not None else initial.model
    if config is None:
        raise RlConfigError(f"the model config of {initial.source} cannot be read from the weights; pass model_config=.")
    if model_config is not None:
        initial.check_fits(model_config, optimizer)
    trainer = TrainerConfig(
        num_train_steps=num_train_steps, batch_size=prompts_per_step * rollouts_per_prompt, microbatch_size=microbatch_size,
        compute_dtype=compute_dtype, seed=seed, steps_per_checkpoint=steps_per_checkpoint,
        minutes_per_checkpoint=minutes_per_checkpoint, log_every=log_every, trackers=tuple(trackers),
    )
    request = RlRequest(
        initial=initial, model=config, environment=environment, loss=loss, optimizer=optimizer, trainer=trainer,
        sampling=sampling, prompts_per_step=prompts_per_step, rollouts_per_prompt=rollouts_per_prompt,
        sync_every=sync_every, max_staleness=max_staleness, rollout_workers=rollout_workers,
        rollout_backend=rollout_backend, rollout_resources=rollout_resources, replay_buffer_size=replay_buffer_size,
        reward_timeout_s=reward_timeout_s, eval_every=eval_every, tokenizer=tokenizer,
    )

    def run(ctx) -> RlTrainedModel:
        return _trained_model(request, run_rl(ctx, request))

    hash_attrs = {
        "model": config,
        # The starting weights: a step enters through the dependency, a folder through its files.
        "initialize_from": initial.hash_attr(),
        "environment": environment,
        "loss": loss,
        "optimizer": optimizer.to_dict(),
        "sampling": sampling,
        "prompts_per_step": prompts_per_step,
        "rollouts_per_prompt": rollouts_per_prompt,
        "sync_every": sync_every,
        "max_staleness": max_staleness,
        # num_train_steps, batch_size, microbatch_size, seed, numerics: the trainer settings marked as hashed.
        **trainer.hashed_settings(),
        "format": RL_STEP_VERSION,
    }
    if tokenizer is not None:
        hash_attrs["tokenizer"] = tokenizer
    return lazy_step(name, run, deps=initial.deps, hash_attrs=hash_attrs, version=version,
                     resources=resources or ResourceConfig.with_cpu(), output_path=output_path)


def _check(environment, loss, optimizer, sampling, prompts_per_step, rollouts_per_prompt, sync_every, max_staleness,
           rollout_workers, replay_buffer_size, num_train_steps, eval_every) -> None:
    if not isinstance(environment, Environment):
        raise RlConfigError(f"environment must be an Environment (marin.rl.Environment), got {type(environment).__name__}.")
    params = getattr(type(environment), "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise RlConfigError(f"{type(environment).__name__} must be a @dataclass(frozen=True): its fields are part of the "
                            "step's identity.")
    for label, value, kind in (("loss", loss, GrpoLoss), ("optimizer", optimizer, OptimizerConfig),
                               ("sampling", sampling, RolloutSampling)):
        if not isinstance(value, kind):
            raise RlConfigError(f"{label} must be a {kind.__name__}, got {type(value).__name__}.")
    for label, value, least in (("num_train_steps", num_train_steps, 1), ("prompts_per_step", prompts_per_step, 1),
                                ("rollouts_per_prompt", rollouts_per_prompt, 2), ("sync_every", sync_every, 1),
                                ("max_staleness", max_staleness, 0), ("rollout_workers", rollout_workers, 1),
                                ("replay_buffer_size", replay_buffer_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            why = " (advantages compare completions of one prompt)" if label == "rollouts_per_prompt" else ""
            raise RlConfigError(f"{label} must be an integer >= {least}{why}, got {value!r}.")
    if max_staleness < sync_every - 1:
        raise RlConfigError(
            f"max_staleness={max_staleness} with sync_every={sync_every}: between two weight updates a worker samples "
            f"with weights up to {sync_every - 1} steps old, so max_staleness must be at least sync_every - 1 = "
            f"{sync_every - 1} (or sync weights more often)."
        )
    if eval_every is not None and (isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 1):
        raise RlConfigError(f"eval_every must be a positive integer or None, got {eval_every!r}.")


def _trained_model(request: RlRequest, run: RlRun) -> RlTrainedModel:
    training = run.training
    # From the metrics file, not this attempt's memory: a resumed attempt did not see step 0.
    heldout = [line["heldout/pass_rate"] for line in read_metrics(training.metrics_path) if "heldout/pass_rate" in line]
    return RlTrainedModel(
        model_type=type(request.model).__name__,
        parameters=int(request.model.num_parameters(run.vocab_size)),
        vocab_size=run.vocab_size,
        final_step=training.final_step,
        final_train_loss=training.final_train_loss,
        train_seconds=run.seconds,
        output_path=training.output_path,
        checkpoint_dir=training.checkpoint_dir,
        metrics_path=training.metrics_path,
        eval_path=training.eval_path,
        rollouts_path=f"{training.output_path.rstrip('/')}/rollouts",
        hf_path=training.hf_path,
        tokenizer=run.tokenizer.source,
        tokenizer_identity=run.tokenizer.identity,
        initialized_from=request.initial.description,
        environment=repr(request.environment),
        loss=_describe_loss(request.loss),
        completions_trained=training.final_step * request.trainer.batch_size,
        heldout_pass_rate_start=heldout[0] if heldout else None,
        heldout_pass_rate_final=heldout[-1] if heldout else None,
        worker_restarts=run.worker_restarts,
        batches_reused=run.batches_reused,
    )


def _describe_loss(loss: GrpoLoss) -> str:
    fields = ", ".join(f"{f.name}={getattr(loss, f.name)!r}" for f in dataclasses.fields(loss) if f.name != "variant")
    return f"{loss.variant} ({fields})"


__all__ = ["RL_STEP_VERSION", "RlTrainedModel", "rl_train"]
