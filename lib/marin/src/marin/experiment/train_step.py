"""What a ``train_lm`` step does when it runs: read its datasets, train, export, and sample.

:func:`run_training` is the step's body. It reads each dataset's tokenize result once, checks that
they share a tokenizer, trains through :func:`levanter.main.train_lm.train_lm` with the step's
stop reasons (lease, Ctrl-C, SIGTERM) as the trainer's stop sources, starting from the declared
initial weights when there are some (:mod:`marin.experiment.initial_weights`; the trainer checks
them against the data's vocabulary and the model), and writes a few samples from the exported
model. With harness settings, lm-eval tasks run on the live weights during training
(:mod:`marin.evaluation.during_training`). It returns a :class:`TrainingRun`, from which :mod:`marin.experiment.train` builds the
step's recorded result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import jax

from levanter.data import build_text_data
from levanter.data.pairs import PreferencePairs
from levanter.distributed import initialize_distributed
from levanter.inference import SamplingConfig, generate_text
from levanter.main.train_lm import TrainLmConfig, TrainLmResult
from levanter.main.train_lm import train_lm as run_trainer
from levanter.lora import LoraConfig
from levanter.optim import OptimizerConfig
from levanter.tokenization import load_tokenizer
from levanter.trainer import TrainerConfig
from levanter.trainer.dpo import DpoConfig
from levanter.trainer.stopping import StopAction, StopRequest, StopSource
from marin.errors import MarinError
from marin.evaluation.during_training import HarnessDuringTraining
from marin.evaluation.harness import HarnessResults, HarnessSettings
from marin.execution.lazy import LazyStep
from marin.execution.running.step_context import StopReason
from marin.experiment.data import cache_source
from marin.experiment.initial_weights import InitializeFrom
from marin.processing.tokenize import TokenizedDataset

logger = logging.getLogger(__name__)

SAMPLE_PROMPTS = ("Once upon a time", "One day, a little", "There was a")


class TrainConfigError(MarinError, ValueError):
    """A training request that cannot work as written (caught when it is declared)."""


@dataclass(frozen=True)
class TrainingRequest:
    """What a ``train_lm`` step was declared with."""

    model: Any
    optimizer: OptimizerConfig
    trainer: TrainerConfig
    weights: dict[LazyStep, float]  # {tokenized handle: weight}, in dependency order
    seq_len: int
    num_samples: int
    initialize_from: InitializeFrom | None = None
    lora: LoraConfig | None = None
    dpo: DpoConfig | None = None
    on_cut_conversation: str = "warn"  # chat data: what a conversation cut by the seq_len windows does
    harness: HarnessSettings | None = None  # lm-eval tasks run on the live weights while training
    harness_every: int | None = None  # ... every this many steps (and after the last)


@dataclass(frozen=True)
class TrainingRun:
    """What running the step produced."""

    datasets: dict[LazyStep, TokenizedDataset]  # each dataset's tokenize result, in the request's order
    training: TrainLmResult
    seconds: float
    samples: list[str]
    harness: HarnessResults | None = None  # the harness tasks' results on the final weights

    @property
    def first_dataset(self) -> TokenizedDataset:
        """The first dataset's tokenize result; all of them share its tokenizer."""
        return next(iter(self.datasets.values()))


def run_training(ctx: Any, request: TrainingRequest) -> TrainingRun:
    datasets = {handle: ctx.load_artifact(handle, TokenizedDataset).result for handle in request.weights}
    first = _shared_tokenizer(datasets)
    # Under replicas > 1 each process joins the JAX run first, then reads only its rows of each batch.
    initialize_distributed()
    if request.dpo is not None:
        train_source, eval_sources = _preference_data(request, datasets), None
    else:
        data = build_text_data(
            [cache_source(handle.name, datasets[handle], weight) for handle, weight in request.weights.items()],
            seq_len=request.seq_len,
            batch_size=request.trainer.batch_size,
            seed=request.trainer.seed,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            # Every cache's largest token id must fit the model's embedding table (an id past it is an
            # out-of-range gather, which XLA turns into silent garbage, not an error).
            vocab_size=first.vocab_size,
            model=f"the {type(request.model).__name__} model, sized for tokenizer {first.tokenizer_source},",
            on_cut_conversation=request.on_cut_conversation,
        )
        train_source, eval_sources = data.train, data.validation
    initial = request.initialize_from.locate(ctx) if request.initialize_from is not None else None
    harness = None
    if request.harness is not None:
        harness = HarnessDuringTraining(request.harness, load_tokenizer(first.tokenizer_source), model_label=ctx.step.name,
                                        model_identity=getattr(ctx.step, "identity", ctx.step.name))
    # A rerun after a stop continues from the checkpoints (taken over by their checksums) and from
    # the metrics, which the trainer cuts back to the checkpoint it resumes from.
    ctx.declare_resumable("metrics.jsonl")
    started = time.perf_counter()
    training = run_trainer(
        TrainLmConfig(
            model=request.model,
            optimizer=request.optimizer,
            trainer=request.trainer,
            vocab_size=first.vocab_size,
            output_path=ctx.output_path,
            tokenizer=first.tokenizer_source,
            initialize_from=initial,
            lora=request.lora,
            dpo=request.dpo,
        ),
        train_source,
        eval_sources,
        stop_sources=[trainer_stop_source(ctx)],
        model_evaluations=[harness.model_evaluation(request.harness_every)] if harness is not None else (),
    )
    seconds = time.perf_counter() - started
    # The step's result is process 0's (iris's replica 0); the other hosts of a multi-host run skip the sampling.
    samples = sample_texts(training.hf_path, first.tokenizer_source, request.num_samples) if jax.process_index() == 0 else []
    return TrainingRun(datasets=datasets, training=training, seconds=seconds, samples=samples,
                       harness=harness.latest if harness is not None else None)


def _preference_data(request: TrainingRequest, datasets: dict[LazyStep, TokenizedDataset]) -> PreferencePairs:
    """The pairs of the one preference dataset, as the trainer's source (refused if its caches are not pairs)."""
    from zephyr.token_cache import TokenCache

    (handle, result), = datasets.items()
    cache = TokenCache.open(result.cache_path("train"))
    cache.check_token_ids(result.vocab_size)
    return PreferencePairs(cache, seq_len=request.seq_len, batch_size=request.trainer.batch_size, seed=request.trainer.seed,
                           process_index=jax.process_index(), process_count=jax.process_count(), name=handle.name)


def _shared_tokenizer(datasets: dict[LazyStep, TokenizedDataset]) -> TokenizedDataset:
    identities = {result.tokenizer_identity for result in datasets.values()}
    if len(identities) > 1:
        names = ", ".join(f"{h.name}: {r.tokenizer_identity[:19]}" for h, r in datasets.items())
        raise TrainConfigError(f"All datasets of one training run must share a tokenizer; got {names}.")
    return next(iter(datasets.values()))


def trainer_stop_source(ctx: Any) -> StopSource:
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
        StopReason.PREEMPTED: StopRequest(StopAction.PREEMPT, "the step's process received SIGTERM (preemption)"),
    }
    return lambda: requests.get(ctx.stop_reason())


def sample_texts(hf_path: str | None, tokenizer_location: str, count: int) -> list[str]:
    """Continuations of the first ``count`` of :data:`SAMPLE_PROMPTS` by the exported model."""
    if not hf_path or count <= 0:
        return []
    from levanter.compat.hf_checkpoints import import_from_hf

    model = import_from_hf(hf_path)
    tokenizer = load_tokenizer(tokenizer_location)
    prompts = list(SAMPLE_PROMPTS[:count])
    sampling = SamplingConfig(max_new_tokens=160, temperature=0.7, top_k=40)
    # Sampling compiles and runs a decoding loop: tens of seconds on a small CPU, said beforehand.
    logger.info("Sampling %d continuation(s) of up to %d tokens from the exported model (temperature %g, top-k %d)...",
                len(prompts), sampling.max_new_tokens, sampling.temperature, sampling.top_k)
    started = time.monotonic()
    texts = generate_text(model, tokenizer, prompts, sampling)
    logger.info("Sampled %d continuation(s) in %.1fs.", len(texts), time.monotonic() - started)
    return texts
