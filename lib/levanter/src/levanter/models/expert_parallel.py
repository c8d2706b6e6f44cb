"""Where an MoE layer's experts run on the active mesh, and how tokens reach them.

With the logical ``experts`` axis on a mesh axis of size > 1 (``MeshConfig(experts=N)``), that is
expert parallelism: each device along the axis holds ``num_experts / N`` of the layer's experts, and
tokens travel to their experts' device and back by all-to-all. What a caller can rely on:

- Devices along the experts axis also split the batch (it is a data axis for everything but the
  experts), so each device routes its own tokens. It sends every expert a buffer of ``capacity`` rows
  (:func:`expert_capacity`) and receives, for each of its own experts, one such buffer from each
  device; rows past an expert's capacity, counted in token order, are dropped: they add nothing to
  the token's output (the residual carries the token on) and are counted in ``dropped_rows``.
- With ``capacity_factor=None`` the capacity is the device's token count, so nothing can be dropped,
  and the result equals the grouped computation on one device up to the order of float sums.
- When the batch cannot be split over the experts axis (an odd-sized evaluation batch), every
  device along it holds the same tokens: each computes its own experts' rows and a sum over the axis
  brings the outputs together, with the same capacity rule.

With the experts replicated and the batch split (plain data parallelism), each device runs every
expert on its own tokens only (:func:`grouped_experts`, no capacity, nothing dropped); traced as one
global computation instead, the sort by expert would gather every token onto every device.

Either way a ``model`` (tensor-parallel) axis keeps splitting each expert's ``mlp`` dimension: a
device multiplies by its slice and a psum over that axis completes the output.

Buffers are padded to a fixed size because XLA's all-to-all moves equal-sized blocks; JAX's
``ragged_all_to_all`` would send only the rows routed, but XLA:CPU does not implement it.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from haliax.axes import BATCH, EXPERTS, MLP, SEQ
from haliax.partitioning import AxisRules, PartitioningError, current_mesh, partition_spec
from levanter.models.transformer import ConfigError

logger = logging.getLogger(__name__)


def expert_capacity(tokens: int, num_experts_per_token: int, num_experts: int, capacity_factor: float | None) -> int:
    """Rows each expert takes from one device: ``ceil(factor * tokens * k / num_experts)``, at least 1
    and at most ``tokens`` (top-k experts are distinct, so an expert never gets more rows than tokens)."""
    if capacity_factor is None:
        return tokens
    return max(1, min(tokens, math.ceil(capacity_factor * tokens * num_experts_per_token / num_experts)))


def grouped_experts(tokens: jax.Array, top_weights: jax.Array, top_experts: jax.Array, experts: tuple[jax.Array, ...]) -> jax.Array:
    """``tokens`` [N, H] through their top-k experts, on one device and without a capacity: rows are
    grouped by expert, each expert multiplies only its own (``ragged_dot``), and each token gets the
    ``top_weights``-weighted sum of its experts' outputs."""
    gate_proj, up_proj, down_proj = experts
    k = top_experts.shape[-1]
    expert_of_row = top_experts.reshape(-1)
    group_sizes = jnp.bincount(expert_of_row, length=gate_proj.shape[0]).astype(jnp.int32)
    order = jnp.argsort(expert_of_row, stable=True)
    rows = tokens[order // k]
    gate = jax.lax.ragged_dot(rows, gate_proj, group_sizes)
    up = jax.lax.ragged_dot(rows, up_proj, group_sizes)
    out = jax.lax.ragged_dot(jax.nn.silu(gate) * up, down_proj, group_sizes)
    per_choice = out[jnp.argsort(order)].reshape(tokens.shape[0], k, tokens.shape[-1])
    return jnp.einsum("nkh,nk->nh", per_choice, top_weights)


@dataclass(frozen=True)
class ExpertPlacement:
    """The active mesh, its rules, and the mesh axis the experts are split over (None: replicated)."""

    mesh: Mesh
    rules: AxisRules
    axis: str | None

    @property
    def size(self) -> int:
        return 1 if self.axis is None else int(self.mesh.shape[self.axis])

    def _token_spec(self, token_shape: tuple[int, ...]) -> tuple:
        """How [batch, positions] is laid out: what the mesh splits, as for any activation."""
        return tuple(partition_spec((BATCH, SEQ), token_shape[:2], self.mesh, self.rules))

    def _token_axes(self, spec: tuple) -> tuple[str, ...]:
        return tuple(a for entry in spec for a in ((entry,) if isinstance(entry, str) else (entry or ())))

    def _weight_specs(self, experts: tuple[jax.Array, ...], token_axes: tuple[str, ...]) -> tuple[tuple, tuple[str, ...]]:
        """In-specs of the stacked (gate, up, down) weights inside ``shard_map``, and the mesh axes that
        split each expert's ``mlp`` dimension (tensor parallelism: each device computes a partial sum
        over its slice, then a psum completes it). The ``embed`` dimension is gathered (FSDP)."""
        entry = partition_spec((MLP,), (experts[0].shape[-1],), self.mesh, self.rules)[0]
        mlp_axes = tuple(a for a in self._token_axes((entry,)) if a != self.axis and a not in token_axes)
        mlp = None if not mlp_axes else mlp_axes[0] if len(mlp_axes) == 1 else mlp_axes
        return (PartitionSpec(self.axis, None, mlp), PartitionSpec(self.axis, None, mlp), PartitionSpec(self.axis, mlp, None)), mlp_axes

    def capacity(self, token_shape: tuple[int, ...], num_experts: int, num_experts_per_token: int,
                 capacity_factor: float | None) -> int:
        """The capacity (rows per expert per device) for tokens of ``token_shape`` ([batch, positions])."""
        axes = self._token_axes(self._token_spec(token_shape))
        per_device = math.prod(token_shape[:2]) // math.prod(self.mesh.shape[a] for a in axes)
        return expert_capacity(per_device, num_experts_per_token, num_experts, capacity_factor)

    def apply(self, x: jax.Array, top_weights: jax.Array, top_experts: jax.Array, experts: tuple[jax.Array, ...], *,
              capacity_factor: float | None) -> tuple[jax.Array, jax.Array]:
        """``x`` [B, T, H] through its top-k experts; returns the weighted sum [B, T, H] and the number of
        (token, choice) rows dropped over the whole batch. ``top_weights``/``top_experts``: [B, T, k];
        ``experts``: the stacked ``(gate [E, H, I], up [E, H, I], down [E, I, H])`` weights."""
        num_experts, k = experts[0].shape[0], top_experts.shape[-1]
        spec = self._token_spec(x.shape)
        token_axes = self._token_axes(spec)
        tokens = PartitionSpec(*spec, None)
        weight_specs, mlp_axes = self._weight_specs(experts, token_axes)
        if self.axis is None:
            return self._grouped_per_device(x, top_weights, top_experts, experts, tokens, weight_specs, mlp_axes)
        capacity = self.capacity(x.shape, num_experts, k, capacity_factor)
        split = self.axis in token_axes
        logger.debug(
            "Experts split %d ways over mesh axis %r; each expert takes %d rows per device (%s); tokens %s.",
            self.size, self.axis, capacity, "no limit" if capacity_factor is None else f"capacity factor {capacity_factor}",
            "travel by all-to-all" if split else "are replicated along it (each device runs its own experts)",
        )
        local = functools.partial(
            _local_experts, axis=self.axis, num_experts=num_experts, capacity=capacity, split=split, token_axes=token_axes,
            mlp_axes=mlp_axes,
        )
        return jax.shard_map(
            local, mesh=self.mesh, in_specs=(tokens, tokens, tokens, *weight_specs), out_specs=(tokens, PartitionSpec())
        )(x, top_weights, top_experts, *experts)

    def _grouped_per_device(self, x, top_weights, top_experts, experts, tokens, weight_specs, mlp_axes):
        """Replicated experts: each device groups and multiplies its own tokens' rows."""
        if tokens == PartitionSpec(None, None, None) and not mlp_axes:  # nothing split: no shard_map needed
            rows = grouped_experts(x.reshape(-1, x.shape[-1]), top_weights.reshape(-1, top_weights.shape[-1]), top_experts, experts)
            return rows.reshape(x.shape), jnp.zeros((), jnp.float32)

        def local(x, top_weights, top_experts, *experts):
            rows = grouped_experts(x.reshape(-1, x.shape[-1]), top_weights.reshape(-1, top_weights.shape[-1]), top_experts, experts)
            return (jax.lax.psum(rows, mlp_axes) if mlp_axes else rows).reshape(x.shape)

        local = jax.shard_map(local, mesh=self.mesh, in_specs=(tokens, tokens, tokens, *weight_specs), out_specs=tokens)
        return local(x, top_weights, top_experts, *experts), jnp.zeros((), jnp.float32)


def expert_placement(num_experts: int) -> ExpertPlacement | None:
    """Where the experts live while tracing under the active mesh (None outside ``use_mesh``)."""
    active = current_mesh()
    if active is None:
        return None
    mesh, rules = active
    target = rules.mesh_axes_for(EXPERTS)
    axes = [a for a in ((target,) if isinstance(target, str) else (target or ())) if mesh.shape.get(a, 1) > 1]
    if not axes:
        return ExpertPlacement(mesh, rules, None)
    if len(axes) > 1:
        raise PartitioningError(f"AxisRules map experts to several mesh axes {tuple(axes)}; expert parallelism takes one.")
    size = int(mesh.shape[axes[0]])
    if num_experts % size:
        raise ConfigError(
            f"MoeConfig.num_experts ({num_experts}) must be a multiple of the mesh's {axes[0]} axis ({size}) "
            "to split the experts over it."
        )
    return ExpertPlacement(mesh, rules, axes[0])


def _capacity_slots(expert_of_row: jax.Array, num_experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Each row's slot ``expert * capacity + rank`` in the [experts * capacity] buffer, where rank counts
    the earlier rows of the same expert; rows with rank >= capacity get the slot one past the end
    (dropped), and ``kept`` says which rows fit."""
    order = jnp.argsort(expert_of_row, stable=True)
    counts = jnp.bincount(expert_of_row, length=num_experts)
    first = jnp.cumsum(counts) - counts
    rank_in_order = jnp.arange(expert_of_row.shape[0]) - first[expert_of_row[order]]
    rank = jnp.zeros_like(rank_in_order).at[order].set(rank_in_order)
    kept = rank < capacity
    return jnp.where(kept, expert_of_row * capacity + rank, num_experts * capacity), kept


def _swiglu(rows: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
    """[experts, rows, H] through each expert's SwiGLU."""
    h = jax.nn.silu(jnp.einsum("erh,ehi->eri", rows, gate)) * jnp.einsum("erh,ehi->eri", rows, up)
    return jnp.einsum("eri,eih->erh", h, down)


def _local_experts(x, top_weights, top_experts, gate, up, down, *, axis, num_experts, capacity, split, token_axes, mlp_axes):
    """One device's part (inside ``shard_map``): its tokens [b, t, H], its experts [E / D, ...]."""
    b, t, hidden = x.shape
    k = top_experts.shape[-1]
    rows = x.reshape(-1, hidden)
    expert_of_row = top_experts.reshape(-1)  # row r is token r // k, choice r % k
    slot, kept = _capacity_slots(expert_of_row, num_experts, capacity)
    buffer = jnp.zeros((num_experts * capacity, hidden), x.dtype).at[slot].set(jnp.repeat(rows, k, axis=0), mode="drop")
    local = gate.shape[0]
    devices = num_experts // local
    buffer = buffer.reshape(devices, local, capacity, hidden)  # [owner device, its expert, slot, H]
    if split:
        received = jax.lax.all_to_all(buffer, axis, 0, 0)  # [source device, my expert, slot, H]
    else:
        received = jax.lax.dynamic_index_in_dim(buffer, jax.lax.axis_index(axis), 0, keepdims=True)
    sources = received.shape[0]
    out = _swiglu(received.transpose(1, 0, 2, 3).reshape(local, sources * capacity, hidden), gate, up, down)
    out = out.reshape(local, sources, capacity, hidden).transpose(1, 0, 2, 3)
    if split:
        back = jax.lax.all_to_all(out, axis, 0, 0)  # [owner device, its expert, slot, H], my rows only
    else:
        # Every device holds the same tokens, so the outputs must come out the same everywhere: a
        # psum of each device's block in place says so (an all-gather's result is typed as varying).
        mine = jnp.zeros((devices, *out.shape[1:]), out.dtype)
        mine = jax.lax.dynamic_update_index_in_dim(mine, out[0], jax.lax.axis_index(axis), 0)
        back = jax.lax.psum(mine, axis)
    per_row = jnp.take(back.reshape(num_experts * capacity, hidden), slot, axis=0, mode="fill", fill_value=0)
    y = jnp.einsum("nkh,nk->nh", per_row.reshape(-1, k, hidden), top_weights.reshape(-1, k))
    if mlp_axes:  # each device summed over its slice of the experts' mlp dimension
        y = jax.lax.psum(y, mlp_axes)
    dropped = jnp.sum(~kept).astype(jnp.float32)
    if token_axes:
        dropped = jax.lax.psum(dropped, token_axes)
    return y.reshape(b, t, hidden), dropped
