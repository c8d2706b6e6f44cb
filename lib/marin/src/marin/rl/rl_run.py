"""What an ``rl_train`` step does when it runs: wire the rollout workers, the replay buffer and the trainer, and train.

The trainer runs in the step's own process, through :func:`levanter.main.train_lm.train_lm` with the
GRPO objective: it starts from the declared weights (or resumes from the run's own checkpoint),
checkpoints, logs every step to ``metrics.jsonl`` and exports the final model. Its data source is
the rollout batches (:mod:`marin.rl.training_batches`); its weights reach the rollout workers
(:mod:`marin.rl.rollout_fleet`, placed by the fray client ``rollout_backend`` names) through the
weight board every ``sync_every`` steps. The held-out pass rate is measured at the start, every
``eval_every`` steps and at the end.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from fray.cluster import ResourceConfig, client_for
from levanter.main.train_lm import TrainLmConfig, TrainLmResult, hf_model_config
from levanter.main.train_lm import train_lm as run_trainer
from levanter.optim import OptimizerConfig
from levanter.tokenization import HfTokenizer, load_tokenizer
from levanter.trainer import TrainerConfig
from levanter.trainer.grpo import GrpoLoss, GrpoObjective
from marin.errors import MarinError
from marin.experiment.initial_weights import InitializeFrom
from marin.experiment.train_step import trainer_stop_source
from marin.rl.environments import Environment
from marin.rl.evaluation import HeldOutEvaluation
from marin.rl.policy_weights import WeightBoard
from marin.rl.replay_buffer import ReplayBuffer
from marin.rl.rollout_fleet import RolloutFleet
from marin.rl.rollout_log import LOG_FOLDER, RolloutLog
from marin.rl.rollout_worker import RolloutWorkerConfig, encode_prompt, problems_of_batch
from marin.rl.rollouts import RolloutSampling
from marin.rl.training_batches import BatchLayout, RolloutBatches
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

# Completions sampled at once by one worker's engine: a batch's, up to this many.
MAX_ENGINE_BATCH = 256


class RlConfigError(MarinError, ValueError):
    """A reinforcement-learning run that cannot work as declared."""


@dataclass(frozen=True)
class RlRequest:
    """What an ``rl_train`` step was declared with."""

    initial: InitializeFrom
    model: Any
    environment: Environment
    loss: GrpoLoss
    optimizer: OptimizerConfig
    trainer: TrainerConfig
    sampling: RolloutSampling
    prompts_per_step: int
    rollouts_per_prompt: int
    sync_every: int
    max_staleness: int
    rollout_workers: int = 1
    rollout_backend: str = "threads"
    rollout_resources: ResourceConfig | None = None
    replay_buffer_size: int = 2
    reward_timeout_s: float = 10.0
    eval_every: int | None = None
    tokenizer: str | None = None
    max_worker_restarts: int = 3


@dataclass(frozen=True)
class RlRun:
    training: TrainLmResult
    seconds: float
    tokenizer: HfTokenizer
    vocab_size: int
    worker_restarts: int = 0
    batches_reused: int = 0  # read back from the rollout log by this attempt (a resumed run's)


def run_rl(ctx: Any, request: RlRequest) -> RlRun:
    initial = request.initial.locate(ctx)
    tokenizer_location, vocab_size = _policy_tokenizer(ctx, request, initial.path)
    tokenizer = load_tokenizer(tokenizer_location)
    layout = _layout(request, tokenizer)
    num_problems = len(request.environment.problems("train"))
    worker_config = RolloutWorkerConfig(
        model=request.model, vocab_size=vocab_size, tokenizer=tokenizer_location, environment=request.environment,
        sampling=request.sampling, group_size=request.rollouts_per_prompt, seed=request.trainer.seed,
        compute_dtype=request.trainer.compute_dtype, reward_timeout_s=request.reward_timeout_s,
        max_batch=min(request.trainer.batch_size, MAX_ENGINE_BATCH),
    )
    steps = request.trainer.num_train_steps
    buffer = ReplayBuffer(request.replay_buffer_size, end=steps)
    board = WeightBoard()
    fleet = RolloutFleet(
        client_for(request.rollout_backend, what="rollout_backend"), worker_config, count=request.rollout_workers,
        buffer=buffer, weights=board, max_staleness=request.max_staleness, resources=request.rollout_resources,
        problems_of=lambda index: problems_of_batch(index, request.prompts_per_step, num_problems, request.trainer.seed),
        max_restarts=request.max_worker_restarts,
    ).start()
    log = RolloutLog(ctx.output_path)
    # A rerun after a stop continues from the checkpoints (taken over by their checksums), the metrics
    # (cut back to the checkpoint) and the rollout log: each logged batch is a whole file written
    # atomically, and the batches after the checkpoint are trained on again from it, not sampled anew.
    ctx.declare_resumable("metrics.jsonl", LOG_FOLDER)
    source = RolloutBatches(buffer, log, layout, steps)
    heldout = None
    if request.environment.problems("eval"):
        heldout = HeldOutEvaluation(request.environment, tokenizer, request.sampling, compute_dtype=request.trainer.compute_dtype,
                                    reward_timeout_s=request.reward_timeout_s)
    objective = GrpoObjective(request.loss, temperature=request.sampling.temperature, max_completion_length=request.sampling.max_tokens)
    started = time.perf_counter()
    try:
        training = run_trainer(
            TrainLmConfig(model=request.model, optimizer=request.optimizer, trainer=request.trainer, vocab_size=vocab_size,
                          output_path=ctx.output_path, tokenizer=tokenizer_location, initialize_from=initial, grpo=objective),
            source,
            stop_sources=[trainer_stop_source(ctx)],
            model_evaluations=[heldout.model_evaluation(request.eval_every)] if heldout is not None else (),
            model_publishers=[board.publisher(request.sync_every)],
        )
    finally:
        board.close()
        buffer.close()
        fleet.stop()
        if heldout is not None:
            heldout.close()
    return RlRun(training=training, seconds=time.perf_counter() - started, tokenizer=tokenizer, vocab_size=vocab_size,
                 worker_restarts=fleet.restarts,
                 batches_reused=source.reused)


def _policy_tokenizer(ctx: Any, request: RlRequest, weights_path: str) -> tuple[str, int]:
    """Where the policy's tokenizer lies and the size of its vocabulary."""
    if request.initial.kind == "step":
        result = ctx.load_artifact(request.initial.step).result
        return request.tokenizer or result["tokenizer"], int(result["vocab_size"])
    if request.initial.kind in ("hf", "hub"):
        _, vocab_size = hf_model_config(weights_path)
        location = request.tokenizer or weights_path
        if request.tokenizer is None and not fsx.exists(fsx.join(weights_path, "tokenizer.json")):
            raise RlConfigError(f"{weights_path} has no tokenizer.json beside the weights; pass rl_train(tokenizer=...).")
        return location, vocab_size
    if request.tokenizer is None:
        raise RlConfigError(f"{request.initial.source} is a checkpoint, which names no tokenizer; pass rl_train(tokenizer=...).")
    return request.tokenizer, load_tokenizer(request.tokenizer).vocab_size


def _layout(request: RlRequest, tokenizer: HfTokenizer) -> BatchLayout:
    """Rows long enough for the longest training prompt and a full-length completion."""
    problems = request.environment.problems("train")
    if not problems:
        raise RlConfigError(f"{type(request.environment).__name__} has no training problems.")
    longest = max(len(encode_prompt(tokenizer, problem.prompt)) for problem in problems)
    seq_len = longest + request.sampling.max_tokens
    limit = getattr(request.model, "max_seq_len", None)
    if limit is not None and seq_len > limit:
        raise RlConfigError(
            f"the longest training prompt has {longest} tokens and completions may have {request.sampling.max_tokens}: "
            f"{seq_len} positions, more than the model's max_seq_len={limit}. Lower max_tokens or shorten the prompts."
        )
    return BatchLayout(group_size=request.rollouts_per_prompt, seq_len=seq_len, scale_rewards=request.loss.scale_rewards)


__all__ = ["RlConfigError", "RlRequest", "RlRun", "run_rl"]
