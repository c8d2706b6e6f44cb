"""Low-rank adapters (LoRA, Hu et al. 2021) on the projections of a decoder's layers.

A chosen ``Linear`` ``W`` becomes ``W x + (alpha / r) * B(A(dropout(x)))`` with ``A``: in -> r and
``B``: r -> out. ``B`` starts at zero, so a model fresh from :func:`apply_lora` computes exactly
what the base model did; only ``A`` and ``B`` are meant to train (:func:`lora_trainable_filter`),
and :func:`merge_lora` folds them back into ``W``, giving a plain model of the original class.

Projections are chosen by their field names, which are the Hugging Face module names too
(``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj``).
Layers stacked for ``lax.scan`` carry a leading layer axis on every array; adapters get it as
well, and layer ``i`` gets the same adapter weights whether its layers are stacked or not.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from haliax import NamedModule, Stacked
from haliax.nn import Linear
from levanter.errors import LevanterError

# The logical axis of the adapters' rank dimension. No partitioning rule names it, so it is
# replicated: it is small, and splitting it would only add communication.
LORA_RANK = "lora_rank"


class LoraError(LevanterError, ValueError):
    """A LoRA configuration, or a model, that adapters cannot be applied to, merged or exported as asked."""


@dataclass(frozen=True)
class LoraConfig:
    """Which projections get adapters, and their shape. Defaults are PEFT's for Llama."""

    r: int = 8  # the adapters' rank
    alpha: float = 8.0  # the update is scaled by alpha / r, so changing r keeps its size comparable
    dropout: float = 0.0  # on the adapters' input only, while training (see with_lora_dropout)
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")

    def __post_init__(self):
        if isinstance(self.target_modules, str) or not all(isinstance(t, str) for t in self.target_modules):
            raise LoraError(f"LoraConfig.target_modules must be a list of module names such as ['q_proj', 'v_proj'], "
                            f"got {self.target_modules!r}.")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        if not self.target_modules:
            raise LoraError("LoraConfig.target_modules is empty: name at least one projection, e.g. ('q_proj', 'v_proj').")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise LoraError(f"LoraConfig.r must be a positive integer, got {self.r!r}.")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha) and self.alpha > 0):
            raise LoraError(f"LoraConfig.alpha must be a finite number > 0, got {self.alpha!r}.")
        if not (isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1):
            raise LoraError(f"LoraConfig.dropout must be in [0, 1), got {self.dropout!r}.")

    @property
    def scale(self) -> float:
        return self.alpha / self.r


class LoraLinear(NamedModule):
    """``base(x) + (alpha / r) * (dropout(x) · A) · B``: a frozen ``Linear`` plus a trainable low-rank update.

    ``lora_a`` is ``in_shape + (r,)`` and ``lora_b`` is ``(r,) + out_shape``, the layout of
    ``Linear`` weights. ``dropout_key`` is None except inside a training step
    (:func:`with_lora_dropout`), so the module is deterministic as stored.
    """

    base: Linear
    lora_a: jax.Array
    lora_b: jax.Array
    alpha: float = eqx.field(static=True)
    dropout: float = eqx.field(static=True)
    dropout_key: jax.Array | None = None

    def __init__(self, base: Linear, config: LoraConfig, *, key: jax.Array):
        if base.weight.ndim != len(base.in_axes) + len(base.out_axes):
            raise LoraError(f"LoraLinear wraps one Linear at a time; this weight has extra leading dimensions "
                            f"{base.weight.shape} (apply_lora maps over stacked layers).")
        in_shape = base.weight.shape[: len(base.in_axes)]
        out_shape = base.weight.shape[len(base.in_axes):]
        # PEFT's default: Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        bound = 1.0 / math.sqrt(math.prod(in_shape))
        self.base = base
        self.lora_a = jax.random.uniform(key, in_shape + (config.r,), base.weight.dtype, -bound, bound)
        self.lora_b = jnp.zeros((config.r,) + out_shape, base.weight.dtype)
        self.alpha = float(config.alpha)
        self.dropout = float(config.dropout)
        self.dropout_key = None

    def param_axes(self):
        return {"lora_a": self.base.in_axes + (LORA_RANK,), "lora_b": (LORA_RANK,) + self.base.out_axes}

    @property
    def rank(self) -> int:
        return self.lora_a.shape[-1]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def __call__(self, x: jax.Array) -> jax.Array:
        h = x
        if self.dropout_key is not None and self.dropout > 0:
            keep = jax.random.bernoulli(self.dropout_key, 1.0 - self.dropout, x.shape)
            h = jnp.where(keep, x / (1.0 - self.dropout), 0).astype(x.dtype)
        n_in = len(self.base.in_axes)
        low = jnp.tensordot(h, self.lora_a.astype(x.dtype), axes=n_in)
        update = jnp.tensordot(low, self.lora_b.astype(x.dtype), axes=1)
        return self.base(x) + self.scale * update

    def merged(self) -> Linear:
        """The base ``Linear`` with ``W + scale * A·B`` as its weight (any leading stacked axes kept)."""
        w = self.base.weight
        lead = w.shape[: w.ndim - len(self.base.in_axes) - len(self.base.out_axes)]
        in_shape = w.shape[len(lead): len(lead) + len(self.base.in_axes)]
        a = self.lora_a.reshape(lead + (math.prod(in_shape), self.rank)).astype(jnp.float32)
        b = self.lora_b.reshape(lead + (self.rank, -1)).astype(jnp.float32)
        # HIGHEST: on accelerators a default-precision f32 matmul may round its inputs to bf16.
        delta = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST).reshape(w.shape)
        return eqx.tree_at(lambda lin: lin.weight, self.base, (w.astype(jnp.float32) + self.scale * delta).astype(w.dtype))


# -- whole models ------------------------------------------------------------------------------------


def _is_lora(x: Any) -> bool:
    return isinstance(x, LoraLinear)


def has_lora(model: Any) -> bool:
    return any(_is_lora(x) for x in jax.tree.leaves(model, is_leaf=_is_lora))


def _layers(model: Any) -> Any:
    layers = getattr(model, "layers", None)
    if not isinstance(layers, (tuple, list, Stacked)):
        raise LoraError(f"apply_lora needs a decoder whose .layers are a tuple of layers or one Stacked module; "
                        f"{type(model).__name__} has {type(layers).__name__}.")
    return layers


def _field_name(path: tuple) -> str | None:
    last = path[-1] if path else None
    return getattr(last, "name", None)  # a GetAttrKey: the module's field name


def projection_names(model: Any) -> list[str]:
    """The field names of the ``Linear`` projections in ``model``'s layers: what ``target_modules`` may name."""
    first = _layers(model)
    first = first.inner if isinstance(first, Stacked) else first[0]
    found = jax.tree_util.tree_flatten_with_path(first, is_leaf=lambda x: isinstance(x, Linear))[0]
    return sorted({_field_name(path) for path, leaf in found if isinstance(leaf, Linear)})


def _wrap_layer(layer: Any, config: LoraConfig, key: jax.Array) -> Any:
    """One layer with its target projections wrapped; the j-th target gets ``fold_in(key, j)``."""
    counter = itertools.count()

    def wrap(path, leaf):
        if isinstance(leaf, Linear) and _field_name(path) in config.target_modules:
            return LoraLinear(leaf, config, key=jax.random.fold_in(key, next(counter)))
        return leaf

    return jax.tree_util.tree_map_with_path(wrap, layer, is_leaf=lambda x: isinstance(x, Linear))


def apply_lora(model: Any, config: LoraConfig, *, key: jax.Array) -> Any:
    """``model`` with every ``config.target_modules`` projection of every layer wrapped in a :class:`LoraLinear`.

    The result computes the same function as ``model`` (``B`` is zero) and is the same class, so
    anything that runs the model runs it; train it with :func:`lora_trainable_filter`.
    """
    if has_lora(model):
        raise LoraError("This model already has LoRA adapters; merge_lora it first to stack a second set.")
    layers = _layers(model)
    available = projection_names(model)
    unknown = sorted(set(config.target_modules) - set(available))
    if unknown:
        raise LoraError(f"LoraConfig.target_modules names {unknown}, which {type(model).__name__}'s layers do not have; "
                        f"its projections are {available}.")
    if isinstance(layers, Stacked):
        keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(layers.count))
        inner = eqx.filter_vmap(lambda layer, k: _wrap_layer(layer, config, k))(layers.inner, keys)
        wrapped: Any = Stacked(inner, layers.count)
    else:
        wrapped = type(layers)(_wrap_layer(layer, config, jax.random.fold_in(key, i)) for i, layer in enumerate(layers))
    return eqx.tree_at(lambda m: m.layers, model, wrapped)


def merge_lora(model: Any) -> Any:
    """``model`` with each adapter folded into its base weight: a plain model of the original class."""
    if not has_lora(model):
        raise LoraError(f"This {type(model).__name__} has no LoRA adapters to merge.")
    return jax.tree.map(lambda x: x.merged() if _is_lora(x) else x, model, is_leaf=_is_lora)


def lora_trainable_filter(model: Any) -> Any:
    """A tree of bools shaped like ``model``: True exactly at the adapters' ``lora_a`` / ``lora_b``.

    For ``eqx.partition(model, lora_trainable_filter(model))``: the first part is what the
    optimizer sees (so its state exists only for adapters), the second stays frozen.
    """
    if not has_lora(model):
        raise LoraError(f"This {type(model).__name__} has no LoRA adapters, so nothing would train; apply_lora first.")

    def mark(node):
        if not _is_lora(node):
            return False
        frozen = jax.tree.map(lambda _: False, node)
        return eqx.tree_at(lambda m: (m.lora_a, m.lora_b), frozen, (True, True))

    return jax.tree.map(mark, model, is_leaf=_is_lora)


def count_trainable_parameters(model: Any, trainable: Any = None) -> int:
    """Parameters where ``trainable`` (an Equinox filter: a tree of bools or a predicate) holds;
    by default the LoRA adapters. ``eqx.is_inexact_array`` counts every parameter (full fine-tuning)."""
    params, _ = eqx.partition(model, lora_trainable_filter(model) if trainable is None else trainable)
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))


def with_lora_dropout(model: Any, key: jax.Array) -> Any:
    """``model`` whose adapters drop their inputs at random, each with its own key drawn from ``key``.

    Call it inside the loss with a fresh key each step, after ``eqx.combine``: the model as
    stored holds no keys, so evaluation, merging and export are deterministic. Adapters with
    ``dropout == 0`` are left as they are.
    """
    counter = itertools.count()

    def arm(node):
        if not _is_lora(node) or node.dropout == 0:
            return node
        w = node.base.weight
        lead = w.shape[: w.ndim - len(node.base.in_axes) - len(node.base.out_axes)]  # stacked layers
        keys = jax.random.split(jax.random.fold_in(key, next(counter)), math.prod(lead))
        keys = keys.reshape(lead + keys.shape[1:])
        return eqx.tree_at(lambda m: m.dropout_key, node, keys, is_leaf=lambda x: x is None)

    return jax.tree.map(arm, model, is_leaf=_is_lora)
