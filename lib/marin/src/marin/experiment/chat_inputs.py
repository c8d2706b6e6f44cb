"""What ``chat_dataset(...)`` and ``preference_dataset(...)`` resolve when they are declared, and the step they declare.

Both render records with a chat template before tokenizing, so both need the source, the
tokenizer, and the template's identity: its name and content digest when the tokenizer can be
loaded now, or only what was asked for when a dependency step builds the tokenizer (that step's
identity then covers the rest). Both then declare the same kind of step, with the same options
(:class:`RenderedDatasetOptions`, :func:`rendered_dataset_step`); only the fields of their records,
their tokenize config and their tokenize function differ.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
import os
from dataclasses import dataclass
from typing import Any, TypedDict

from levanter.tokenization import load_tokenizer, resolve_chat_template

from marin.execution.lazy import LazyStep, lazy_step
from marin.experiment.data import (
    DatasetSource,
    inputs_at_run_time,
    resolve_dataset_source,
    resolve_tokenizer,
)
from marin.processing.chat import describe_template
from marin.processing.tokenize import TokenizedDataset

logger = logging.getLogger(__name__)


class RenderedDatasetOptions(TypedDict, total=False):
    """The options ``chat_dataset(...)`` and ``preference_dataset(...)`` share, passed on to :func:`rendered_dataset_step`.

    ``sample_count``: only the first N records of each split; ``validation``: a source of its
    own for the validation split; ``version``: a label that changes the step's identity by hand;
    ``num_shards``: how many token-cache shards to write; ``output_path``, ``resources`` and
    ``backend`` (where shards run; not part of the identity) as for ``tokenized(...)``.
    """

    sample_count: int | None
    validation: str | os.PathLike[str] | None
    version: str | None
    num_shards: int | None
    output_path: str | None
    resources: Any
    backend: Any


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


def rendered_dataset_step(
    declared_as: str,
    name: str,
    source: Any,
    tokenizer: Any,
    template: str | None,
    *,
    config_type: type,
    fields: dict[str, Any],
    tokenize: Callable[..., TokenizedDataset],
    attribute: str,
    format_version: str,
    sample_count: int | None = None,
    validation: Any = None,
    version: str | None = None,
    num_shards: int | None = None,
    output_path: str | None = None,
    resources: Any = None,
    backend: Any = None,
) -> LazyStep:
    """The lazy step that renders the records of ``source`` with a chat template and tokenizes them.

    Its identity is ``config_type`` (a tokenize config) built from the resolved inputs and the
    record ``fields``, hashed under ``attribute`` beside ``format_version``; at run time
    ``tokenize(config, inputs, output_path, template=..., backend=...)`` writes the caches.
    ``declared_as`` names the declaration in its log line.
    """
    chat = resolve_chat_inputs(source, tokenizer, template, sample_count, validation)
    config = config_type(
        source=chat.source.identity,
        tokenizer=chat.tokenizer_identity,
        template=chat.template_identity,
        splits=chat.source.splits,
        sample_count=sample_count,
        num_shards=num_shards,
        **fields,
    )
    logger.info("%s(%r): %s Tokenizer: %s; %s", declared_as, name, chat.source.description, chat.tokenizer_name,
                chat.template_note)

    def run(ctx) -> TokenizedDataset:
        inputs, run_config = inputs_at_run_time(ctx, chat.source, config, chat.tokenizer_dep, chat.tokenizer_location,
                                                chat.tokenizer_revision)
        return tokenize(run_config, inputs, ctx.output_path, template=template, backend=backend)

    return lazy_step(name, run, deps=chat.deps, hash_attrs={attribute: config, "format": format_version},
                     version=version, resources=resources, output_path=output_path)
