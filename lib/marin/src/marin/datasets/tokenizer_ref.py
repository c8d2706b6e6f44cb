"""A reference to a tokenizer that may have to be built offline: the hub one when it can be had,
else a built-in stand-in produced by a cached step.

``tokenized(..., tokenizer=ref)`` turns a :class:`TokenizerRef` into something concrete with
:func:`resolve_tokenizer_ref` (or :meth:`TokenizerRef.resolve`): either a tokenizer it can load
now (a hub id, or the cached snapshot folder) or a lazy step to depend on, whose artifact result
has a ``path`` field naming a folder with ``tokenizer.json``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from marin.datasets.hub import HubClient, HubRefusedError, hub_offline, resolve_revision
from marin.errors import MarinError
from marin.execution.lazy import LazyStep

logger = logging.getLogger(__name__)


class TokenizerUnavailableError(MarinError, LookupError):
    """A hub tokenizer that can be neither fetched nor found in the cache, and has no offline default."""


@dataclass(frozen=True)
class ResolvedTokenizer:
    """What a tokenizer reference resolved to.

    ``spec``: what to load — a hub id (``kind == "hub"``, at ``revision``), a local folder
    (``kind == "cache"``), or a LazyStep (``kind == "builtin"``) whose artifact names the folder.
    ``identity``: JSON-like description of what was resolved; the tokenize step should still hash
    the tokenizer's content digest once it is loaded.
    """

    kind: Literal["hub", "cache", "builtin"]
    spec: str | LazyStep
    identity: dict[str, Any]
    description: str
    revision: str | None = None

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"

    @property
    def deps(self) -> tuple[LazyStep, ...]:
        return (self.spec,) if isinstance(self.spec, LazyStep) else ()


@dataclass(frozen=True)
class TokenizerRef:
    """A hub tokenizer id with an optional offline default (a factory for the step that builds it)."""

    hub_id: str
    offline_default: Callable[[], LazyStep] | None = None
    description: str = ""

    def resolve(self, *, hub: HubClient | None = None) -> ResolvedTokenizer:
        return resolve_tokenizer_ref(self, hub=hub)

    def __str__(self) -> str:
        return self.hub_id


_resolved: dict[TokenizerRef, ResolvedTokenizer] = {}
_lock = threading.Lock()


def resolve_tokenizer_ref(ref: TokenizerRef, *, hub: HubClient | None = None) -> ResolvedTokenizer:
    """Resolve once per process (with the default hub client); logs plainly which tokenizer is used."""
    if hub is not None:
        return _resolve(ref, hub)
    with _lock:
        if ref not in _resolved:
            _resolved[ref] = _resolve(ref, None)
        return _resolved[ref]


def _resolve(ref: TokenizerRef, hub: HubClient | None) -> ResolvedTokenizer:
    try:
        revision, why_not_hub = resolve_revision(ref.hub_id, "model", hub=hub)
    except HubRefusedError as error:
        raise TokenizerUnavailableError(
            f"Tokenizer {ref.hub_id!r}: {error}. Check the id, log in for gated repositories (`hf auth login`), "
            "or pass a local tokenizer.json or folder."
        ) from error
    if revision is not None and revision.origin == "hub":
        resolved = ResolvedTokenizer(
            "hub", ref.hub_id, {"kind": "hub", "repo_id": ref.hub_id, "revision": revision.revision},
            f"Tokenizer {ref.hub_id}: from the Hugging Face hub at revision {revision.revision}.", revision.revision,
        )
    elif revision is not None:
        resolved = ResolvedTokenizer(
            "cache", revision.local_path, {"kind": "hub", "repo_id": ref.hub_id, "revision": revision.revision},
            f"Tokenizer {ref.hub_id}: from the local Hugging Face cache at revision {revision.revision} "
            f"({revision.local_path}).", revision.revision,
        )
    else:
        reason = "HF_HUB_OFFLINE is set" if hub_offline() else f"the hub is unreachable ({why_not_hub})"
        if ref.offline_default is None:
            raise TokenizerUnavailableError(
                f"Tokenizer {ref.hub_id!r} cannot be resolved: {reason} and it is not in the local Hugging Face cache. "
                f"Connect and rerun, pre-download it with `hf download {ref.hub_id}` while online, or pass a local "
                "tokenizer.json or folder."
            )
        step = ref.offline_default()
        resolved = ResolvedTokenizer(
            "builtin", step, {"kind": "builtin", "stands_in_for": ref.hub_id, "step": step.name, "step_identity": step.identity},
            f"Tokenizer {ref.hub_id}: {reason} and it is not in the local Hugging Face cache, so the BUILT-IN "
            f"OFFLINE TOKENIZER is used instead: {ref.description or step.name} (step {step.name}, "
            f"{step.short_hash}). Token ids are not comparable with the hub tokenizer's.",
        )
    (logger.warning if resolved.is_builtin else logger.info)("%s", resolved.description)
    return resolved


def as_tokenizer_spec(tokenizer: Any) -> Any:
    """A TokenizerRef becomes its resolved ``spec`` (str path/hub id, or LazyStep); anything else is returned as is."""
    if isinstance(tokenizer, TokenizerRef):
        return tokenizer.resolve().spec
    return tokenizer
