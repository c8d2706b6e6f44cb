"""A step as pure data: what to run, what it depends on, and what makes it distinct.

A :class:`StepSpec` is frozen. Its :attr:`~StepSpec.identity` (a SHA-256 hex digest) is the hash
of its name, version, hash attributes and its dependencies' identities; see
:mod:`marin.execution.hashing.identity`. Where the output goes (``output_path``) and what hardware it
needs (``resources``) are placement and never change the identity; neither do ``annotations``.

It is the engine's only step type: the lazy handles that library helpers return
(:mod:`marin.execution.lazy`) are StepSpecs too, whose function is marked :class:`takes_context`.

``fn`` is called according to its signature:

* no parameters: ``fn()``;
* one parameter annotated ``StepContext`` or named ``ctx``/``context``: ``fn(StepContext)``;
* any other single parameter: ``fn(output_path)`` (a string: local path or URL);
* marked :class:`takes_context`: ``fn(StepContext)``, whatever its signature.

A non-``None`` return value is the step's result, saved in ``.artifact.json``.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from marin.execution.hashing.code_fingerprint import CodeFingerprint, fingerprint_function
from marin.execution.hashing.identity import (
    InvalidStepError,
    canonical_hash_attrs,
    canonicalize,
    identity_record,
    short_hash,
    step_identity,
    validate_step_name,
)

CALL_NO_ARGS = "no_args"
CALL_OUTPUT_PATH = "output_path"
CALL_CONTEXT = "context"
_CONTEXT_PARAMETER_NAMES = ("ctx", "context")


class _computed_once:
    """A value computed on first access and kept in the instance: ``functools.cached_property``
    without the lock Python 3.11's takes on every first access (Python 3.12 dropped it). A step's
    identity is the same whichever thread computes it first, and a sweep declares thousands."""

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute = compute
        self.name = compute.__name__
        self.__doc__ = compute.__doc__

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value


class takes_context:
    """Mark ``fn`` as taking a :class:`~marin.execution.running.step_context.StepContext` whatever its signature.

    Lazy handles use it so a helper's ``def run(c): ...`` still receives the context.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__wrapped__ = fn

    def __call__(self, ctx: Any) -> Any:
        return self.fn(ctx)


def _is_root(output_path: str) -> bool:
    """``/``, ``.``, ``./`` and bucket roots (``gs://bucket``): folders no step may own."""
    path = output_path.replace("\\", "/")
    if "://" in path:
        path = path.split("://", 1)[1].split("/", 1)[1] if "/" in path.split("://", 1)[1] else ""
    return all(segment in ("", ".") for segment in path.split("/"))


def _check_output_path(name: str, output_path: Any) -> None:
    if not isinstance(output_path, str) or not output_path:
        raise InvalidStepError(f"Step {name!r}: output_path must be a non-empty string or None.")
    if ".." in output_path.replace("\\", "/").split("/"):
        raise InvalidStepError(f"Step {name!r}: output_path {output_path!r} must not contain '..'.")
    if _is_root(output_path):
        raise InvalidStepError(
            f"Step {name!r}: output_path {output_path!r} is the root of a file system, bucket or "
            "prefix, where the step's files would mix with everything else; name a folder for it, like "
            "'outputs/preprocess'."
        )


def describe_function(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of the callable behind ``fn`` (for ``.executor_info``)."""
    target = getattr(fn, "__wrapped__", fn)
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


# The call style of each plain function already seen: a sweep declares thousands of steps with one
# function, and reading a signature costs more than the rest of a step's declaration. Weak keys: a
# function's entry goes with it. Others (partials, callable objects) are looked at each time.
_call_styles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def call_style(fn: Callable[..., Any]) -> str:
    """How the runner calls ``fn``; raises :class:`InvalidStepError` for unsupported signatures."""
    if type(fn) is not types.FunctionType:
        return _call_style(fn)
    style = _call_styles.get(fn)
    if style is None or getattr(fn, "__signature__", None) is not None:
        style = _call_styles[fn] = _call_style(fn)
    return style


def _call_style(fn: Callable[..., Any]) -> str:
    target = fn.fn if isinstance(fn, takes_context) else fn
    if not callable(target):
        raise InvalidStepError(f"A step's fn must be callable, got {target!r}.")
    if isinstance(fn, takes_context):
        return CALL_CONTEXT
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return CALL_OUTPUT_PATH
    required = [
        p
        for p in signature.parameters.values()
        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    positional = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not required:
        return CALL_NO_ARGS
    if len(required) > 1 or required[0].kind == required[0].KEYWORD_ONLY or not positional:
        raise InvalidStepError(
            f"Step function {describe_function(fn)} takes {len(required)} required parameters; a step function "
            "takes none, the output path, or a StepContext (annotated StepContext or named ctx)."
        )
    parameter = required[0]
    annotation = parameter.annotation
    annotation_name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if annotation_name.rsplit(".", 1)[-1] == "StepContext" or parameter.name in _CONTEXT_PARAMETER_NAMES:
        return CALL_CONTEXT
    return CALL_OUTPUT_PATH


@dataclass(frozen=True, eq=False, repr=False, init=False)
class StepSpec:
    """One unit of cached work. See the module docstring for how ``fn`` is called.

    Two specs are equal (and hash alike) when their identities are equal: they would produce the
    same output.
    """

    name: str
    fn: Callable[..., Any]
    deps: Sequence[StepSpec] = ()
    hash_attrs: Mapping[str, Any] = field(default_factory=dict)
    output_path: str | None = None
    version: str | None = None
    resources: Any = None
    # Facts about the step for people and tools, never part of its identity: a sweep point's
    # budget and planned FLOPs (``flops``, which a dry run adds up), ... Plain JSON data; kept in
    # the step's ``.executor_info``.
    annotations: Mapping[str, Any] = field(default_factory=dict)

    # Written here rather than generated: a frozen dataclass's ``__init__`` sets each field through
    # ``object.__setattr__`` and a ``__post_init__`` then replaces half of them, which was most of
    # the cost of declaring a step (a sweep declares thousands). The fields above stay the
    # dataclass's, for ``dataclasses.replace`` and ``fields``.
    def __init__(
        self,
        name: str,
        fn: Callable[..., Any],
        deps: Sequence[StepSpec] | None = (),
        hash_attrs: Mapping[str, Any] | None = None,
        output_path: str | None = None,
        version: str | None = None,
        resources: Any = None,
        annotations: Mapping[str, Any] | None = None,
    ) -> None:
        validate_step_name(name)
        # Lists are accepted for convenience (the documented examples use deps=[]); stored as a tuple
        # so the spec stays immutable.
        if type(deps) is not tuple:
            deps = tuple(deps or ())
        for dep in deps:
            if not isinstance(dep, StepSpec):
                raise InvalidStepError(
                    f"Step {name!r} has a dependency of type {type(dep).__name__}; deps must be steps "
                    "(StepSpecs or the lazy handles that lazy_step, tokenized(), train_lm() ... return)."
                )
        if hash_attrs is None:
            hash_attrs = {}
        elif type(hash_attrs) is not dict and not isinstance(hash_attrs, Mapping):
            raise InvalidStepError(f"Step {name!r}: hash_attrs must be a dict, got {type(hash_attrs).__name__}.")
        if annotations:
            if not isinstance(annotations, Mapping):
                raise InvalidStepError(f"Step {name!r}: annotations must be a dict, got {type(annotations).__name__}.")
            annotations = dict(annotations)
            canonicalize(annotations, where=f"{name}.annotations")
        if version is not None and not isinstance(version, str):
            version = str(version)
        if output_path is not None:
            _check_output_path(name, output_path)
        call_style(fn)  # fail at definition time, not halfway through a run
        fields = self.__dict__
        fields["name"] = name
        fields["fn"] = fn
        fields["deps"] = deps
        # Private copies: mutating the caller's dicts later must not change what this step is.
        fields["hash_attrs"] = dict(hash_attrs)
        fields["output_path"] = output_path
        fields["version"] = version
        fields["resources"] = resources
        fields["annotations"] = annotations or {}
        # What the identity hashes, fixed when the step is declared.
        fields["_canonical_hash_attrs"] = canonical_hash_attrs(hash_attrs, step_name=name)

    @property
    def identity_record(self) -> dict[str, Any]:
        """What the identity hashes, made afresh on each access (a sweep's thousands of steps need
        only their digests kept; the record is written once, into the step's ``.executor_info``)."""
        return identity_record(
            self.name, self.version, self._canonical_hash_attrs, (dep.identity for dep in self.deps), canonical=True
        )

    @_computed_once
    def identity(self) -> str:
        return step_identity(self.name, self.version, self._canonical_hash_attrs, [dep.identity for dep in self.deps])

    @property
    def call_style(self) -> str:
        return call_style(self.fn)

    @cached_property
    def code_fingerprint(self) -> CodeFingerprint | None:
        """Fingerprint of the function's own code (not part of the identity; see code_fingerprint)."""
        return fingerprint_function(self.fn)

    @property
    def fn_description(self) -> str:
        return describe_function(self.fn)

    @property
    def defined_at(self) -> str:
        """``module:qualname (file:line)`` of the function, for messages that must point at it."""
        code = self.code_fingerprint
        if code is None or code.file is None:
            return self.fn_description
        return f"{self.fn_description} ({code.file}:{code.line})"

    @property
    def short_hash(self) -> str:
        return short_hash(self.identity)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepSpec):
            return NotImplemented
        return self is other or self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    def __repr__(self) -> str:
        return f"StepSpec(name={self.name!r}, identity={self.short_hash}, deps={[d.name for d in self.deps]})"
