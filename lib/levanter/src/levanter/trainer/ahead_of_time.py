"""Compile a training step for devices this machine does not have, and say what it will cost.

``compile_train_step`` builds the same jitted step the :class:`~levanter.trainer.Trainer` runs (the
same :func:`~levanter.trainer.step.build_step_functions`, parameters and optimizer state laid out
by the same rules) from *abstract* arrays (shapes, dtypes and shardings, no values), lowers it for
a mesh of the given devices and compiles it. Given the devices of a TPU topology
(:func:`tpu_topology_devices`, which needs ``libtpu`` but no chip) a CPU-only machine compiles the
real TPU program, Pallas kernels included, and XLA's own analyses of that program give:

- the bytes each chip holds while the step runs (arguments, outputs, temporaries; donated
  arguments counted once), :class:`StepMemory`;
- the step's matmul FLOPs per chip, every loop's body counted as often as it runs
  (:mod:`levanter.trainer.step_flops`; XLA's cost analysis counts a loop's body once);
- the collectives per step (all-reduce, all-gather, reduce-scatter, all-to-all, permutes), each
  counted as many times as the loops around it run (:mod:`levanter.trainer.collectives`).

Nothing runs and nothing is allocated on any device: a step that would not fit is found before
anyone pays for the chips.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from levanter.errors import LevanterError
from levanter.optim import OptimizerConfig
from levanter.trainer.bad_steps import BadStepHistory
from levanter.trainer.collectives import CollectiveCounts, count_collectives
from levanter.trainer.config import MeshConfig, TrainerConfig
from levanter.trainer.initial_state import optimizer_state_shardings
from levanter.trainer.mixed_precision import cast_floating, resolve_compute_dtype
from levanter.trainer.state import TrainState
from levanter.trainer.step import DeviceBatch, build_step_functions
from levanter.trainer.step_flops import StepFlops, count_step_flops


class AheadOfTimeError(LevanterError, ValueError):
    """A topology or mesh that cannot be compiled for as asked."""


@dataclass(frozen=True)
class StepMemory:
    """Bytes one chip holds while the step runs, from XLA's memory analysis of the compiled step.

    ``arguments``: the state and batch coming in; ``outputs``: the state and metrics going out;
    ``aliased``: the part of the outputs written in place of donated arguments (the state), so
    counted once; ``temporaries``: everything else alive at the step's peak (activations, gradients,
    workspace). ``generated_code``: the program itself. ``peak``: XLA's own peak of the bytes alive at
    once, the figure it holds against the chip's memory (None where the compiler does not say); the
    sum in ``total`` can exceed it, as not every temporary and argument is alive at the same time.

    With the optimizer's state in the host's memory (``host`` > 0) ``temporaries``, ``total`` and
    ``peak`` overstate the chip's share: llama_1_4b's offloaded step reports a peak of 19.8 GiB and
    compiles for a chip of 13.5 GiB. There the limit a step compiles under
    (``compile_train_step(memory_limit=)``) is the measure.
    """

    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    generated_code: int
    host: int = 0  # arguments kept in the host's memory (offloaded optimizer state): not on the chip
    peak: int | None = None

    @property
    def total(self) -> int:
        """Every byte the step holds on the chip, summed as if all were alive at once: an upper bound
        of ``peak``."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.generated_code

    @classmethod
    def of(cls, compiled) -> "StepMemory":
        stats = compiled.memory_analysis()
        return cls(
            arguments=int(stats.argument_size_in_bytes),
            outputs=int(stats.output_size_in_bytes),
            aliased=int(stats.alias_size_in_bytes),
            temporaries=int(stats.temp_size_in_bytes),
            generated_code=int(stats.generated_code_size_in_bytes),
            host=int(getattr(stats, "host_argument_size_in_bytes", 0)),
            peak=int(stats.peak_memory_in_bytes) if getattr(stats, "peak_memory_in_bytes", None) else None,
        )


@dataclass(frozen=True)
class CompiledStep:
    """One training step compiled for a device mesh, and what XLA says it costs per chip."""

    compiled: Any  # jax.stages.Compiled
    mesh: dict[str, int]  # mesh axis -> size
    device_kind: str
    num_devices: int
    memory: StepMemory
    flops: float | None  # XLA's compiled cost analysis per chip: a loop's body counted once, so not per step
    collectives: CollectiveCounts
    compile_seconds: float
    step_flops: StepFlops | None = None  # matmul FLOPs per chip per step, loops counted in full

    fits = True  # XLA compiles only a step whose memory fits its chips

    def summary(self) -> dict[str, Any]:
        """Plain data for a JSON line."""
        return {
            "device_kind": self.device_kind,
            "num_devices": self.num_devices,
            "mesh": self.mesh,
            "memory": {**dataclasses.asdict(self.memory), "total": self.memory.total},
            "flops_per_chip": self.flops,
            "step_flops": self.step_flops.summary() if self.step_flops is not None else None,
            "collectives": self.collectives.summary(),
            "compile_seconds": round(self.compile_seconds, 2),
        }


@dataclass(frozen=True)
class DoesNotFit:
    """A step XLA refused to compile because one chip's memory cannot hold it: the bytes it asked for
    and the bytes it had (XLA's figures, to its two decimals of a GiB), read from its refusal."""

    mesh: dict[str, int]
    device_kind: str
    num_devices: int
    needed_bytes: int | None  # None where the refusal names no figure this reads
    available_bytes: int | None
    message: str  # XLA's refusal, first line
    compile_seconds: float
    step_flops: StepFlops | None = None  # known from the lowered program, before compiling

    fits = False

    @classmethod
    def read(cls, error: Exception) -> "DoesNotFit | None":
        """The refusal in ``error``, or None when ``error`` is not XLA running out of memory."""
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        if "RESOURCE_EXHAUSTED" not in message or "memory" not in message.lower():
            return None
        needed, available = _oom_figures(message)
        return cls(mesh={}, device_kind="", num_devices=0, needed_bytes=needed, available_bytes=available,
                   message=message, compile_seconds=0.0)

    def summary(self) -> dict[str, Any]:
        return {
            "device_kind": self.device_kind,
            "num_devices": self.num_devices,
            "mesh": self.mesh,
            "needed_bytes": self.needed_bytes,
            "available_bytes": self.available_bytes,
            "message": self.message,
            "step_flops": self.step_flops.summary() if self.step_flops is not None else None,
            "compile_seconds": round(self.compile_seconds, 2),
        }


# XLA's two ways of saying it: "the total memory required for HLO temporaries (39.51G) exceeds available
# HBM (15.75G)" (a figure that counts the arguments too) and "Used 18.74G of 15.75G hbm". G is a GiB.
_REQUIRED = re.compile(r"\(([\d.]+)([KMGT])i?B?\) exceeds available \w+ \(([\d.]+)([KMGT])i?B?\)")
_USED = re.compile(r"Used ([\d.]+)([KMGT])i?B? of ([\d.]+)([KMGT])i?B? \w+")
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _oom_figures(message: str) -> tuple[int | None, int | None]:
    found = _REQUIRED.search(message) or _USED.search(message)
    if found is None:
        return None, None
    need, need_unit, have, have_unit = found.groups()
    return int(float(need) * _UNIT[need_unit]), int(float(have) * _UNIT[have_unit])


# TPU generations as libtpu's topology descriptions name them (``v5e:2x2``), by the device kind
# a chip of each reports.
TOPOLOGY_PREFIXES = {"v4": "TPU v4", "v5e": "TPU v5 lite", "v5p": "TPU v5", "v6e": "TPU v6 lite"}
# libtpu describes a v4 chip's two TensorCores as two devices unless asked for megacore, the one
# device a chip that a v4 program runs on.
_TOPOLOGY_OPTIONS = {"v4": {"chip_config_name": "megacore"}}


def tpu_topology_devices(topology: str, *, slices: int = 1) -> list:
    """The devices of a TPU topology such as ``"v5e:2x2"``, ``"v5e:16x16"`` or ``"v5p:4x4x4"``,
    compiled for without a chip (needs ``libtpu`` installed beside jaxlib); with ``slices`` > 1, that
    many such slices, each device carrying its ``slice_index``.

    libtpu refuses single-chip topologies; take one device of ``"v5e:2x2"`` for one chip.
    """
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - every supported JAX has it
        raise AheadOfTimeError(f"This JAX cannot describe TPU topologies: {e}") from None
    options = dict(_TOPOLOGY_OPTIONS.get(topology.partition(":")[0], {}))
    if slices > 1:
        options["num_slices"] = slices
    try:
        return list(topologies.get_topology_desc(platform="tpu", topology_name=topology, **options).devices)
    except Exception as e:  # libtpu missing, or a topology it does not know
        raise AheadOfTimeError(
            f"Cannot describe TPU topology {topology!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}. "
            "Compiling for a TPU without one needs libtpu of the version that goes with this jaxlib "
            "(pip install 'marin[test]' installs it) and a topology such as 'v5e:2x2', 'v5e:16x16' or 'v5p:4x4x4'."
        ) from None


def mesh_of(devices: Sequence[Any], mesh: MeshConfig) -> Mesh:
    """The ``(data, fsdp, experts, model)`` mesh of ``mesh``'s sizes over ``devices`` (all of them)."""
    from haliax.partitioning import PartitioningError, make_mesh

    try:
        return make_mesh(data=mesh.data, fsdp=mesh.fsdp, model=mesh.model, experts=mesh.experts, devices=list(devices))
    except PartitioningError as e:
        raise AheadOfTimeError(str(e)) from None


def abstract_train_state(
    init_model: Callable[[jax.Array], Any], config: TrainerConfig, optimizer_config: OptimizerConfig, mesh: Mesh
) -> tuple[TrainState, Any, Any]:
    """The state :func:`~levanter.trainer.initial_state.init_train_state` would create, as
    ``jax.ShapeDtypeStruct`` leaves carrying their shardings: (state, the model's static part,
    the optimizer). Nothing is allocated."""
    from haliax.module import logical_axes
    from haliax.partitioning import shardings_for

    key = jax.random.PRNGKey(config.seed)
    params, static = eqx.partition(eqx.filter_eval_shape(init_model, key), _is_floating)
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(static)):
        raise AheadOfTimeError("Compiling ahead of time needs a model whose only arrays are floating parameters.")
    params = cast_floating(params, jnp.float32)
    param_shardings = shardings_for(params, mesh)
    params = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s), params, param_shardings)
    param_axes = logical_axes(params)
    optimizer = optimizer_config.build(
        config.num_train_steps, weight_decay_mask=optimizer_config.weight_decay_mask(params, param_axes), param_axes=param_axes
    )
    replicated = NamedSharding(mesh, PartitionSpec())
    opt_state = jax.eval_shape(optimizer.init, params)
    opt_shardings = optimizer_state_shardings(opt_state, params, param_shardings, replicated,
                                              on_host=config.offload_optimizer_state)
    opt_state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), opt_state, opt_shardings)

    def placed(value):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x), sharding=replicated), value)

    state = TrainState(
        step=placed(jnp.zeros((), jnp.int32)),
        params=params,
        opt_state=opt_state,
        key=placed(jax.eval_shape(lambda: jax.random.PRNGKey(0))),
        ema=params if config.ema_decay is not None else None,
        bad_steps=placed(jax.eval_shape(lambda: BadStepHistory.fresh(config.skip_loss_window))) if config.skip_bad_steps else None,
    )
    return state, static, optimizer


def abstract_batch(rows: int, seq_len: int, sharding: NamedSharding, *, segments: bool = True) -> DeviceBatch:
    """A batch as the loader hands it to the step: int32 tokens, float32 loss mask, int32 segment ids."""

    def spec(dtype):
        return jax.ShapeDtypeStruct((rows, seq_len), dtype, sharding=sharding)

    return DeviceBatch(tokens=spec(jnp.int32), loss_mask=spec(jnp.float32), segment_ids=spec(jnp.int32) if segments else None)


# The mesh axes that split a batch's rows (as the Trainer's).
BATCH_AXES = ("data", "fsdp", "experts")


def train_step_function(static: Any, optimizer: Any, config: TrainerConfig, optimizer_config: OptimizerConfig,
                        state_shardings: Any, mesh: Mesh, compute_dtype) -> Callable[..., Any]:
    """The trainer's jitted ``train_step(state, batch, learning_rate)`` for a state laid out as
    ``state_shardings`` on ``mesh`` (the same program :class:`~levanter.trainer.Trainer` runs, without
    its hooks): for compiling ahead of time here and for timing a step on a chip (``bench/``)."""
    from haliax.partitioning import use_mesh

    steps = build_step_functions(
        static_model=static,
        optimizer=optimizer,
        lr_schedule=optimizer_config.lr_scheduler(config.num_train_steps),
        compute_dtype=compute_dtype,
        z_loss_weight=config.z_loss_weight,
        num_microbatches=config.num_microbatches,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding_of(mesh),
        mesh_context=lambda: use_mesh(mesh),
        learning_rate_input=True,
    )
    return steps.train_step


def batch_sharding_of(mesh: Mesh) -> NamedSharding:
    """Rows split over the data axes, as the Trainer lays batches out."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, None))


def check_batch_splits(config: TrainerConfig, mesh: Mesh) -> None:
    rows = config.microbatch_size or config.batch_size
    parallel = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
    if rows % parallel:
        raise AheadOfTimeError(
            f"Each (micro)batch of {rows} rows must split evenly over data x fsdp x experts = {parallel} devices."
        )


def compile_train_step(
    init_model: Callable[[jax.Array], Any],
    config: TrainerConfig,
    optimizer_config: OptimizerConfig,
    *,
    seq_len: int,
    devices: Sequence[Any],
    compute_dtype: str | None = None,
    segments: bool = True,
    memory_limit: int | None = None,
) -> CompiledStep | DoesNotFit:
    """Lower and compile the training step of ``init_model``'s model for a mesh of ``devices``.

    ``config.mesh`` gives the mesh's shape (one axis may be -1: the rest of the devices);
    ``config.batch_size`` and ``microbatch_size`` the rows; ``compute_dtype`` defaults to
    ``config.compute_dtype`` resolved for the devices' platform (bf16 on TPUs). ``segments``:
    whether batches carry document ids (packed documents, as the loader makes them).
    ``memory_limit``: compile as for TPU chips of this many bytes of memory (rounded down to a MiB)
    instead of the chips' own: a step that compiles under a limit below the chip's has at least the
    difference to spare (see :class:`StepMemory` on offloaded state, where the analysis cannot say).

    A step that needs more memory than the chip has is not an error here: XLA's refusal is read
    into :class:`DoesNotFit`, which carries the bytes it asked for. The step's FLOPs are counted
    from the lowered program either way (:mod:`levanter.trainer.step_flops`).
    """
    mesh = mesh_of(devices, config.mesh)
    check_batch_splits(config, mesh)
    options = _memory_limit_options(memory_limit, mesh)
    dtype = resolve_compute_dtype(compute_dtype or config.compute_dtype, mesh.devices.flat[0].platform)
    state, static, optimizer = abstract_train_state(init_model, config, optimizer_config, mesh)
    train_step = train_step_function(static, optimizer, config, optimizer_config, jax.tree.map(lambda x: x.sharding, state), mesh, dtype)
    batch = abstract_batch(config.batch_size, seq_len, batch_sharding_of(mesh), segments=segments)
    rate = jax.ShapeDtypeStruct((), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
    started = time.perf_counter()
    lowered = train_step.lower(state, batch, rate)
    step_flops = count_step_flops(lowered.as_text(dialect="hlo"), int(mesh.devices.size))
    placement = {"mesh": {axis: int(size) for axis, size in mesh.shape.items()},
                 "device_kind": str(mesh.devices.flat[0].device_kind), "num_devices": int(mesh.devices.size)}
    try:
        with _no_persistent_cache_entry(mesh):
            compiled = lowered.compile(compiler_options=options)
    except Exception as e:  # XLA raises its own runtime error type; anything but running out of memory propagates
        refusal = DoesNotFit.read(e)
        if refusal is None:
            raise
        return dataclasses.replace(refusal, **placement, step_flops=step_flops, compile_seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    return CompiledStep(
        compiled=compiled,
        **placement,
        memory=StepMemory.of(compiled),
        flops=_flops(compiled),
        collectives=count_collectives(compiled.as_text()),
        compile_seconds=seconds,
        step_flops=step_flops,
    )


@contextlib.contextmanager
def _no_persistent_cache_entry(mesh: Mesh) -> Iterator[None]:
    """Compile without writing to JAX's persistent compilation cache when ``mesh``'s devices are a
    topology's, described without a chip: an executable compiled for them cannot be loaded, so the
    cache would only store (megabytes a step, seconds of serializing) what it can never read back."""
    if type(mesh.devices.flat[0].client).__name__ != "CompileOnlyPyClient":
        yield
        return
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", threshold)


def _memory_limit_options(memory_limit: int | None, mesh: Mesh) -> dict[str, int] | None:
    if memory_limit is None:
        return None
    platform = mesh.devices.flat[0].platform
    if platform != "tpu":
        raise AheadOfTimeError(f"memory_limit applies to TPU chips; these devices are {platform!r}.")
    if memory_limit < 2**20:
        raise AheadOfTimeError(f"memory_limit is in bytes and must be at least 1 MiB; got {memory_limit}.")
    return {"xla_tpu_max_hbm_size_mib": memory_limit // 2**20}


def _flops(compiled) -> float | None:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return float(analysis["flops"])


def _is_floating(x) -> bool:
    return isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)
