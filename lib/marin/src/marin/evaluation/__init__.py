"""Evaluation steps: score trained models on tokenized datasets (loss, perplexity, bits per byte).

Declare one with ``marin.experiment.eval.evaluate_lm``; its artifact is an :class:`EvalResults`.
"""

from marin.evaluation.eval_step import EvalConfigError, run_evaluation
from marin.evaluation.model_source import ModelSourceError, checkpoint_folder_identity, load_hf_checkpoint
from marin.evaluation.results import DatasetScore, EvalResults

__all__ = [
    "DatasetScore",
    "EvalConfigError",
    "EvalResults",
    "ModelSourceError",
    "checkpoint_folder_identity",
    "load_hf_checkpoint",
    "run_evaluation",
]
