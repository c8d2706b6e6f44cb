"""A fingerprint of a step function's own code, to notice outputs made by other code.

A step's identity leaves its function's code out on purpose: reformatting a script or fixing a
log line must not recompute a week of training. The price is that a real change to what the
function does keeps its old outputs. So the runner records this fingerprint next to each output
and compares it when the output is reused: same identity, other code is reported as "code
changed since this output was made" (and refused under ``strict``).

The fingerprint is the SHA-256 of the function's syntax tree as found in its source file
(``ast.dump`` without positions). Comments, blank lines, formatting and moving the function
within its file do not change it; any change to what its body does, does. It covers the
function's own code only, not the functions it calls: the git commit recorded beside it covers
the rest. Because it is found by source file and qualified name, ``marin status`` recomputes it
from the file without importing (running) anything.

A function with no source file (typed into a REPL, built by ``exec``) falls back to a hash of
its bytecode; that one can be compared within one Python version but not recomputed from files.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
# A syntax tree's dump can differ between Python versions for the same code; the method names the
# version so fingerprints from another Python are "unknown", never "changed".
AST_METHOD = f"ast/{_PYTHON}"
BYTECODE_METHOD = f"bytecode/{_PYTHON}"

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class CodeFingerprint:
    """``digest`` is ``"<method>:<sha256 hex>"``; ``file``/``qualname``/``line`` say where the code was."""

    digest: str
    file: str | None
    qualname: str
    line: int

    @property
    def method(self) -> str:
        return self.digest.rpartition(":")[0]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "CodeFingerprint | None":
        try:
            return cls(str(data["digest"]), data.get("file"), str(data["qualname"]), int(data["line"]))
        except (TypeError, KeyError, ValueError):
            return None


def comparable(recorded: str | None, current: str | None) -> bool:
    """Whether two digests were made the same way (so that differing means the code changed)."""
    return bool(recorded and current) and recorded.rpartition(":")[0] == current.rpartition(":")[0]


def fingerprint_function(fn: Callable[..., Any]) -> CodeFingerprint | None:
    """The fingerprint of ``fn`` (unwrapping ``__wrapped__``), or ``None`` for callables with no code."""
    target = fn
    while hasattr(target, "__wrapped__"):
        target = target.__wrapped__
    code = getattr(target, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    # The file is part of the key: code objects compare equal without it, and two files may
    # define the same function at the same line.
    return _fingerprint_code(code, code.co_filename, getattr(target, "__qualname__", code.co_name))


@functools.lru_cache(maxsize=4096)
def _fingerprint_code(code: types.CodeType, filename: str, qualname: str) -> CodeFingerprint:
    # Once per function's code, not per step: a sweep declares thousands of steps with one function.
    # The code object is what runs, so its fingerprint cannot change while it lives (a module
    # reloaded after an edit makes new code objects, fingerprinted anew).
    digest = fingerprint_from_source(code.co_filename, qualname, code.co_firstlineno)
    if digest is None:
        digest = f"{BYTECODE_METHOD}:{_bytecode_hash(code)}"
    file = code.co_filename if os.path.isfile(code.co_filename) else None
    return CodeFingerprint(digest, file, qualname, code.co_firstlineno)


def fingerprint_from_source(file: str | None, qualname: str, line: int | None) -> str | None:
    """The AST digest of the function ``qualname`` in ``file``, or ``None`` if it cannot be found.

    ``line`` (the function's first line, decorators included) picks among several definitions of
    the same name, and among lambdas; when the file has changed so that it matches none, a name
    defined once is still found.
    """
    if not file:
        return None
    try:
        stat = os.stat(file)
    except OSError:
        return None
    # Keyed by modification time and size: a file edited between two runs of one process is re-read.
    return _digest_cached(file, stat.st_mtime_ns, stat.st_size, qualname, line)


@functools.lru_cache(maxsize=4096)
def _digest_cached(file: str, mtime_ns: int, size: int, qualname: str, line: int | None) -> str | None:
    # A sweep declares thousands of steps with one function: found and hashed once.
    tree = _parse(file, mtime_ns, size)
    if tree is None:
        return None
    node = _find(tree, qualname.split("."), line)
    if node is None:
        return None
    dumped = ast.dump(node, annotate_fields=True, include_attributes=False)
    return f"{AST_METHOD}:{hashlib.sha256(dumped.encode('utf-8')).hexdigest()}"


@functools.lru_cache(maxsize=64)
def _parse(file: str, mtime_ns: int, size: int) -> ast.Module | None:
    try:
        with open(file, encoding="utf-8") as handle:
            return ast.parse(handle.read(), filename=file)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _first_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno, *(d.lineno for d in decorators)])


def _children_in_scope(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes defined directly in ``node``'s scope: not inside nested functions, classes or lambdas."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, _SCOPES):
            yield from _children_in_scope(child)


def _find(scope: ast.AST, parts: list[str], line: int | None) -> ast.AST | None:
    if not parts:
        return scope
    head, rest = parts[0], parts[1:]
    if head == "<locals>":
        return _find(scope, rest, line)
    if head == "<lambda>":
        candidates = [n for n in _children_in_scope(scope) if isinstance(n, ast.Lambda)]
    else:
        candidates = [
            n for n in _children_in_scope(scope) if isinstance(n, _SCOPES) and getattr(n, "name", None) == head
        ]
    if rest:
        found = [n for n in (_find(c, rest, line) for c in candidates) if n is not None]
        return found[0] if len(found) == 1 else _pick_by_line(found, line)
    return candidates[0] if len(candidates) == 1 and head != "<lambda>" else _pick_by_line(candidates, line)


def _pick_by_line(candidates: list[ast.AST], line: int | None) -> ast.AST | None:
    matching = [n for n in candidates if line is not None and _first_line(n) == line]
    return matching[0] if len(matching) == 1 else None


def _bytecode_hash(code: types.CodeType) -> str:
    digest = hashlib.sha256()
    digest.update(code.co_code)
    digest.update(repr((code.co_names, code.co_varnames, code.co_freevars)).encode("utf-8"))
    for const in code.co_consts:
        digest.update(_bytecode_hash(const).encode() if isinstance(const, types.CodeType) else repr(const).encode("utf-8"))
    return digest.hexdigest()
