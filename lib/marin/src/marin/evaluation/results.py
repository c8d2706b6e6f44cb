"""What an eval step records (its ``.artifact.json``): per dataset loss, perplexity and bits per byte."""

from __future__ import annotations

from dataclasses import dataclass, field

from marin.execution.artifact import register_result_type


@dataclass(frozen=True)
class DatasetScore:
    """One dataset split, every token of it scored once. ``loss`` is mean nats per token."""

    loss: float
    perplexity: float
    bits_per_byte: float
    tokens: int
    bytes: int
    documents: int
    split: str
    cache_path: str


@register_result_type
@dataclass(frozen=True)
class EvalResults:
    """The result of an ``evaluate_lm`` step.

    ``model`` says which model was evaluated (the training step's name, or the checkpoint folder),
    ``model_identity`` pins it (the training step's identity, or a content digest of the folder) and
    ``model_path`` is where its weights were read.
    """

    model: str
    model_identity: str
    model_path: str
    model_type: str
    vocab_size: int
    seq_len: int
    batch_size: int
    compute_dtype: str
    eval_seconds: float
    datasets: dict[str, DatasetScore] = field(default_factory=dict)

    def summary(self) -> str:
        """A table of the scores (printed by the runner when the eval step is a final step)."""
        lines = [f"Evaluated {self.model} ({self.model_type}, weights at {self.model_path}) "
                 f"with seq_len {self.seq_len} in {self.eval_seconds:.0f} s."]
        width = max([len("dataset")] + [len(name) for name in self.datasets])
        lines.append(f"  {'dataset':<{width}}  {'loss':>7}  {'perplexity':>10}  {'bits/byte':>9}  {'tokens':>11}  {'bytes':>13}")
        for name, score in self.datasets.items():
            lines.append(f"  {name:<{width}}  {score.loss:>7.4f}  {score.perplexity:>10.2f}  {score.bits_per_byte:>9.4f}  "
                         f"{score.tokens:>11,}  {score.bytes:>13,}")
        return "\n".join(lines)
