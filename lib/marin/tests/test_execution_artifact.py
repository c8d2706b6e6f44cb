"""Artifacts: typed results round-trip through .artifact.json with provenance."""

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import pytest

from marin.execution.artifact import ArtifactError, load_artifact, save_artifact


@dataclass(frozen=True)
class Split:
    files: list[str]
    tokens: int


@dataclass(frozen=True)
class Result:
    splits: dict[str, Split]
    vocab: int
    note: Optional[str] = None
    sizes: tuple[int, ...] = field(default=())


def test_dataclass_result_roundtrips_into_its_class(tmp_path):
    result = Result({"train": Split(["a.bin"], 10)}, 257, sizes=(1, 2))
    save_artifact(str(tmp_path), result, step="tok", identity="abc")
    raw = json.loads((tmp_path / ".artifact.json").read_text())
    assert raw["result_type"].endswith(":Result") and raw["provenance"]["identity"] == "abc"
    loaded = load_artifact(str(tmp_path), Result)
    assert loaded.result == result and isinstance(loaded.result.splits["train"], Split)
    assert loaded.provenance.step == "tok" and loaded.provenance.argv and loaded.provenance.time.endswith("Z")
    assert load_artifact(str(tmp_path)).result["splits"]["train"]["tokens"] == 10  # no class: plain JSON


def test_json_like_results_and_memory_filesystem():
    url = f"memory://artifact-test-{os.getpid()}/step"
    save_artifact(url, {"a": [1, 2.5, None, True]})
    assert load_artifact(url).result == {"a": [1, 2.5, None, True]}
    assert load_artifact(url).output_path == url


def test_bad_results_and_missing_records_are_reported(tmp_path):
    with pytest.raises(ArtifactError, match="JSON-like"):
        save_artifact(str(tmp_path), {"x": object()})
    with pytest.raises(ArtifactError, match="finite"):
        save_artifact(str(tmp_path), float("inf"))
    assert not (tmp_path / ".artifact.json").exists()
    with pytest.raises(ArtifactError, match="No artifact"):
        load_artifact(str(tmp_path / "nowhere"))
    save_artifact(str(tmp_path), {"unexpected": 1, "vocab": 2, "splits": {}})
    with pytest.raises(ArtifactError, match="unexpected"):
        load_artifact(str(tmp_path), Result)
