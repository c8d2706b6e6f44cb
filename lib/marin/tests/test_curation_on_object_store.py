"""Curation and dedup steps read their input from, and write under, an object-store prefix.

Inputs uploaded to a bucket (a local S3 server, or fake-gcs-server for ``gs://``), the chain run
under a prefix in the same bucket with worker processes, and its output files compared with the
same chain run on local disk in-process: equal bytes, nothing written to the local disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from marin.curation.dedup_steps import LineDedupConfig, exact_deduplicated, fuzzy_deduplicated, line_deduplicated
from marin.curation.language import language_filtered
from marin.curation.quality import quality_filtered
from marin.execution.step_runner import StepRunner
from rigging import filesystem as fsx
from storygen import generate_stories

FRENCH = ("Il était une fois un petit chat qui aimait jouer dans le jardin avec ses amis. Chaque matin, il "
          "regardait les oiseaux et rêvait de voler très haut dans le ciel bleu au-dessus de la maison.")
BANNER = "Read more stories like this one on our website every day."


def _write_corpus(root: Path) -> None:
    stories = generate_stories(30, seed=8)
    records = [{"id": f"s{i:02d}", "text": f"{BANNER}\n{t}"} for i, t in enumerate(stories)]
    records += [{"id": "copy", "text": f"{BANNER}\n{stories[3]}"},
                {"id": "near", "text": f"{BANNER}\n" + stories[4].replace("the", "a", 1)},
                {"id": "fr", "text": FRENCH}, {"id": "spam", "text": "buy now click here best price " * 20}]
    root.mkdir(parents=True)
    for part in range(3):
        with open(root / f"part-{part}.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in records[part::3])


def _chain(inputs: str, backend: str):
    english = language_filtered("curated/english", inputs, languages=("en",), backend=backend)
    clean = quality_filtered("curated/quality", english, backend=backend)
    unique = exact_deduplicated("curated/exact", clean, backend=backend)
    distinct = fuzzy_deduplicated("curated/fuzzy", unique, output_format="parquet", backend=backend)
    lines = line_deduplicated("curated/lines", distinct, config=LineDedupConfig(min_chars=10), backend=backend)
    return lines


def _outputs(prefix: str) -> dict[str, bytes]:
    """Every data/removed/stats file under ``prefix`` by path below it, the step folders' hashes cut
    (a file's identity is its digest locally, what the store reports there), runner records left out."""
    files = {}
    for relative in fsx.find_files(prefix):
        if any(part.startswith(".") for part in relative.split("/")):
            continue
        group, step, rest = relative.split("/", 2)
        with fsx.open_url(fsx.join(prefix, relative), "rb") as handle:
            files[f"{group}/{step.rsplit('-', 1)[0]}/{rest}"] = handle.read()
    return files


@pytest.mark.parametrize("store", ["s3", "gcs"])
def test_the_curation_chain_on_object_storage_writes_what_it_writes_locally(store, request, tmp_path, monkeypatch):
    prefix = request.getfixturevalue(f"{store}_prefix")
    _write_corpus(tmp_path / "corpus")
    local = StepRunner(prefix=str(tmp_path / "local"))
    assert not local.run([_chain(str(tmp_path / "corpus"), "inline")]).failed

    inputs = prefix.rsplit("/", 1)[0] + "/inputs/corpus"
    fs, path = fsx.filesystem(inputs)
    fs.put(str(tmp_path / "corpus"), path, recursive=True)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    remote = StepRunner(prefix=prefix)
    lines = _chain(inputs, "processes")
    report = remote.run([lines])
    assert not report.failed and len(report.ran) == 5
    assert os.listdir(workdir) == [], "a step wrote to the local disk instead of the prefix"

    written_locally, written_remotely = _outputs(str(tmp_path / "local")), _outputs(prefix)
    assert len(written_locally) >= 15 and any(name.endswith(".parquet") for name in written_locally)
    assert sorted(written_remotely) == sorted(written_locally)
    assert [name for name in written_locally if written_locally[name] != written_remotely[name]] == []
    assert remote.run([lines]).ran == []  # cached on the object store
