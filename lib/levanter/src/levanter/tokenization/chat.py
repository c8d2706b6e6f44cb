"""Conversations rendered with a chat template, tokenized with a loss mask on the assistant's tokens.

A conversation is a list of messages ``{"role": "system" | "user" | "assistant", "content": str}``.
It is rendered to text with a Jinja chat template, as Hugging Face tokenizers define them (the
``chat_template`` of ``tokenizer_config.json``, rendered in a sandbox with ``trim_blocks`` and
``lstrip_blocks``, the variables ``messages``, ``add_generation_prompt``, ``bos_token`` and
``eos_token``, a ``tojson`` filter and ``raise_exception``), then tokenized. The mask is 1 on the
tokens of the assistant's turns, their end marker included, and 0 on everything else: system and
user turns, role headers and the text between turns.

Where the assistant's text lies is read from the template in one of two ways:

- a template that marks it with ``{% generation %} ... {% endgeneration %}`` is rendered once and
  the marked text is what is trained on, exactly;
- otherwise from renders of the conversation's prefixes: for an assistant message ``i``, the
  prefix ``messages[:i]`` with the generation prompt (the assistant's role header) ends where the
  reply starts, and ``messages[:i + 1]`` ends where its turn ends; whitespace after the turn (the
  newline that separates turns) is left out. Each render must be a prefix of the next and of the
  whole conversation's render, else the template renders a turn differently once others follow
  it, and the conversation is refused.

Rendering is deterministic: the ``strftime_now`` global that some templates call for today's date
is deliberately absent (templates that test for it fall back to a fixed date).

The text is then cut at the span edges and each piece tokenized on its own; the pieces' tokens
must equal the tokens of the whole text, else a token straddles a span edge and no mask on token
boundaries would be faithful, and the conversation is refused, naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2
import numpy as np
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from levanter.errors import LevanterError
from levanter.tokenization.encoding import fastest_encode_batch
from levanter.tokenization.loading import HfTokenizer

logger = logging.getLogger(__name__)

# ChatML: each turn is "<|im_start|>{role}\n{content}<|im_end|>\n"; the generation prompt is the
# assistant's header. The default for tokenizers that ship without a template.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NAMED_TEMPLATES: dict[str, str] = {"chatml": CHATML}
DEFAULT_TEMPLATE = "chatml"
# ``template=`` value that insists on the tokenizer's own template.
TOKENIZER_TEMPLATE = "tokenizer"
ASSISTANT = "assistant"

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Private-use characters bracket {% generation %} output while rendering; no text may contain them.
_OPEN, _CLOSE = "\ue000", "\ue001"


class ChatTemplateError(LevanterError, ValueError):
    """A chat template that cannot be used, or that cannot render a conversation."""


class ConversationFormatError(LevanterError, ValueError):
    """A record that is not a conversation: no list of {"role", "content"} messages with an assistant turn."""


class SegmentationMismatchError(ChatTemplateError):
    """Tokenizing a conversation piece by piece gives other tokens than tokenizing it whole."""


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template: ``name`` ("chatml", ..., "tokenizer" for the tokenizer's own, "custom") and its Jinja text."""

    name: str
    source: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    @property
    def marks_generation(self) -> bool:
        """Whether the template marks the assistant's text with ``{% generation %}``."""
        return bool(_GENERATION_TAG.search(self.source))

    def identity(self) -> dict[str, str]:
        """What a step's hash records of the template: its name and content digest."""
        return {"name": self.name, "digest": self.digest}


def resolve_chat_template(tokenizer: HfTokenizer, template: str | None = None) -> ChatTemplate:
    """The template to render ``tokenizer``'s conversations with.

    ``template``: None for the tokenizer's own, else the default named template (``chatml``); a
    name from :data:`NAMED_TEMPLATES`; ``"tokenizer"`` to require the tokenizer's own; or the Jinja
    text of a template.
    """
    if template is None:
        if tokenizer.chat_template is not None:
            return ChatTemplate(TOKENIZER_TEMPLATE, tokenizer.chat_template)
        return ChatTemplate(DEFAULT_TEMPLATE, NAMED_TEMPLATES[DEFAULT_TEMPLATE])
    if template == TOKENIZER_TEMPLATE:
        if tokenizer.chat_template is None:
            raise ChatTemplateError(
                f"template='tokenizer', but tokenizer {tokenizer.source!r} has no chat template (no chat_template in its "
                f"tokenizer_config.json); name one of {', '.join(sorted(NAMED_TEMPLATES))} or pass a Jinja template"
            )
        return ChatTemplate(TOKENIZER_TEMPLATE, tokenizer.chat_template)
    if template in NAMED_TEMPLATES:
        return ChatTemplate(template, NAMED_TEMPLATES[template])
    if "{{" in template or "{%" in template:
        return ChatTemplate("custom", template)
    raise ChatTemplateError(
        f"unknown chat template {template!r}: use None (the tokenizer's own, else {DEFAULT_TEMPLATE}), 'tokenizer', "
        f"one of {', '.join(sorted(NAMED_TEMPLATES))}, or the Jinja text of a template"
    )


# -- rendering ------------------------------------------------------------------------------------


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which a prompt must not see.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


class _GenerationMarks(Extension):
    """``{% generation %}...{% endgeneration %}``: brackets what it renders with private marks."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

    def _mark(self, caller: Any) -> str:
        return _OPEN + caller() + _CLOSE


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationMarks, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


class ChatRenderer:
    """A compiled chat template with the tokenizer's special tokens bound; see the module docstring."""

    def __init__(self, template: ChatTemplate, *, bos_token: str | None = None, eos_token: str | None = None):
        self.template = template
        self._tokens = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
        self._prompt_checked = False
        try:
            self._compiled = _environment().from_string(template.source)
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template {template.name!r} does not compile: {error}") from None

    @classmethod
    def for_tokenizer(cls, tokenizer: HfTokenizer, template: ChatTemplate) -> ChatRenderer:
        return cls(template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)

    def _render_marked(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return self._compiled.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                tools=None,
                documents=None,
                **self._tokens,
            )
        except jinja2.TemplateError as error:
            raise ChatTemplateError(f"chat template {self.template.name!r} failed to render: {error}") from None

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False) -> str:
        """The conversation as text, exactly as the model will see it."""
        return self._render_marked(messages, add_generation_prompt).replace(_OPEN, "").replace(_CLOSE, "")

    def assistant_spans(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, end)`` character spans trained on, in order."""
        if self.template.marks_generation:
            return self._marked_spans(messages)
        return self._prefix_spans(messages)

    def _marked_spans(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        raw = self._render_marked(messages, add_generation_prompt=False)
        pieces, spans, length, start = [], [], 0, None
        for part in re.split(f"([{_OPEN}{_CLOSE}])", raw):
            if part == _OPEN:
                if start is not None:
                    raise ChatTemplateError(f"chat template {self.template.name!r} nests {{% generation %}} blocks")
                start = length
            elif part == _CLOSE:
                spans.append((start, length))
                start = None
            else:
                pieces.append(part)
                length += len(part)
        if not spans:
            raise ChatTemplateError(
                f"chat template {self.template.name!r} has {{% generation %}} blocks, but none rendered for a "
                "conversation with assistant turns"
            )
        return "".join(pieces), [span for span in spans if span[1] > span[0]]

    def _prefix_spans(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        full = self.render(messages)
        spans: list[tuple[int, int]] = []
        for i, message in enumerate(messages):
            if message["role"] != ASSISTANT:
                continue
            head = self.render(messages[:i], add_generation_prompt=True)
            turn = self.render(messages[: i + 1])
            if not turn.startswith(head):
                raise ChatTemplateError(
                    f"chat template {self.template.name!r}: its generation prompt is not how it starts assistant turn "
                    f"{i} (prompt ends {head[-40:]!r}, turn reads {turn[len(head) - 40 : len(head) + 20]!r}), so the "
                    "reply's start cannot be found; mark the reply with {% generation %} in the template"
                )
            if not full.startswith(turn):
                raise ChatTemplateError(
                    f"chat template {self.template.name!r} renders turn {i} differently once later turns follow it, so "
                    "its tokens cannot be found in the whole conversation; mark the replies with {% generation %}"
                )
            if not self._prompt_checked:
                self._prompt_checked = True
                if head == self.render(messages[:i]):
                    logger.warning(
                        "chat template %r adds nothing for add_generation_prompt, so an assistant role header, if its "
                        "turns have one, cannot be told from the reply and is trained on; mark replies with "
                        "{%% generation %%} to train on the reply alone", self.template.name,
                    )
            start, end = len(head), max(len(head), len(turn.rstrip()))
            if spans and start < spans[-1][1]:
                raise ChatTemplateError(f"chat template {self.template.name!r}: assistant turn {i} overlaps the previous one")
            if end > start:
                spans.append((start, end))
        return full, spans


# -- tokenizing ------------------------------------------------------------------------------------


def reply_end_marker(renderer: ChatRenderer) -> str:
    """The text a template puts after an assistant's reply to end its turn (``<|im_end|>`` for
    ChatML), as the training mask covers it: what a model fine-tuned on this template writes when
    its answer is done. Empty for a template that ends turns with nothing."""
    reply = "\u2063reply\u2063"  # a text no template adds around a reply by itself
    text, spans = renderer.assistant_spans([{"role": "user", "content": "question"}, {"role": "assistant", "content": reply}])
    start, end = spans[-1]
    trained = text[start:end]
    if not trained.startswith(reply):
        raise ChatTemplateError(f"chat template {renderer.template.name!r} does not start the assistant's span with the reply")
    return trained[len(reply):].strip()


def check_conversation(messages: Any, name: str) -> list[Mapping[str, Any]]:
    """``messages`` as a list of messages, or a :class:`ConversationFormatError` naming the record."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise ConversationFormatError(f"{name}: 'messages' must be a non-empty list of messages, got {_short(messages)}")
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ConversationFormatError(f"{name}: message {index} is {_short(message)}, not an object")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ConversationFormatError(f"{name}: message {index} has no 'role' (a string such as 'user'), got {_short(role)}")
        if not isinstance(content, str):
            raise ConversationFormatError(f"{name}: message {index} ({role}) has 'content' {_short(content)}, not a string")
    if not any(message["role"] == ASSISTANT for message in messages):
        raise ConversationFormatError(f"{name}: the conversation has no assistant turn, so nothing in it would be trained on")
    return list(messages)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def conversation_segments(renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[tuple[str, bool]]]:
    """The rendered text and its consecutive pieces ``(text, trained)``; joined, the pieces are the text."""
    for message in messages:
        if _OPEN in message["content"] or _CLOSE in message["content"]:
            raise ConversationFormatError("a message holds U+E000/U+E001, characters reserved for rendering")
    text, spans = renderer.assistant_spans(messages)
    segments, position = [], 0
    for start, end in spans:
        if start > position:
            segments.append((text[position:start], False))
        segments.append((text[start:end], True))
        position = end
    if position < len(text):
        segments.append((text[position:], False))
    return text, segments


def encode_conversations(
    tokenizer: HfTokenizer,
    renderer: ChatRenderer,
    conversations: Sequence[Any],
    names: Sequence[str],
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(token ids as uint32, loss mask as uint8)`` per conversation; ``names`` name them in errors.

    All texts of the batch go to the tokenizer in one call (it spreads them over the cores).
    """
    rendered: list[tuple[str, list[tuple[str, bool]]]] = []
    for messages, name in zip(conversations, names):
        messages = check_conversation(messages, name)
        try:
            rendered.append(conversation_segments(renderer, messages))
        except (ChatTemplateError, ConversationFormatError) as error:
            raise type(error)(f"{name}: {error}") from None
    texts = []
    for text, segments in rendered:
        texts.append(text)
        texts.extend(piece for piece, _ in segments)
    encoded = iter(fastest_encode_batch(tokenizer.tokenizer)(texts, add_special_tokens=False))
    results = []
    for (text, segments), name in zip(rendered, names):
        whole = np.asarray(next(encoded).ids, dtype=np.uint32)
        pieces = [(np.asarray(next(encoded).ids, dtype=np.uint32), trained) for _, trained in segments]
        ids = np.concatenate([piece for piece, _ in pieces]) if pieces else np.zeros(0, np.uint32)
        if not np.array_equal(ids, whole):
            raise SegmentationMismatchError(_mismatch(name, tokenizer, text, segments, whole, ids))
        mask = np.concatenate([np.full(piece.size, trained, dtype=np.uint8) for piece, trained in pieces] or [np.zeros(0, np.uint8)])
        results.append((ids, mask))
    return results


def _mismatch(name: str, tokenizer: HfTokenizer, text: str, segments: list[tuple[str, bool]], whole: np.ndarray,
              pieces: np.ndarray) -> str:
    common = min(whole.size, pieces.size)
    differ = next((i for i in range(common) if whole[i] != pieces[i]), common)
    decode = tokenizer.tokenizer.id_to_token
    edges, position = [], 0
    for piece, _ in segments[:-1]:
        position += len(piece)
        edges.append(position)
    around = ", ".join(repr(text[max(0, e - 12) : e] + "|" + text[e : e + 12]) for e in edges[:4])
    return (
        f"{name}: tokenizing the conversation piece by piece gives other tokens than tokenizing it whole (from token "
        f"{differ}: whole {[decode(int(i)) for i in whole[differ : differ + 4]]}, pieces "
        f"{[decode(int(i)) for i in pieces[differ : differ + 4]]}). A token spans an edge between an assistant reply "
        f"and the text around it (edges marked |: {around}), so no loss mask on token boundaries matches the text. "
        "Use a template whose turns end in special tokens, or a tokenizer that splits there."
    )


__all__ = [
    "ASSISTANT",
    "CHATML",
    "DEFAULT_TEMPLATE",
    "NAMED_TEMPLATES",
    "TOKENIZER_TEMPLATE",
    "ChatRenderer",
    "ChatTemplate",
    "ChatTemplateError",
    "ConversationFormatError",
    "SegmentationMismatchError",
    "check_conversation",
    "conversation_segments",
    "encode_conversations",
    "resolve_chat_template",
]
