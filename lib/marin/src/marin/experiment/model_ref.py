"""The model an evaluation step scores: a ``train_lm(...)`` handle or a checkpoint folder.

Both eval helpers (``evaluate_lm``, ``evaluate_harness``) accept either. A handle enters the eval
step's identity as a dependency (so a retrained model gives a new eval step); a folder enters it
through a digest of its files (so the same weights anywhere give the same hash).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from levanter.tokenization import HfTokenizer, load_tokenizer
from marin.evaluation.model_source import LoadedModel, ModelSourceError, checkpoint_folder_identity, load_hf_checkpoint
from marin.execution.lazy import LazyStep
from marin.experiment.train import TrainedModel
from rigging import filesystem as fsx


@dataclass(frozen=True)
class ResolvedModel:
    """A model loaded inside an eval step, with what the results should say about it."""

    loaded: LoadedModel
    label: str
    identity: str
    folder: str  # the Hugging Face folder the weights came from
    trained: TrainedModel | None = None

    def _has_tokenizer(self) -> bool:
        return fsx.exists(fsx.join(self.folder, "tokenizer.json"))

    def tokenizer(self) -> HfTokenizer:
        """The tokenizer saved beside the weights, else the one the training step used."""
        if self._has_tokenizer():
            return load_tokenizer(self.folder)
        if self.trained is not None:
            return load_tokenizer(self.trained.tokenizer)
        raise ModelSourceError(f"{self.folder} has no tokenizer.json; save the model's tokenizer beside its weights.")

    def tokenizer_identity(self) -> str | None:
        if self.trained is not None:
            return self.trained.tokenizer_identity
        return load_tokenizer(self.folder).identity if self._has_tokenizer() else None


@dataclass(frozen=True)
class ModelRef:
    handle: LazyStep | None = None
    folder: str | None = None
    # What goes into the eval step's hash attributes for the model.
    record: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: Any, *, error: type[Exception] = ModelSourceError) -> "ModelRef":
        if isinstance(model, LazyStep):
            return cls(handle=model, record={"kind": "step"})  # the step's identity enters through deps
        if isinstance(model, (str, os.PathLike)):
            folder = fsx.absolute(model)
            return cls(folder=folder, record=checkpoint_folder_identity(folder))
        raise error(f"model must be a train_lm(...) handle or a checkpoint folder, got {type(model).__name__}.")

    @property
    def deps(self) -> tuple[LazyStep, ...]:
        return () if self.handle is None else (self.handle,)

    def load(self, ctx: Any, *, reader: str) -> ResolvedModel:
        """Load the weights inside a step; ``reader`` names the step kind for error messages."""
        if self.handle is None:
            digest = hashlib.sha256(json.dumps(self.record, sort_keys=True).encode()).hexdigest()
            return ResolvedModel(load_hf_checkpoint(self.folder), self.folder, f"sha256:{digest}", self.folder)
        trained = ctx.load_artifact(self.handle, TrainedModel).result
        if trained.hf_path is None:
            raise ModelSourceError(
                f"training step {self.handle.name!r} has no Hugging Face export ({trained.model_type} models have "
                f"none), which is what the {reader} reads; evaluate a Llama or MoE model."
            )
        return ResolvedModel(load_hf_checkpoint(trained.hf_path), self.handle.name, self.handle.identity, trained.hf_path, trained)
