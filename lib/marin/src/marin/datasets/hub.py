"""Asking the Hugging Face hub, or the local Hugging Face cache, which revision a repository is at.

Resolution happens when an experiment is declared (the revision is part of a step's identity), so
it must be quick and must never download data: one metadata request with a short timeout, skipped
entirely when ``HF_HUB_OFFLINE`` is set. Answers are remembered for the life of the process, so a
script that names the same dataset twice asks once.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Literal, Protocol

from marin.errors import MarinError

logger = logging.getLogger(__name__)

RepoType = Literal["dataset", "model"]

DEFAULT_TIMEOUT_S = 5.0

_TRUE = {"1", "true", "yes", "on"}


def hub_offline() -> bool:
    """Whether the user switched the hub off (``HF_HUB_OFFLINE``), read at call time."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE:
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except Exception:  # noqa: BLE001 - a broken hub install simply means "offline"
        return True


class HubUnreachableError(MarinError, ConnectionError):
    """The hub could not be asked: offline mode, no network, a timeout or a server error."""


class HubRefusedError(MarinError, LookupError):
    """The hub answered, and the answer was no: the repository or revision does not exist, or is gated."""


@dataclass(frozen=True)
class HubRevision:
    """Where a repository's content comes from: its commit sha, online or from the local cache."""

    repo_id: str
    repo_type: RepoType
    revision: str  # the commit sha: the content's identity
    origin: Literal["hub", "cache"]
    local_path: str | None = None  # the cached snapshot folder, when origin == "cache"


class HubClient(Protocol):
    """What source resolution needs from the hub; tests substitute a fake."""

    def latest_revision(self, repo_id: str, repo_type: RepoType) -> str:
        """The current commit sha; raises HubUnreachableError or HubRefusedError."""
        ...

    def cached_revision(self, repo_id: str, repo_type: RepoType) -> HubRevision | None:
        """The newest snapshot in the local cache, or None."""
        ...


class HuggingFaceHub:
    """The real hub through ``huggingface_hub``, with a short timeout and per-process memory."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._answers: dict[tuple[str, str], str | Exception] = {}
        self._lock = threading.Lock()

    def latest_revision(self, repo_id: str, repo_type: RepoType) -> str:
        if hub_offline():
            raise HubUnreachableError("HF_HUB_OFFLINE is set")
        key = (repo_type, repo_id)
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                answer = self._ask(repo_id, repo_type)
                self._answers[key] = answer
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _ask(self, repo_id: str, repo_type: RepoType) -> str | Exception:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError

        api = HfApi()
        info_fn = api.dataset_info if repo_type == "dataset" else api.model_info
        try:
            sha = info_fn(repo_id, timeout=self.timeout_s).sha
        except HFValidationError as error:
            return HubRefusedError(f"{repo_id!r} is not a valid Hugging Face repository id: {error}")
        except HfHubHTTPError as error:
            status = getattr(getattr(error, "response", None), "status_code", None)
            if status is not None and 400 <= status < 500:
                return HubRefusedError(f"the hub refused {repo_type} {repo_id!r} (HTTP {status}): {error}")
            return HubUnreachableError(f"the hub failed for {repo_type} {repo_id!r}: {error}")
        except Exception as error:  # noqa: BLE001 - connection errors come from several HTTP stacks
            return HubUnreachableError(f"{type(error).__name__}: {error}")
        if not sha:
            return HubUnreachableError(f"the hub returned no revision for {repo_type} {repo_id!r}")
        return sha

    def cached_revision(self, repo_id: str, repo_type: RepoType) -> HubRevision | None:
        try:
            from huggingface_hub import snapshot_download

            # local_files_only never touches the network; it answers from refs/main in the cache.
            folder = snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
        except Exception:  # noqa: BLE001 - any failure means "not cached"
            return None
        revision = os.path.basename(os.path.normpath(folder))
        return HubRevision(repo_id, repo_type, revision, "cache", folder)


_default_client: HubClient | None = None


def default_hub() -> HubClient:
    global _default_client
    if _default_client is None:
        _default_client = HuggingFaceHub()
    return _default_client


def resolve_revision(repo_id: str, repo_type: RepoType, *, hub: HubClient | None = None) -> tuple[HubRevision | None, str]:
    """The repository's revision from the hub, else from the local cache; else None.

    Returns the revision (or None) and, when the hub could not be asked, why (for the log).
    HubRefusedError propagates: a hub that says "no such repository" is not a reason to guess.
    """
    hub = hub or default_hub()
    try:
        return HubRevision(repo_id, repo_type, hub.latest_revision(repo_id, repo_type), "hub"), ""
    except HubUnreachableError as error:
        why = str(error)
    cached = hub.cached_revision(repo_id, repo_type)
    if cached is not None:
        logger.info("Hub unreachable (%s); using the locally cached %s %s at revision %s", why, repo_type, repo_id,
                    cached.revision)
    return cached, why
