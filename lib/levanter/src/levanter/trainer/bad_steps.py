"""Skipping bad steps: a step whose loss or gradient norm is not finite, or whose loss spikes above
the recent ones, leaves the parameters and the optimizer state as they were.

Decided inside the compiled step, with no round trip to the host: the step computes its update as
always and keeps the old arrays where the step is bad (``jnp.where``, one select per array). The
step counter, the RNG key and the data move on, so the batch after a skipped one is the batch that
step would have had anyway. The history (the last ``window`` finite losses, in a ring) and the
count of skipped steps live in the train state and are checkpointed with it, so a resumed run
decides exactly as an uninterrupted one.

The history holds every finite loss, those of skipped spikes too: a lasting rise of the loss (a
new data mixture) raises the mean until it is accepted, rather than being skipped for ever. Spikes
are judged only once the window is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp


class BadStepHistory(eqx.Module):
    losses: jax.Array  # f32[window]: the last finite losses, a ring written at seen % window
    seen: jax.Array  # int32: finite losses recorded so far
    skipped: jax.Array  # int32: steps skipped so far

    @staticmethod
    def fresh(window: int) -> "BadStepHistory":
        return BadStepHistory(jnp.zeros((window,), jnp.float32), jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32))


@dataclass(frozen=True)
class BadStepRule:
    """Non-finite loss or gradient norm: always bad. ``spike_factor``: also bad when the loss
    exceeds this factor times the mean of a full window of recent finite losses (None: never)."""

    spike_factor: float | None = None

    def judge(self, history: BadStepHistory, loss: jax.Array, grad_norm: jax.Array) -> tuple[jax.Array, BadStepHistory]:
        """(whether the step is good, the history after it)."""
        loss = jnp.asarray(loss, jnp.float32)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        window = history.losses.shape[0]
        good = finite
        if self.spike_factor is not None:
            full = history.seen >= window
            spike = full & (loss > self.spike_factor * jnp.mean(history.losses))
            good = finite & ~spike
        slot = history.seen % window
        losses = jnp.where(finite, history.losses.at[slot].set(loss), history.losses)
        after = BadStepHistory(
            losses=losses,
            seen=history.seen + finite.astype(jnp.int32),
            skipped=history.skipped + (~good).astype(jnp.int32),
        )
        return good, after


def keep_if(good: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``good``, else ``old``, array by array (both trees of the same structure)."""
    return jax.tree.map(lambda n, o: jnp.where(good, n, o), new, old)
