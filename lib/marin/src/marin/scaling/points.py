"""One finished training run as a scaling law sees it: size, data, compute and loss."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScalingRun:
    """A training run reduced to what the fits use.

    ``params`` counts every trained parameter, embeddings included (the Chinchilla convention);
    ``tokens`` is the number of tokens trained on; ``flops`` the training compute by the project's
    own count per token (``flops_per_token`` of the model config, times ``tokens``); ``loss`` the
    final validation loss in nats per token. ``budget`` is the FLOP budget the run was planned
    for when a sweep declared one (runs of one IsoFLOP curve share it; their ``flops`` differ from
    it by rounding to whole steps); ``path`` is the run's output folder.
    """

    name: str
    params: float
    tokens: float
    flops: float
    loss: float
    budget: float | None = None
    path: str | None = None
