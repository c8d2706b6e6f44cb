"""``evaluate_lm(...)``: declare the evaluation of a model on tokenized datasets as a lazy step.

The step depends on its datasets' tokenize handles and, for a ``train_lm`` handle, on the training
step, so a retrained model (any change to the training step) gives a new eval step and a rerun of
the same graph finds it cached. A checkpoint folder enters the identity through a digest of its
files. The identity covers what the scores depend on: the model, the datasets, the split, the
sequence length and the compute dtype. ``batch_size`` and ``resources`` only change how fast it
runs (every token is scored once whatever the batch size), so they are not hashed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from fray.cluster import ResourceConfig
from marin.evaluation import EvalResults, run_evaluation
from marin.evaluation.eval_step import EvalConfigError
from marin.evaluation.model_source import ModelSourceError
from marin.execution.lazy import LazyStep, lazy_step
from marin.experiment.model_ref import ModelRef
from marin.processing.tokenize import TokenizedDataset

# Bumped when the eval step's results change meaning, so old results are never reused for it.
EVAL_STEP_VERSION = "1"

__all__ = ["EVAL_STEP_VERSION", "EvalConfigError", "EvalResults", "ModelSourceError", "evaluate_lm"]


def evaluate_lm(
    name: str,
    *,
    model: LazyStep | str | os.PathLike[str],
    datasets: Sequence[LazyStep] | Mapping[str, LazyStep],
    batch_size: int = 8,
    seq_len: int | None = None,
    split: str = "validation",
    compute_dtype: str = "auto",
    version: str | None = None,
    resources: ResourceConfig | None = None,
    output_path: str | None = None,
) -> LazyStep:
    """A lazy handle scoring ``model`` on the ``split`` of each dataset; its artifact is an :class:`EvalResults`.

    ``model``: a ``train_lm(...)`` handle (its Hugging Face export is evaluated) or a Hugging Face
    Llama or Mixtral checkpoint folder, local or a URL. ``datasets``: ``tokenized(...)`` handles (named by their step names),
    ``{name: handle}``, or a ``train_lm``-style ``{handle: weight}`` mixture (weights ignored). ``seq_len`` defaults to the training step's.
    """
    named = _named_datasets(datasets)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise EvalConfigError(f"batch_size must be a positive integer, got {batch_size!r}.")
    ref = ModelRef.of(model, error=EvalConfigError)
    if ref.handle is not None:
        seq_len = seq_len if seq_len is not None else ref.handle.hash_attrs.get("seq_len")
    deps = ref.deps + tuple(named.values())
    if not isinstance(seq_len, int) or seq_len < 2:
        raise EvalConfigError(f"seq_len must be an integer >= 2, got {seq_len!r}; pass seq_len=... to evaluate_lm.")

    def run(ctx) -> EvalResults:
        data = {label: ctx.load_artifact(handle, TokenizedDataset).result for label, handle in named.items()}
        resolved = ref.load(ctx, reader="eval step")
        return run_evaluation(
            resolved.loaded,
            data,
            model_label=resolved.label,
            model_identity=resolved.identity,
            split=split,
            seq_len=seq_len,
            batch_size=batch_size,
            compute_dtype=compute_dtype,
            model_tokenizer_identity=resolved.tokenizer_identity(),
            between_datasets=ctx.check_lease,
        )

    return lazy_step(
        name,
        run,
        deps=deps,
        hash_attrs={
            "model": ref.record,
            # Labels name the results; the engine hashes each dataset's identity through deps.
            "datasets": [[label, handle.name] for label, handle in named.items()],
            "split": split,
            "seq_len": seq_len,
            "compute_dtype": compute_dtype,
            "format": EVAL_STEP_VERSION,
        },
        version=version,
        resources=resources or ResourceConfig.with_cpu(),
        output_path=output_path,
    )


def _named_datasets(datasets: Any) -> dict[str, LazyStep]:
    if isinstance(datasets, LazyStep):
        datasets = [datasets]
    if isinstance(datasets, Mapping) and datasets and all(isinstance(key, LazyStep) for key in datasets):
        datasets = list(datasets)  # a train_lm-style {handle: weight} mixture: its datasets, by step name
    if isinstance(datasets, Mapping):
        named = dict(datasets)
    elif isinstance(datasets, Sequence) and not isinstance(datasets, str):
        named = {}
        for handle in datasets:
            if isinstance(handle, LazyStep) and handle.name in named:
                raise EvalConfigError(f"dataset {handle.name!r} is listed twice; pass {{name: handle}} to name them apart.")
            named[getattr(handle, "name", repr(handle))] = handle
    else:
        raise EvalConfigError(f"datasets must be a list of tokenized(...) handles or {{name: handle}}, got {type(datasets).__name__}.")
    if not named:
        raise EvalConfigError("evaluate_lm needs at least one dataset: datasets=[tokenized(...)].")
    for label, handle in named.items():
        if not isinstance(handle, LazyStep):
            raise EvalConfigError(
                f"dataset {label!r} is a {type(handle).__name__}, not a tokenized(...) handle; "
                "write datasets=[tokenized(name=..., source=..., tokenizer=...)]."
            )
    return named
