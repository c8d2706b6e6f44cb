"""Where a training run's first weights come from: another training step, a Hugging Face model, or a checkpoint.

``train_lm(..., initialize_from=...)`` takes a ``train_lm(...)`` handle, a Hugging Face folder (a
local path or any URL), a Hugging Face model id, or a folder of our own checkpoints;
:func:`resolve_initial_weights` turns it into an :class:`InitializeFrom` when the experiment is
declared. Its identity joins the training step's hash, so other starting weights make another
step and the same weights, wherever they lie, make the same one:

- a handle enters through the dependency (the engine hashes the upstream step's identity), so
  continuing a run waits for it, and reruns nothing upstream once it has finished;
- a Hugging Face folder, through digests of its config and weight files (as an eval step
  identifies a folder);
- a hub id, through the revision the hub (or, offline, the local Hugging Face cache) resolves it
  to, as datasets and tokenizers are;
- a checkpoint, through its step and its files: every file's name and size, and the content of
  the small ones (Orbax's metadata and manifests, which name the data files each save writes
  afresh), so a checkpoint of gigabytes is identified without reading its arrays.

Inside the step, :meth:`InitializeFrom.locate` finds the weights for the trainer
(:class:`levanter.main.train_lm.InitialWeights`), which checks them against the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from levanter.errors import LevanterError
from levanter.main.train_lm import InitialWeights, check_model_matches, hf_model_config
from levanter.optim import OptimizerConfig
from levanter.trainer.checkpoint_reading import committed_steps
from marin.datasets.hub import HubClient, HubRefusedError, hub_offline, resolve_revision
from marin.errors import MarinError
from marin.evaluation.model_source import checkpoint_folder_identity
from marin.execution.lazy import LazyStep
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

InitialKind = Literal["step", "hf", "hub", "checkpoint"]

# Checkpoint files up to this size are identified by their content, larger ones by name and size.
_DIGESTED_MAX_BYTES = 1 << 20
# Orbax's commit markers name the folder they were written in: placement, not content.
_PLACEMENT_FILES = ("commit_success.txt",)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_FILES = ["*.json", "*.safetensors"]


class InitializeFromError(MarinError, ValueError):
    """``initialize_from=`` names weights that cannot start the training run as declared."""


@dataclass(frozen=True)
class InitializeFrom:
    """The weights a training run starts from, as resolved when it is declared.

    ``identity`` (with ``resume_optimizer``) is the training step's ``initialize_from`` hash
    attribute; ``model`` is the weights' model config where it is known when declared (the
    upstream step's, or a Hugging Face ``config.json``'s), used to check the run's model, or as
    the run's model when none is given.
    """

    kind: InitialKind
    description: str  # what the run starts from, for the log and the run's record
    identity: dict[str, Any]
    resume_optimizer: bool = False
    step: LazyStep | None = None  # kind "step"
    location: str | None = None  # "hf": the folder; "checkpoint": the step folder; "hub": the cached snapshot
    repo_id: str | None = None  # kind "hub"
    revision: str | None = None  # kind "hub"
    model: Any = field(default=None, compare=False)

    @property
    def deps(self) -> tuple[LazyStep, ...]:
        return () if self.step is None else (self.step,)

    def hash_attr(self) -> dict[str, Any]:
        return {**self.identity, "resume_optimizer": self.resume_optimizer}

    def check_fits(self, model: Any, optimizer: OptimizerConfig) -> None:
        """Refuse, when declared, a model or optimizer that cannot start from these weights."""
        if self.model is not None:
            try:
                check_model_matches(model, self.model, self.source)
            except LevanterError as error:
                raise InitializeFromError(f"initialize_from: {error}") from error
        if self.resume_optimizer and self.step is not None:
            theirs = self.step.hash_attrs.get("optimizer", {}).get("type")
            ours = optimizer.to_dict().get("type")
            if theirs != ours:
                raise InitializeFromError(
                    f"resume_optimizer=True takes the optimizer state of {self.step.name!r}, which trained with "
                    f"{theirs!r}, but this run's optimizer is {ours!r}. Use the same optimizer, or resume_optimizer=False."
                )

    @property
    def source(self) -> str:
        """The weights, as a person would name them."""
        if self.step is not None:
            return f"training step {self.step.name!r}"
        if self.repo_id is not None:
            return f"{self.repo_id}@{self.revision}"
        return str(self.location)

    def locate(self, ctx: Any) -> InitialWeights:
        """Inside the training step: the weights as the trainer reads them."""
        if self.kind == "step":
            return self._trained(ctx)
        if self.kind == "hub":
            return InitialWeights(self._hub_snapshot(), "hf")
        fmt = "hf" if self.kind == "hf" else "checkpoint"
        return InitialWeights(str(self.location), fmt, load_optimizer_state=self.resume_optimizer)

    def _trained(self, ctx: Any) -> InitialWeights:
        # Read as plain data: the record's class lives in marin.experiment.train, which imports this module.
        result = ctx.load_artifact(self.step).result
        checkpoints = result.get("checkpoint_dir") if isinstance(result, dict) else None
        if checkpoints is None:
            raise InitializeFromError(f"Step {self.step.name!r} recorded no checkpoints; initialize_from needs a train_lm(...) handle.")
        final = result.get("final_step")
        if final in committed_steps(checkpoints):
            return InitialWeights(fsx.join(checkpoints, str(final)), "checkpoint", load_optimizer_state=self.resume_optimizer)
        if result.get("hf_path") and not self.resume_optimizer:
            return InitialWeights(result["hf_path"], "hf")
        raise InitializeFromError(
            f"Training step {self.step.name!r} has no checkpoint of its final step {final} in {checkpoints}"
            + ("" if self.resume_optimizer else " and no Hugging Face export")
            + ": it was deleted or moved. Rerun that step (delete its output folder) to make it again."
        )

    def _hub_snapshot(self) -> str:
        if self.location is not None and fsx.exists(fsx.join(self.location, "config.json")):
            return self.location
        from huggingface_hub import snapshot_download

        try:
            return snapshot_download(self.repo_id, revision=self.revision, allow_patterns=_HF_FILES)
        except Exception as error:  # network, auth and cache errors come from several layers
            raise InitializeFromError(
                f"The weights of {self.repo_id} at revision {self.revision} could not be downloaded "
                f"({type(error).__name__}: {error}). Pre-download them with `hf download {self.repo_id} --revision "
                f"{self.revision}` where the network is reachable."
            ) from error


def resolve_initial_weights(source: Any, *, resume_optimizer: bool = False, hub: HubClient | None = None) -> InitializeFrom:
    """``initialize_from=`` as an :class:`InitializeFrom` (see the module docstring); logs what it resolved to.

    ``resume_optimizer`` also takes the optimizer state, which only our own checkpoints hold.
    ``hub`` replaces the Hugging Face hub client (tests).
    """
    if not isinstance(resume_optimizer, bool):
        raise InitializeFromError(f"resume_optimizer must be True or False, got {resume_optimizer!r}.")
    if isinstance(source, InitializeFrom):
        resolved = source
    elif isinstance(source, LazyStep):
        resolved = _from_step(source)
    elif isinstance(source, (str, os.PathLike)):
        spec = os.fspath(source)
        resolved = _from_hub(spec, hub) if _looks_like_hub_id(spec) else _from_folder(spec)
    else:
        raise InitializeFromError(
            "initialize_from must be a train_lm(...) handle, a Hugging Face folder or model id, or a checkpoint folder; "
            f"got {type(source).__name__}."
        )
    if resume_optimizer and resolved.kind not in ("step", "checkpoint"):
        raise InitializeFromError(
            f"resume_optimizer=True needs one of our own checkpoints (a train_lm(...) handle or a checkpoint folder), "
            f"but {resolved.source} is a Hugging Face model, which holds no optimizer state. Leave resume_optimizer "
            "out to start it with a fresh optimizer."
        )
    resolved = dataclasses.replace(resolved, resume_optimizer=resume_optimizer)
    logger.info("Initial weights: %s.", resolved.description)
    return resolved


def _looks_like_hub_id(spec: str) -> bool:
    return bool(_HUB_ID.match(spec)) and not fsx.exists(spec)


# -- a training step -----------------------------------------------------------------------------------


def _from_step(handle: LazyStep) -> InitializeFrom:
    model = handle.hash_attrs.get("model")
    if model is None or "optimizer" not in handle.hash_attrs:
        raise InitializeFromError(
            f"initialize_from={handle.name!r} is not a train_lm(...) handle; pass a training step, a Hugging Face "
            "folder or model id, or a checkpoint folder."
        )
    return InitializeFrom(
        kind="step",
        description=f"the final checkpoint of training step {handle.name} ({handle.short_hash})",
        identity={"kind": "step", "step": handle.name},  # the step's identity is hashed as a dependency
        step=handle,
        model=model,
    )


# -- a folder: Hugging Face or our checkpoints ----------------------------------------------------------


def _from_folder(spec: str) -> InitializeFrom:
    folder = fsx.absolute(spec)
    if not fsx.exists(folder):
        raise InitializeFromError(
            f"initialize_from={spec!r} does not exist, and is not a Hugging Face model id (owner/name). Check the "
            "path, relative to the current directory."
        )
    if fsx.exists(fsx.join(folder, "config.json")):
        return _from_hf_folder(folder)
    step_folder = _checkpoint_step_folder(folder)
    if step_folder is None:
        raise InitializeFromError(
            f"initialize_from={spec!r} is neither a Hugging Face folder (config.json and safetensors) nor a checkpoint "
            "folder (a training run's output, its checkpoints/ folder, or one step of it)."
        )
    step = int(step_folder.rstrip("/").rsplit("/", 1)[-1])
    return InitializeFrom(
        kind="checkpoint",
        description=f"checkpoint step {step} in {step_folder}",
        identity={"kind": "checkpoint", "step": step, "files": _checkpoint_files(step_folder)},
        location=step_folder,
    )


def _from_hf_folder(folder: str) -> InitializeFrom:
    try:
        model, vocab_size = hf_model_config(folder)
    except LevanterError as error:
        raise InitializeFromError(f"initialize_from={folder!r}: {error}") from error
    return InitializeFrom(
        kind="hf",
        description=f"the Hugging Face folder {folder} ({type(model).__name__}, vocabulary {vocab_size:,})",
        identity=checkpoint_folder_identity(folder),
        location=folder,
        model=model,
    )


def _checkpoint_step_folder(folder: str) -> str | None:
    """One step of our checkpoints: ``folder`` itself, else the newest step of it or of its ``checkpoints/``."""
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    if name.isdigit() and fsx.exists(fsx.join(folder, "state")):
        return folder.rstrip("/")
    for directory in (folder, fsx.join(folder, "checkpoints")):
        steps = committed_steps(directory)
        if steps:
            return fsx.join(directory, str(steps[-1]))
    return None


def _checkpoint_files(step_folder: str) -> dict[str, dict[str, Any]]:
    fs, root = fsx.filesystem(step_folder)
    root = root.rstrip("/")
    files = {}
    for path, info in sorted(fs.find(root, detail=True).items()):
        name = path[len(root) + 1 :]
        if name.rsplit("/", 1)[-1] in _PLACEMENT_FILES:
            continue
        size = int(info.get("size") or 0)
        record: dict[str, Any] = {"size": size}
        if size <= _DIGESTED_MAX_BYTES:
            record["sha256"] = hashlib.sha256(fs.cat_file(path)).hexdigest()
        files[name] = record
    return files


# -- a Hugging Face model id ------------------------------------------------------------------------


def _from_hub(repo_id: str, hub: HubClient | None) -> InitializeFrom:
    try:
        revision, why_not_hub = resolve_revision(repo_id, "model", hub=hub)
    except HubRefusedError as error:
        raise InitializeFromError(
            f"initialize_from={repo_id!r}: {error}. It is not a local folder either; check the id, or log in for "
            "gated models (`hf auth login`)."
        ) from error
    if revision is None:
        reason = "HF_HUB_OFFLINE is set" if hub_offline() else f"the hub is unreachable ({why_not_hub})"
        raise InitializeFromError(
            f"initialize_from={repo_id!r} cannot be resolved: {reason} and the model is not in the local Hugging Face "
            f"cache (nor a local folder). Pre-download it with `hf download {repo_id}` while online, or pass a local folder."
        )
    where = "the Hugging Face hub" if revision.origin == "hub" else f"the local Hugging Face cache ({revision.local_path})"
    model = None
    config_folder = _hub_config_folder(repo_id, revision.revision, revision.local_path)
    if config_folder is not None:
        try:
            model, _ = hf_model_config(config_folder)
        except LevanterError as error:
            raise InitializeFromError(f"initialize_from={repo_id!r}: {error}") from error
    return InitializeFrom(
        kind="hub",
        description=f"Hugging Face model {repo_id} at revision {revision.revision} from {where}",
        identity={"kind": "hub", "repo_id": repo_id, "revision": revision.revision},
        location=revision.local_path,
        repo_id=repo_id,
        revision=revision.revision,
        model=model,
    )


def _hub_config_folder(repo_id: str, revision: str, local_path: str | None) -> str | None:
    """A folder holding the model's ``config.json`` (small: fetched when declared, to check or supply the model config)."""
    if local_path is not None:
        return local_path if fsx.exists(fsx.join(local_path, "config.json")) else None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, revision=revision, allow_patterns=["config.json"])
    except Exception as error:  # noqa: BLE001 - the config is checked again when the step runs
        logger.info("Could not read the config.json of %s at %s when declaring (%s).", repo_id, revision, error)
        return None
