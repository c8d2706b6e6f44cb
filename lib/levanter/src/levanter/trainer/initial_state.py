"""A fresh train state: the model's arrays created in their shardings, split into what trains and what does not.

A model built by ``init_model(key)`` is split three ways: the trainable floating arrays (the
state's ``params``, in f32 whatever dtype the model was built in: compute casts per step), the
frozen floating arrays (what a ``trainable`` filter leaves out, e.g. a base model under LoRA) and
the static rest (integer buffers, configuration), which :func:`whole_model` puts back together.
The optimizer state is created beside the parameters, each moment in its parameter's sharding.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from levanter.optim import OptimizerConfig
from levanter.trainer.bad_steps import BadStepHistory
from levanter.trainer.config import TrainerConfig
from levanter.trainer.mixed_precision import cast_floating
from levanter.trainer.state import FrozenArrays, TrainState

# The trainer's own logger: the parameter count is a line of the training log.
logger = logging.getLogger("levanter.trainer")


def init_train_state(
    init_model: Callable[[jax.Array], Any],
    config: TrainerConfig,
    optimizer_config: OptimizerConfig,
    mesh: Mesh,
    *,
    trainable: Callable[[Any], Any] | None = None,
    keep_reference: bool = False,
) -> tuple[TrainState, Any, optax.GradientTransformation]:
    """A fresh, sharded state; returns it, the model's static part and the optimizer.

    ``trainable`` and ``keep_reference`` mean what they mean to :class:`~levanter.trainer.Trainer`.
    """
    from haliax.module import logical_axes

    model_key, train_key = jax.random.split(jax.random.PRNGKey(config.seed))
    params, frozen_model, static = _init_params(init_model, model_key, mesh, trainable)
    param_shardings = jax.tree.map(lambda x: x.sharding, params)

    param_axes = logical_axes(params)
    decay_mask = optimizer_config.weight_decay_mask(params, param_axes)
    optimizer = optimizer_config.build(config.num_train_steps, weight_decay_mask=decay_mask, param_axes=param_axes)
    replicated = NamedSharding(mesh, PartitionSpec())
    abstract_opt = jax.eval_shape(optimizer.init, params)
    opt_shardings = optimizer_state_shardings(abstract_opt, params, param_shardings, replicated,
                                              on_host=config.offload_optimizer_state)
    opt_state = jax.jit(optimizer.init, out_shardings=opt_shardings)(params)
    state = TrainState(
        step=jax.device_put(jnp.asarray(0, jnp.int32), replicated),
        params=params,
        opt_state=opt_state,
        key=jax.device_put(train_key, replicated),
        bad_steps=jax.device_put(BadStepHistory.fresh(config.skip_loss_window), replicated) if config.skip_bad_steps else None,
    )
    state = with_fresh_average(state, config.ema_decay is not None)
    if frozen_model is not None or keep_reference:
        state = dataclasses.replace(state, frozen=FrozenArrays(model=frozen_model))
        state = with_reference(state, keep_reference)
    _log_parameter_counts(state)
    return state, static, optimizer


def optimizer_state_shardings(
    abstract_opt: Any, params: Any, param_shardings: Any, replicated: NamedSharding, *, on_host: bool = False
) -> Any:
    """A state array shaped like its parameter and kept under that parameter's path (Adam's
    moments: ``[1].mu.<the parameter's path>``) is laid out like it; one of another shape (Adam-mini's
    per-block second moment, SOAP's and Kron's per-matrix preconditioners) and the rest (step
    counts) are replicated. Found by key paths, not ``optax.tree_map_params``, whose placeholder
    parameters cannot pass through ``optax.partition``'s masked slots (Muon) or a state built from
    the parameters' shapes (SOAP, Kron). ``on_host``: every leaf in the host's memory instead
    (``TrainerConfig.offload_optimizer_state``)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    by_path = {tuple(path): (param.shape, sharding) for (path, param), sharding in zip(leaves, jax.tree.leaves(param_shardings))}

    def sharding_of(path, leaf):
        path = tuple(path)
        for start in range(len(path)):  # the parameter's path is a contiguous run of the leaf's
            for end in range(len(path), start, -1):
                shape, sharding = by_path.get(path[start:end], (None, None))
                if shape is not None and shape == leaf.shape:
                    return sharding
        return replicated

    shardings = jax.tree_util.tree_map_with_path(sharding_of, abstract_opt)
    if on_host:  # TrainerConfig.offload_optimizer_state: the step moves it in for the update
        shardings = jax.tree.map(lambda s: s.with_memory_kind(HOST_MEMORY), shardings)
    return shardings


# The memory kind of arrays kept in the host's memory, readable by the accelerator's transfers.
HOST_MEMORY = "pinned_host"


def with_reference(state: TrainState, keep_reference: bool) -> TrainState:
    """``state`` whose frozen reference is a copy of its trainable arrays now (when one is kept).

    Under LoRA (frozen base weights, adapters trained) the reference is the base model itself,
    read from the frozen arrays with the adapters at zero, so nothing is copied.
    """
    if not keep_reference or state.frozen.model is not None:
        return state
    reference = jax.tree.map(lambda x: x.copy(), state.params)  # own buffers: params are donated each step
    return dataclasses.replace(state, frozen=FrozenArrays(model=None, reference=reference))


def with_fresh_average(state: TrainState, keep_average: bool) -> TrainState:
    """``state`` whose weight average (``TrainerConfig.ema_decay``) starts from its parameters now:
    at a fresh start, and again after ``initialize`` has replaced them."""
    if not keep_average:
        return state
    return dataclasses.replace(state, ema=jax.tree.map(lambda x: x.copy(), state.params))  # own buffers, as the reference's


def whole_model(state: TrainState, static: Any) -> Any:
    """The model a state holds: its trainable arrays, its frozen model arrays and the static rest."""
    frozen_model = None if state.frozen is None else state.frozen.model
    if frozen_model is None:
        return eqx.combine(state.params, static)
    return eqx.combine(state.params, frozen_model, static)


def _log_parameter_counts(state: TrainState) -> None:
    trainable = sum(x.size for x in jax.tree.leaves(state.params))
    frozen_model = None if state.frozen is None else state.frozen.model
    total = trainable + sum(x.size for x in jax.tree.leaves(frozen_model))
    logger.info("trainable parameters: %s of %s (%.2f%%)", f"{trainable:,}", f"{total:,}", 100.0 * trainable / max(total, 1))


def _init_params(init_model, key, mesh: Mesh, trainable):
    """Initialise under jit, each parameter created directly in its sharding: one compiled
    program instead of hundreds of eager ops, and no device ever holds the whole model.

    Returns the trainable arrays, the frozen floating arrays (None unless ``trainable`` leaves
    some floating array out) and the static rest."""
    from haliax.partitioning import shardings_for

    if trainable is None:

        def floating_part(k):
            # Master weights are f32 whatever dtype the model was built in; compute casts per step.
            return cast_floating(eqx.partition(init_model(k), _is_floating)[0], jnp.float32)

        abstract_params, static = eqx.partition(eqx.filter_eval_shape(init_model, key), _is_floating)
        if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(static)):
            # Integer buffers in the model: materialise the non-trainable part for real.
            static = eqx.filter_jit(lambda k: eqx.partition(init_model(k), _is_floating)[1])(key)
        abstract_params = cast_floating(abstract_params, jnp.float32)
        param_shardings = shardings_for(abstract_params, mesh)
        params = jax.jit(floating_part, out_shardings=param_shardings)(key)
        return params, None, static

    def parts(model):
        trainable_part, rest = eqx.partition(model, trainable(model))
        frozen, static = eqx.partition(rest, _is_floating)
        return trainable_part, frozen, static

    def floating_parts(k):
        trainable_part, frozen, _ = parts(init_model(k))
        return cast_floating(trainable_part, jnp.float32), cast_floating(frozen, jnp.float32)

    abstract_params, abstract_frozen, static = parts(eqx.filter_eval_shape(init_model, key))
    if any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(static)):
        static = eqx.filter_jit(lambda k: parts(init_model(k))[2])(key)
    abstract = cast_floating((abstract_params, abstract_frozen), jnp.float32)
    params, frozen = jax.jit(floating_parts, out_shardings=shardings_for(abstract, mesh))(key)
    return params, frozen, static


def _is_floating(x) -> bool:
    return isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact)
