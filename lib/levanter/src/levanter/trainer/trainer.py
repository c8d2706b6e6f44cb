"""The training loop: initialise or resume, run jitted steps, log, evaluate, checkpoint.

The host loop stays thin: step ``k+1`` is dispatched before the scalars of step ``k`` are fetched,
so the device always has queued work while the host writes metrics; batches are prepared in a
background thread. Every step gets a line in ``metrics.jsonl``; a non-finite loss stops the run
with the step's number, before that state can be checkpointed (:mod:`levanter.trainer.step_metrics`).
With ``skip_bad_steps`` a bad step is skipped inside the compiled step instead
(:mod:`levanter.trainer.bad_steps`); with ``ema_decay`` the state keeps an average of the weights,
evaluated beside them and returned as the model.
Logging, checkpoints and evaluation (:mod:`levanter.trainer.evaluation`) are hooks, each on its own
schedule (:mod:`levanter.trainer.hooks`); the rates they report come from
:mod:`levanter.trainer.throughput`. A fresh state comes from :mod:`levanter.trainer.initial_state`.
Between steps the loop asks its stop sources (see :mod:`levanter.trainer.stopping`; SIGTERM is one)
whether to checkpoint and stop, or to stop writing at once.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from levanter.data.batch import Batch
from levanter.distributed import initialize_distributed
from levanter.optim import OptimizerConfig
from levanter.trainer.checkpoint import Checkpointer
from levanter.trainer.config import BATCH_AXES, MeshConfig, MeshConfigError, TrainerConfig, TrainerConfigError
from levanter.trainer.data_feed import DataSourceError, Prefetcher
from levanter.trainer.evaluation import EvalSources, eval_hook, evaluate_sets
from levanter.trainer.hardware import peak_flops_per_device
from levanter.trainer.hooks import AtLastStep, Hook, ModelEvaluation, ModelPublisher, StepInfo, due_hooks, run_hooks
from levanter.trainer.bad_steps import BadStepRule
from levanter.trainer.initial_state import init_train_state, whole_model, with_fresh_average, with_reference
from levanter.trainer.mixed_precision import resolve_compute_dtype
from levanter.trainer.profiler import StepProfiler
from levanter.trainer.state import FrozenArrays, TrainState
from levanter.trainer.step import Objective, build_step_functions
from levanter.trainer.step_metrics import logging_hooks, record_step
from levanter.trainer.stopping import (
    StopAction,
    StopRequest,
    StopSignal,
    StopSource,
    TrainingAbandoned,
    TrainingPreempted,
    first_stop_request,
)
from levanter.trainer.throughput import ThroughputMeter
from levanter.trainer.tracker import build_trackers
from rigging import filesystem as fsx
from rigging.progress import terminal_bar

logger = logging.getLogger("levanter.trainer")


class DataSource(Protocol):
    def iter_from(self, start_step: int) -> Iterator[Batch]: ...


# Called after each step's metrics are recorded: hook(trainer, step, metrics).
StepHook = Callable[["Trainer", int, Mapping[str, Any]], None]


@dataclass
class TrainResult:
    state: TrainState
    model: Any
    final_step: int
    final_train_loss: float | None
    eval_losses: dict[str, float]
    checkpoint_dir: str
    checkpoint_steps: list[int]
    metrics_path: str
    resumed_from: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    # The checkpoint resumed from without verifying its files (allow_unverified_checkpoints); None when verified.
    unverified_checkpoint: str | None = None
    # With TrainerConfig.ema_decay: the latest losses of the weight average (``model`` is the average).
    ema_eval_losses: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Trains one model with one optimizer config on one data source.

    ``output_dir`` (a local path or any fsspec URL: ``s3://``, ``gs://``, ``memory://``...) receives
    ``checkpoints/``, ``metrics.jsonl`` and tracker folders. If it already holds checkpoints,
    training resumes from the newest one. ``flops_per_token`` (a number, or a function of the
    sequence length, called once the first batch arrives) enables MFU.
    ``stop_sources`` are polled between steps (:mod:`levanter.trainer.stopping`); SIGTERM, when
    training runs in the main thread, is one more.

    ``trainable`` (a function of the freshly built model returning an Equinox filter, e.g.
    ``levanter.lora.lora_trainable_filter``) chooses which floating arrays train; the others
    become the state's frozen arrays (:class:`~levanter.trainer.state.FrozenArrays`). By default
    every floating array trains. ``keep_reference`` keeps a frozen copy of the trainable arrays as
    training starts (after ``initialize``), the reference model of a preference ``objective``
    (:class:`~levanter.trainer.step.Objective`; by default the next-token loss).
    ``model_evaluations`` (:class:`~levanter.trainer.hooks.ModelEvaluation`) run the caller's own
    evaluations of the live model on their schedules, after the loss evaluation.
    ``model_publishers`` (:class:`~levanter.trainer.hooks.ModelPublisher`) hand the live weights to
    whoever produces the next batches (a reinforcement-learning run's samplers). A batch's own
    ``Batch.metrics`` join its step's line.
    """

    def __init__(
        self,
        config: TrainerConfig,
        optimizer: OptimizerConfig,
        *,
        output_dir: str,
        flops_per_token: float | Callable[[int], float] | None = None,
        run_config: Mapping[str, Any] | None = None,
        hooks: Iterable[StepHook] = (),
        asynchronous_checkpoints: bool = True,
        stop_sources: Iterable[StopSource] = (),
        trainable: Callable[[Any], Any] | None = None,
        keep_reference: bool = False,
        objective: Objective | None = None,
        train_model_transform: Callable[[Any, jax.Array], Any] | None = None,
        model_evaluations: Iterable[ModelEvaluation] = (),
        model_publishers: Iterable[ModelPublisher] = (),
    ):
        self.config = config
        self.trainable = trainable
        self.keep_reference = keep_reference
        self.objective = objective
        self.train_model_transform = train_model_transform  # e.g. LoRA dropout: see build_step_functions
        self.optimizer_config = optimizer
        self.output_dir = fsx.absolute(output_dir)
        self.flops_per_token = flops_per_token
        self.run_config = dict(run_config or {})
        self.hooks = list(hooks)
        self.model_evaluations = list(model_evaluations)
        self.model_publishers = list(model_publishers)
        self.stop_sources = list(stop_sources)
        self._sigterm = StopSignal()  # replaced by each train(): a finished run's SIGTERM is not the next one's
        # A job launched as several replicas joins jax.distributed here, before anything asks JAX
        # for its devices; the mesh below then spans the devices of every process.
        initialize_distributed()
        # Every process sees the same metrics; only the first reports them, the others keep a
        # file of their own (for debugging) instead of writing over the shared one.
        self.is_reporting_process = jax.process_index() == 0
        metrics_name = "metrics.jsonl" if self.is_reporting_process else f"metrics.process-{jax.process_index()}.jsonl"
        self.metrics_path = fsx.join(self.output_dir, metrics_name)
        self.compute_dtype = resolve_compute_dtype(config.compute_dtype)
        self.mesh = self._build_mesh()
        self.checkpointer = Checkpointer(
            fsx.join(self.output_dir, "checkpoints"),
            every_steps=config.steps_per_checkpoint,
            every_minutes=config.minutes_per_checkpoint,
            keep_last=config.keep_last_checkpoints,
            keep_every=config.keep_every,
            asynchronous=asynchronous_checkpoints,
            allow_unverified=config.allow_unverified_checkpoints,
        )
        self.batch_sharding = self._batch_sharding()
        self._peak_flops = peak_flops_per_device()

    # -- set-up ----------------------------------------------------------------------------------

    def _build_mesh(self):
        from haliax.partitioning import make_mesh

        return make_mesh(**self.config.mesh.sizes(), devices=mesh_devices(jax.devices(), self.config.mesh))

    @property
    def batch_parallelism(self) -> int:
        return int(np.prod([self.mesh.shape[axis] for axis in BATCH_AXES]))

    def _batch_sharding(self) -> NamedSharding:
        rows = self.config.microbatch_size or self.config.batch_size
        if rows % self.batch_parallelism:
            axes = " x ".join(a for a in BATCH_AXES if a != "experts" or self.mesh.shape[a] > 1)
            raise TrainerConfigError(
                f"Each (micro)batch of {rows} rows must split evenly over {axes} = "
                f"{self.batch_parallelism} devices; change batch_size/microbatch_size or the mesh."
            )
        return NamedSharding(self.mesh, PartitionSpec(BATCH_AXES, None))

    def _mesh_context(self):
        from haliax.partitioning import use_mesh

        return use_mesh(self.mesh)

    def _eval_sharding(self, rows: int) -> NamedSharding:
        if rows % self.batch_parallelism:
            return NamedSharding(self.mesh, PartitionSpec())  # odd-sized eval batches: replicated
        return self.batch_sharding

    def init_state(self, init_model: Callable[[jax.Array], Any]) -> tuple[TrainState, Any, optax.GradientTransformation]:
        """A fresh, sharded state; returns it, the model's static part and the optimizer."""
        return init_train_state(
            init_model, self.config, self.optimizer_config, self.mesh,
            trainable=self.trainable, keep_reference=self.keep_reference,
        )

    @staticmethod
    def shardings_of(state: TrainState) -> TrainState:
        return jax.tree.map(lambda x: x.sharding, state)

    # -- the loop ---------------------------------------------------------------------------------

    def starting_state(
        self, init_model: Callable[[jax.Array], Any], initialize: Callable[[TrainState], TrainState] | None = None
    ) -> tuple[TrainState, Any, optax.GradientTransformation, int | None]:
        """The state training starts from, the model's static part, the optimizer, and the step resumed from.

        The run's own newest checkpoint comes first (damaged ones are set aside, see
        :meth:`Checkpointer.restore_latest`); only a run without one is fresh, and then
        ``initialize`` (when given) replaces the fresh state, e.g. with existing weights. So a run
        started from existing weights and then preempted resumes from its own checkpoint.
        """
        state, static, optimizer = self.init_state(init_model)
        resumed_from, state = self.checkpointer.restore_latest(state) or (None, state)
        if resumed_from is not None:
            unverified = "" if self.checkpointer.restored_unverified is None else " (unverified: it has no checksums)"
            logger.info("Resumed from checkpoint step %d in %s%s.", resumed_from, self.checkpointer.directory, unverified)
        elif initialize is not None:
            fresh = state
            state = initialize(fresh)
            if jax.tree.structure(state) != jax.tree.structure(fresh):
                raise TrainerConfigError("initialize must return a state of the same structure as the fresh one it is given.")
            state = with_reference(state, self.keep_reference)  # the reference is the weights training starts from
            state = with_fresh_average(state, self.config.ema_decay is not None)  # so is the average's start
        return state, static, optimizer, resumed_from

    def train(
        self,
        init_model: Callable[[jax.Array], Any],
        train_source: DataSource,
        eval_sources: EvalSources | None = None,
        *,
        initialize: Callable[[TrainState], TrainState] | None = None,
    ) -> TrainResult:
        """Train from the run's own newest checkpoint, else from ``initialize(fresh state)`` when
        given, else from ``init_model``'s random weights (see :meth:`starting_state`)."""
        cfg = self.config
        eval_sources = dict(eval_sources or {})
        state, static, optimizer, resumed_from = self.starting_state(init_model, initialize)
        unverified_checkpoint = self.checkpointer.restored_unverified if resumed_from is not None else None
        start_step = int(state.step)

        lr_schedule = self.optimizer_config.lr_scheduler(cfg.num_train_steps)
        steps = build_step_functions(
            static_model=static,
            optimizer=optimizer,
            lr_schedule=lr_schedule,
            compute_dtype=self.compute_dtype,
            z_loss_weight=cfg.z_loss_weight,
            num_microbatches=cfg.num_microbatches,
            state_shardings=self.shardings_of(state),
            batch_sharding=self.batch_sharding,
            mesh_context=self._mesh_context,
            # The rate of each step is an input: the compiled step does not depend on the run's
            # length or schedule, so a rerun with other ones reuses it from the compilation cache.
            learning_rate_input=True,
            objective=self.objective,
            train_model_transform=self.train_model_transform,
            optimizer_needs_objective=self.optimizer_config.needs_objective,
            bad_step_rule=BadStepRule(cfg.skip_loss_spike_factor) if cfg.skip_bad_steps else None,
            ema_decay=cfg.ema_decay,
            ema_point=self.optimizer_config.evaluation_params,  # the average of what is evaluated (schedule-free's x)
        )
        self._steps = steps
        self._static = static
        # Under jit the schedule is one program; evaluated op by op, each of its ten or so operations
        # is compiled on its own (about 0.15 CPU-s on the CPU, more per op on an accelerator).
        self._learning_rates = np.asarray(jax.jit(lr_schedule)(np.arange(cfg.num_train_steps)), np.float32)
        self._profiler = StepProfiler(cfg.profile, self.output_dir)

        trackers = build_trackers(
            cfg.trackers if self.is_reporting_process else ("jsonl",),
            metrics_path=self.metrics_path,
            log_dir=self.output_dir,
            run_config={"trainer": cfg.to_dict(), "optimizer": self.optimizer_config.to_dict(), **self.run_config},
            wandb_project=cfg.wandb_project,
            wandb_run_name=cfg.wandb_run_name,
            # The steps after the checkpoint are about to be logged again: cut the file back to it.
            resume_step=start_step if resumed_from is not None else None,
        )
        history: list[dict[str, Any]] = []
        eval_losses: dict[str, float] = {}
        ema_eval_losses: dict[str, float] = {}
        last_loss: float | None = None
        previous_handler = self._install_sigterm_handler()
        try:
            if start_step < cfg.num_train_steps:
                state, last_loss = self._run_loop(
                    state, start_step, train_source, eval_sources, trackers, history, eval_losses, ema_eval_losses
                )
            else:
                logger.info("Nothing to train: checkpoint step %d already reaches num_train_steps.", start_step)
                last_loss = _last_logged_loss(self.metrics_path)
                eval_losses = self.evaluate(self.training_point(state), eval_sources, state.frozen)
                if state.ema is not None:
                    ema_eval_losses = self.evaluate(state.ema, eval_sources, state.frozen)
            self.raise_if_abandoned(int(state.step))
            if cfg.checkpoint_at_end:
                trackers.flush()
                self.checkpointer.save(int(state.step), state)
            self.checkpointer.wait()
            summary = {"final/train_loss": last_loss, **{f"final/eval/{k}/loss": v for k, v in eval_losses.items()},
                       **{f"final/eval_ema/{k}/loss": v for k, v in ema_eval_losses.items()}}
            if unverified_checkpoint is not None:
                summary["unverified_checkpoint"] = unverified_checkpoint
            trackers.log_summary(summary)
        finally:
            trackers.close()
            if previous_handler is not None:
                signal.signal(signal.SIGTERM, previous_handler)

        return TrainResult(
            state=state,
            model=whole_model(replace(state, params=self.evaluation_params(state)), static),
            final_step=int(state.step),
            final_train_loss=last_loss,
            eval_losses=eval_losses,
            checkpoint_dir=self.checkpointer.directory,
            checkpoint_steps=self.checkpointer.all_steps(),
            metrics_path=self.metrics_path,
            resumed_from=resumed_from,
            history=history,
            unverified_checkpoint=unverified_checkpoint,
            ema_eval_losses=ema_eval_losses,
        )

    def _install_sigterm_handler(self):
        """Turn SIGTERM (how schedulers announce preemption) into a PREEMPT request: checkpoint at
        the end of the current step, then stop. Signals can only be handled in the main thread;
        code that trains in another thread passes its own stop source for them."""
        self._sigterm = StopSignal()
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_sigterm(signum, frame):
            logger.warning("SIGTERM received: checkpointing after the current step, then stopping.")
            self._sigterm.request(StopAction.PREEMPT, "SIGTERM (preemption notice)")

        return signal.signal(signal.SIGTERM, on_sigterm)

    def stop_request(self) -> StopRequest | None:
        """What the stop sources ask for now (ABANDON before PREEMPT), or None to keep going."""
        return first_stop_request([self._sigterm, *self.stop_sources])

    def raise_if_abandoned(self, step: int) -> None:
        """Raise :class:`TrainingAbandoned` if a stop source says the output is no longer ours.

        Called before anything is written outside the loop (the final checkpoint here, the eval
        record and export in ``train_lm``), so a run that lost its output writes nothing more.
        """
        stop = self.stop_request()
        if stop is not None and stop.action is StopAction.ABANDON:
            raise self._abandoned(step, stop)

    def _abandoned(self, step: int, stop: StopRequest) -> TrainingAbandoned:
        logger.error("Stopping at step %d without writing anything more: %s", step, stop.reason)
        return TrainingAbandoned(
            f"Training stopped at step {step} and wrote nothing more to {self.output_dir}: {stop.reason}. "
            "Whoever owns that folder now carries on; checkpoints written before this are kept."
        )

    def _run_loop(self, state, start_step, train_source, eval_sources, trackers, history, eval_losses, ema_eval_losses):
        last_step = self.config.num_train_steps
        meter = ThroughputMeter(
            time.monotonic(), num_devices=self.mesh.devices.size, peak_flops_per_device=self._peak_flops
        )
        bar = terminal_bar(last_step - start_step, "training", unit="step")  # on a terminal; else console lines
        log_hooks = logging_hooks(self.config, trackers, history, meter, bar, self._call_callers_hooks)
        record = functools.partial(record_step, meter=meter, log_hooks=log_hooks, last_step=last_step)
        save = self._checkpoint_hook(trackers)
        evals = [self._eval_hook(eval_sources, trackers, history, eval_losses, ema_eval_losses)] if eval_sources else []
        model_evals = [self._model_evaluation_hook(evaluation, trackers, history) for evaluation in self.model_evaluations]
        publishers = [self._publisher_hook(publisher) for publisher in self.model_publishers]
        step_hooks = [save, *evals, *model_evals, *publishers]
        for publisher in self.model_publishers:  # the weights the first batches are made with
            publisher.publish(self.live_model(state), start_step)
        if start_step == 0:
            for evaluation, hook in zip(self.model_evaluations, model_evals):
                if evaluation.at_start:
                    hook.run(StepInfo(0, {}, state))
        prefetch = Prefetcher(train_source.iter_from(start_step), self.batch_sharding)
        pending: tuple[int, dict[str, jax.Array]] | None = None  # a step whose scalars are read while the next one runs
        line: dict[str, Any] = {}  # the latest step's metrics
        try:
            for step in range(start_step + 1, last_step + 1):
                host_batch, device_batch = self._next_batch(prefetch, step - 1, start_step)
                if meter.tokens_per_step is None:  # the first batch gives the sequence length
                    meter.set_batch(
                        self.config.batch_size * host_batch.seq_len,
                        completed_steps=start_step,
                        flops_per_token=self._flops_per_token(host_batch.seq_len),
                    )
                with self._profiler.step(step):
                    state, metrics = self._steps.train_step(state, device_batch, self._learning_rates[step - 1])
                metrics = {**metrics, **host_batch.metrics}  # measured where the batch was made
                self._profiler.step_dispatched(step, state)
                self.raise_if_abandoned(step)  # before the previous step's metrics are written
                if pending is not None:
                    line = record(*pending)  # the previous step, while this one runs
                pending = (step, metrics)
                # Asked again: a signal or a hook may have asked while those metrics were written.
                stop = self.stop_request()
                if stop is not None and stop.action is StopAction.ABANDON:
                    raise self._abandoned(step, stop)
                # On the last step a preemption changes nothing: the run ends and saves anyway.
                preempted = stop is not None and step != last_step
                due = [save] if preempted else due_hooks(step_hooks, step, last_step)
                if due or step == last_step:
                    line = record(*pending)  # what these hooks do comes after the step's metrics
                    pending = None
                    run_hooks(due, StepInfo(step, line, state))
                if preempted:
                    self.checkpointer.wait()
                    raise TrainingPreempted(
                        f"Stopped after step {step}: {stop.reason}. Checkpoint saved in "
                        f"{self.checkpointer.path_of(step)}; run again to resume."
                    )
                if due:
                    meter.restart_clock(time.monotonic())  # the next step's rate should not include eval/saving
        finally:
            prefetch.close()
            self._profiler.stop()  # a window that reaches past the last step ends with the loop
            if bar is not None:
                bar.close()
        return state, line["loss"]

    def _next_batch(self, prefetch: Prefetcher, index: int, start_step: int):
        """The batch at ``index`` in the training source (the one step ``index + 1`` trains on), checked."""
        cfg = self.config
        try:
            host_batch, device_batch = prefetch.next()
        except StopIteration:
            raise DataSourceError(
                f"The training data source ended after {index - start_step} batches (at step "
                f"{index}); it must yield at least num_train_steps={cfg.num_train_steps} batches."
            ) from None
        local_rows = cfg.batch_size // jax.process_count()  # each process feeds its own rows
        if host_batch.batch_size != local_rows:
            raise DataSourceError(
                f"Batch at step {index} has {host_batch.batch_size} rows; expected {local_rows} "
                f"(TrainerConfig.batch_size={cfg.batch_size} over {jax.process_count()} process(es))."
            )
        return host_batch, device_batch

    def _flops_per_token(self, seq_len: int) -> float | None:
        if callable(self.flops_per_token):
            self.flops_per_token = float(self.flops_per_token(seq_len))  # resolved once, on the first batch
        return self.flops_per_token

    # -- hooks -----------------------------------------------------------------------------------

    def _call_callers_hooks(self, info: StepInfo) -> None:
        """The ``hooks`` given to the constructor, on each step's metrics line."""
        for hook in self.hooks:
            hook(self, info.step, info.metrics)

    def _checkpoint_hook(self, trackers) -> Hook:
        """By the checkpointer's own step and time policy; never on the last step, which ``train`` saves."""

        def save(info: StepInfo) -> None:
            self.raise_if_abandoned(info.step)  # asked while the metrics were written?
            # Metrics up to this step are stored before the checkpoint that a resume would cut them back to.
            trackers.flush()
            self.checkpointer.save(info.step, info.state)

        return Hook("checkpoint", save, every=None, when=self.checkpointer.due, at_last=AtLastStep.NEVER)

    def _eval_hook(self, eval_sources: EvalSources, trackers, history, results: dict[str, float],
                   ema_results: dict[str, float]) -> Hook:
        """Every ``eval_every`` steps and after the last; ``results`` (and ``ema_results``, for the
        weight average) keep the latest losses."""
        average = None
        if self.config.ema_decay is not None:
            average = lambda state: self.evaluate(state.ema, eval_sources, state.frozen)  # noqa: E731
        return eval_hook(
            lambda state: self.evaluate(self.training_point(state), eval_sources, state.frozen),
            trackers, history, results, every=self.config.eval_every, evaluate_average=average, average_results=ema_results,
        )

    def _model_evaluation_hook(self, evaluation: ModelEvaluation, trackers, history) -> Hook:
        """The caller's evaluation on the live weights (those exported), logged as ``<name>/<metric>``."""

        def run(info: StepInfo) -> None:
            model = whole_model(replace(info.state, params=self.evaluation_params(info.state)), self._static)
            line = {f"{evaluation.name}/{metric}": value for metric, value in evaluation.evaluate(model, info.step).items()}
            trackers.log(info.step, line)
            history.append({"step": info.step, **line})
            logger.info("step %d %s: %s", info.step, evaluation.name, ", ".join(f"{k} {v:.4f}" for k, v in line.items()))

        return Hook(evaluation.name, run, every=evaluation.every, at_last=AtLastStep.ALWAYS)

    def _publisher_hook(self, publisher: ModelPublisher) -> Hook:
        """The live weights to ``publisher`` every ``publisher.every`` steps; after the last step no batch follows."""
        return Hook(publisher.name, lambda info: publisher.publish(self.live_model(info.state), info.step),
                    every=publisher.every, at_last=AtLastStep.NEVER)

    def live_model(self, state: TrainState) -> Any:
        """The whole model at the weights being trained (:meth:`training_point`), on the state's buffers."""
        return whole_model(replace(state, params=self.training_point(state)), self._static)

    # -- evaluation ------------------------------------------------------------------------------

    def training_point(self, state: TrainState) -> Any:
        """The trained weights as evaluated (``eval/<set>/loss``): the state's, unless the optimizer
        trains at one point and evaluates at another (schedule-free)."""
        return self.optimizer_config.evaluation_params(state.params, state.opt_state)

    def evaluation_params(self, state: TrainState) -> Any:
        """The weights the returned model and exports hold: the weight average when the run keeps
        one (``ema_decay``), else :meth:`training_point`."""
        if state.ema is not None:
            return state.ema
        return self.training_point(state)

    def evaluate(self, params, eval_sources: EvalSources, frozen: FrozenArrays | None = None) -> dict[str, float]:
        """Mean next-token loss over the masked-in positions of each eval set."""
        return evaluate_sets(self._steps.eval_step, params, eval_sources, frozen, self._eval_sharding)


def _last_logged_loss(metrics_path: str) -> float | None:
    if not fsx.exists(metrics_path):
        return None
    from levanter.trainer.tracker import read_metrics

    losses = [r["loss"] for r in read_metrics(metrics_path) if r.get("loss") is not None]
    return losses[-1] if losses else None


def mesh_devices(devices: list[jax.Device], mesh: MeshConfig) -> list[jax.Device]:
    """The devices ``mesh`` runs on: all of them when an axis is -1, else as many as it has, the
    first ones of each process, as many from each.

    Every process feeds its own rows of each batch to its own devices, so each must hold an equal
    share of the mesh; one process's devices alone would leave the others nothing to feed.
    """
    sizes = mesh.sizes().values()
    if -1 in sizes:
        return devices
    needed = int(np.prod(list(sizes)))
    if needed > len(devices):
        raise MeshConfigError(f"Mesh {mesh.describe()} needs {needed} devices; only {len(devices)} are visible.")
    processes = sorted({device.process_index for device in devices})
    if needed % len(processes):
        raise MeshConfigError(
            f"Mesh {mesh.describe()} has {needed} devices, which do not spread evenly over the {len(processes)} "
            f"processes of this run; make it a multiple of {len(processes)}."
        )
    share = needed // len(processes)
    return [device for process in processes for device in [d for d in devices if d.process_index == process][:share]]
