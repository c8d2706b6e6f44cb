"""``evaluate_harness(...)``: run lm-eval-harness tasks on a model, as a lazy step.

Like ``evaluate_lm``, the step depends on the training step of a ``train_lm`` handle (or on a content
digest of a checkpoint folder), so a new checkpoint gives a new step and a rerun of the same graph
finds it cached. Its identity covers what the metrics depend on: the model, the tasks, the content
of the task files under ``include_path``, ``limit``, ``num_fewshot``, ``max_seq_len``, the generation
budget, the compute dtype, the seed and lm-eval's version. ``batch_size`` only changes the speed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from fray.cluster import ResourceConfig
from marin.evaluation.harness import HarnessConfigError, HarnessResults, include_path_identity, lm_eval_version, run_harness
from marin.execution.lazy import LazyStep, lazy_step
from marin.experiment.model_ref import ModelRef
from rigging import filesystem as fsx

# Bumped when the harness step's results change meaning, so old results are never reused for it.
HARNESS_STEP_VERSION = "1"

__all__ = ["HARNESS_STEP_VERSION", "HarnessConfigError", "HarnessResults", "evaluate_harness"]


def evaluate_harness(
    name: str,
    *,
    model: LazyStep | str | os.PathLike[str],
    tasks: Sequence[str],
    include_path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    max_seq_len: int | None = None,
    batch_size: int = 8,
    max_gen_toks: int = 64,
    compute_dtype: str = "auto",
    seed: int = 0,
    version: str | None = None,
    resources: ResourceConfig | None = None,
    output_path: str | None = None,
) -> LazyStep:
    """A lazy handle running lm-eval ``tasks`` on ``model``; its artifact is a :class:`HarnessResults`.

    ``model``: a ``train_lm(...)`` handle (its Hugging Face export and tokenizer) or a Hugging Face
    Llama or Mixtral checkpoint folder (local or a URL) with its ``tokenizer.json``. ``include_path``: a folder of task YAML
    files to add to lm-eval's own (``marin.evaluation.tasks.TASKS_DIR`` holds the project's).
    ``limit``: at most this many documents per task (for smoke runs). ``max_seq_len`` defaults to
    the model's.
    """
    if isinstance(tasks, str) or not tasks or not all(isinstance(task, str) and task for task in tasks):
        raise HarnessConfigError(f"tasks must be a non-empty list of lm-eval task names, got {tasks!r}.")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise HarnessConfigError(f"limit must be a positive integer (documents per task) or None, got {limit!r}.")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise HarnessConfigError(f"batch_size must be a positive integer, got {batch_size!r}.")
    include = None if include_path is None else fsx.absolute(include_path)
    task_files = include_path_identity(include)
    ref = ModelRef.of(model, error=HarnessConfigError)

    def run(ctx) -> HarnessResults:
        resolved = ref.load(ctx, reader="harness step")
        return run_harness(
            resolved.loaded, resolved.tokenizer(), tasks=list(tasks), model_label=resolved.label,
            model_identity=resolved.identity, include_path=include,
            limit=limit, num_fewshot=num_fewshot, max_seq_len=max_seq_len, batch_size=batch_size,
            max_gen_toks=max_gen_toks, compute_dtype=compute_dtype, seed=seed,
        )

    return lazy_step(
        name,
        run,
        deps=ref.deps,
        hash_attrs={
            "model": ref.record,
            "tasks": list(tasks),
            "task_files": task_files,
            "limit": limit,
            "num_fewshot": num_fewshot,
            "max_seq_len": max_seq_len,
            "max_gen_toks": max_gen_toks,
            "compute_dtype": compute_dtype,
            "seed": seed,
            "lm_eval": lm_eval_version(),
            "format": HARNESS_STEP_VERSION,
        },
        version=version,
        resources=resources or ResourceConfig.with_cpu(),
        output_path=output_path,
    )
