"""The unit of training data that flows from the loader into the trainer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Batch:
    """A batch of fixed-length token windows for next-token prediction.

    ``loss_mask[b, t]`` weights the prediction of ``tokens[b, t + 1]`` from position ``t``; the last
    column is always 0 because its target lies outside the window. Losses are means over the
    masked-in positions, so padding and masked tokens never dilute them.

    ``segment_ids[b, t]`` numbers the documents inside a window (0, 1, 2, ... from the left); models
    that mask attention per document use it, others ignore it. ``None`` means one segment per row.

    ``extras``: more float32 ``[batch, seq_len]`` arrays, aligned like ``loss_mask`` (position ``t``
    describes the prediction of ``tokens[b, t + 1]``), for objectives that need more than the tokens:
    a policy-gradient loss reads the sampler's log-probabilities and each row's advantage there. They
    reach the device with the batch and are split into microbatches with it. ``metrics``: scalars
    about the batch measured where it was made (a rollout's reward, its sampler's speed), written to
    the step's metrics line beside the step's own.
    """

    tokens: np.ndarray  # int32 [batch, seq_len]
    loss_mask: np.ndarray  # float32 [batch, seq_len]
    segment_ids: np.ndarray | None = None  # int32 [batch, seq_len]
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.tokens.ndim != 2:
            raise ValueError(f"Batch.tokens must be [batch, seq_len], got shape {self.tokens.shape}.")
        if self.loss_mask.shape != self.tokens.shape:
            raise ValueError(f"Batch.loss_mask shape {self.loss_mask.shape} != tokens shape {self.tokens.shape}.")
        if self.segment_ids is not None and self.segment_ids.shape != self.tokens.shape:
            raise ValueError(f"Batch.segment_ids shape {self.segment_ids.shape} != tokens shape {self.tokens.shape}.")
        for name, values in self.extras.items():
            if np.shape(values) != self.tokens.shape:
                raise ValueError(f"Batch.extras[{name!r}] shape {np.shape(values)} != tokens shape {self.tokens.shape}.")

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    @classmethod
    def from_tokens(cls, tokens: np.ndarray, segment_ids: np.ndarray | None = None) -> "Batch":
        """A batch where every position but the last in each row is trained on."""
        tokens = np.asarray(tokens, dtype=np.int32)
        loss_mask = np.ones(tokens.shape, dtype=np.float32)
        loss_mask[:, -1] = 0.0
        return cls(tokens=tokens, loss_mask=loss_mask, segment_ids=segment_ids)
