"""A key/value cache paged in fixed-size blocks, shared by every sequence being generated.

The cache is one pool of ``num_blocks`` blocks of ``block_size`` positions per layer. A sequence
owns a list of blocks, its block table, so sequences of different lengths share one bounded piece
of memory instead of each holding the model's whole context. The number of blocks is the memory
bound: :class:`BlockAllocator` hands blocks out from a free list and a sequence that cannot get
its blocks waits for others to give theirs back.

Block 0 (:data:`TRASH_BLOCK`) is never handed out. Positions a compiled step computes but must not
keep (padding rows, padding after a short prompt, table entries past a sequence's blocks) are
written there, so one compiled program serves every mix of lengths without a branch.

:func:`paged_decode` runs the model's own dense decoding (:func:`levanter.inference.sampling.decode`)
once per row, over that row's blocks gathered into a contiguous view; every decoder the dense
path supports is supported here, with the same arithmetic. The gather reads each row's blocks,
not the pool, so a step costs the length of the longest row's view, not the pool's size.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from levanter.inference.sampling import KvCache, decode

TRASH_BLOCK = 0


class PagedKvCache(NamedTuple):
    keys: jax.Array  # [layers, num_blocks, block_size, kv_heads, head_dim]
    values: jax.Array

    @property
    def num_blocks(self) -> int:
        return self.keys.shape[1]

    @property
    def block_size(self) -> int:
        return self.keys.shape[2]


def init_paged_cache(model: Any, num_blocks: int, block_size: int, dtype: Any = None) -> PagedKvCache:
    """An empty pool of ``num_blocks`` blocks (block 0 included) in the model's compute dtype by default.

    A model on a mesh gets its pool on that mesh, whole on each device. Left uncommitted, the pool
    would come back from the first compiled call placed on the mesh, and the next call with the same
    shapes (another placement) would compile its program again.
    """
    config = model.config
    weight = model.embed.weight
    dtype = dtype or weight.dtype
    shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
    cache = PagedKvCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))
    sharding = getattr(weight, "sharding", None)
    if isinstance(sharding, NamedSharding):
        cache = jax.device_put(cache, NamedSharding(sharding.mesh, PartitionSpec()))
    return cache


class BlockAllocator:
    """The free list of a pool's blocks. Not thread-safe: one scheduler owns it."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"a paged cache needs at least 2 blocks (block {TRASH_BLOCK} is reserved), got {num_blocks}")
        self.capacity = num_blocks - 1
        # Popped from the end: the lowest ids go first, which keeps a small test's tables readable.
        self._free = list(range(num_blocks - 1, TRASH_BLOCK, -1))

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` blocks, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        taken = self._free[len(self._free) - count:][::-1]
        del self._free[len(self._free) - count:]
        return taken

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))


def blocks_for(positions: int, block_size: int) -> int:
    return -(-positions // block_size)


def paged_decode(
    model: Any, tokens: jax.Array, starts: jax.Array, lengths: jax.Array, block_tables: jax.Array, cache: PagedKvCache
) -> tuple[jax.Array, PagedKvCache]:
    """Logits [B, T, vocab] for ``tokens`` [B, T], row ``b`` at positions ``starts[b] ..``, and the
    cache with the keys and values of each row's first ``lengths[b]`` tokens written to its blocks.

    ``block_tables`` [B, N] lists each row's blocks in order (unused entries :data:`TRASH_BLOCK`);
    ``N * block_size`` must cover ``starts[b] + T`` for every row. Logits past ``lengths[b]`` are
    those of padding and mean nothing.
    """
    layers, _, block_size = cache.keys.shape[:3]
    batch, width = tokens.shape
    view_len = block_tables.shape[1] * block_size

    def view(pool: jax.Array) -> jax.Array:  # [layers, B, view_len, kv_heads, head_dim]
        return pool[:, block_tables].reshape(layers, batch, view_len, *pool.shape[3:])

    def one_row(row_tokens, start, keys, values):
        logits, row_cache = decode(model, row_tokens[None], KvCache(keys[:, None], values[:, None]), start)
        return logits[0], row_cache.keys[:, 0], row_cache.values[:, 0]

    logits, keys, values = jax.vmap(one_row, in_axes=(0, 0, 1, 1), out_axes=(0, 1, 1))(
        tokens, starts, view(cache.keys), view(cache.values)
    )
    kept = jnp.arange(width)[None, :] < lengths[:, None]
    positions = jnp.where(kept, starts[:, None] + jnp.arange(width)[None, :], 0)  # [B, T]
    blocks = jnp.where(kept, jnp.take_along_axis(block_tables, positions // block_size, axis=1), TRASH_BLOCK)
    offsets = positions % block_size

    def write(pool: jax.Array, rows: jax.Array) -> jax.Array:
        new = jnp.take_along_axis(rows, positions[None, :, :, None, None], axis=2)  # [layers, B, T, kv, hd]
        return pool.at[:, blocks, offsets].set(new)

    return logits, PagedKvCache(write(cache.keys, keys), write(cache.values, values))


__all__ = ["TRASH_BLOCK", "BlockAllocator", "PagedKvCache", "blocks_for", "init_paged_cache", "paged_decode"]
