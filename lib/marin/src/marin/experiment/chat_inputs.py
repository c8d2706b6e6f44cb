"""What ``chat_dataset(...)`` and ``preference_dataset(...)`` resolve when they are declared.

Both render records with a chat template before tokenizing, so both need the source, the
tokenizer, and the template's identity: its name and content digest when the tokenizer can be
loaded now, or only what was asked for when a dependency step builds the tokenizer (that step's
identity then covers the rest).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from levanter.tokenization import load_tokenizer, resolve_chat_template

from marin.execution.lazy import LazyStep
from marin.experiment.data import (
    DatasetSource,
    resolve_dataset_source,
    resolve_tokenizer,
)
from marin.processing.chat import describe_template


@dataclass(frozen=True)
class ChatInputs:
    source: DatasetSource
    tokenizer_location: str | None  # a path, URL or hub id; None when a dependency step builds it
    tokenizer_revision: str | None
    tokenizer_identity: str | None
    tokenizer_dep: LazyStep | None
    template_identity: dict[str, Any]
    template_note: str  # for the declaration's log line

    @property
    def deps(self) -> tuple[LazyStep, ...]:
        return self.source.deps + ((self.tokenizer_dep,) if self.tokenizer_dep is not None else ())

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer_location or self.tokenizer_dep.name


def resolve_chat_inputs(source: Any, tokenizer: Any, template: str | None, sample_count: int | None,
                        validation: Any) -> ChatInputs:
    """Resolve the source, the tokenizer and the template; an unknown template name is refused now, not at run time."""
    resolved = resolve_dataset_source(source, sample_count, validation)
    location, revision, identity, tokenizer_dep = resolve_tokenizer(tokenizer)
    if tokenizer_dep is None:
        loaded = load_tokenizer(location, revision=revision)
        chat_template = resolve_chat_template(loaded, template)
        template_identity: dict[str, Any] = chat_template.identity()
        template_note = describe_template(loaded, chat_template)
    else:
        template_identity = {"requested": template_request(template)}
        template_note = f"chat template {template or 'of the tokenizer, else chatml'} (resolved when the tokenizer is built)"
    return ChatInputs(resolved, location, revision, identity, tokenizer_dep, template_identity, template_note)


def template_request(template: str | None) -> str | None:
    """A template request as hashed: a name as given, a Jinja text by its digest."""
    if template is None or ("{{" not in template and "{%" not in template):
        return template
    return "sha256:" + hashlib.sha256(template.encode("utf-8")).hexdigest()
