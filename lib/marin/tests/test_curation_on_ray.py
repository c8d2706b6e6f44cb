"""Every curation step writes the same bytes on a local Ray cluster as in-process.

One chain of steps over a small mixed corpus (HTML pages, stories with planted exact and near
copies, a French story, spam, a leaked evaluation item), run once with ``backend="inline"`` and
once with a ``RayClient`` on a private 2-CPU cluster, into two prefixes. The steps' data files
(everything but the runner's own records, which name their prefix and time) must be equal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs `pip install 'marin[ray]'`")

from fray.cluster import ship_by_value  # noqa: E402
from fray.cluster.ray_client import RayClient  # noqa: E402
from marin.curation.classifier import classifier_filtered, quality_classifier  # noqa: E402
from marin.curation.decontaminate import decontaminated  # noqa: E402
from marin.curation.dedup_steps import (  # noqa: E402
    LineDedupConfig,
    exact_deduplicated,
    fuzzy_deduplicated,
    line_deduplicated,
)
from marin.curation.extract import extracted  # noqa: E402
from marin.curation.language import language_filtered  # noqa: E402
from marin.curation.quality import quality_filtered  # noqa: E402
from marin.execution.step_runner import StepRunner  # noqa: E402
from storygen import generate_stories  # noqa: E402

pytestmark = pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")

FRENCH = ("Il était une fois un petit chat qui aimait jouer dans le jardin avec ses amis. Chaque matin, il "
          "regardait les oiseaux et rêvait de voler très haut dans le ciel bleu au-dessus de la maison.")
LEAK = "the quick brown fox jumps over the lazy dog near the quiet river bank every single morning"


@pytest.fixture(scope="module")
def ray_client():
    ship_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield RayClient(address=None, task_retries=1)
    finally:
        ray.shutdown()


def _corpus(root: Path) -> dict[str, str]:
    stories = generate_stories(24, seed=5)
    near = stories[0].replace("the", "a", 2)
    records = [{"id": f"s{i}", "text": t} for i, t in enumerate(stories)]
    records += [{"id": "copy", "text": stories[1]}, {"id": "near", "text": near}, {"id": "fr", "text": FRENCH},
                {"id": "spam", "text": "buy now click here best price " * 20},
                {"id": "leak", "text": stories[2] + " " + LEAK.capitalize() + "."}]
    (root / "docs").mkdir(parents=True)
    for part in range(3):
        (root / "docs" / f"part-{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[part::3]))
    (root / "html").mkdir()
    for i, story in enumerate(stories[:4]):
        (root / "html" / f"page-{i}.html").write_text(
            f"<html lang=en><head><title>Story {i}</title></head><body><nav>Home | About | Contact</nav>"
            f"<article><p>{story}</p></article><footer>Copyright 2026</footer></body></html>")
    (root / "eval.jsonl").write_text(json.dumps({"text": LEAK}) + "\n")
    (root / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in generate_stories(30, seed=9)))
    (root / "spam.jsonl").write_text("".join(json.dumps({"text": f"win cash now {i} click buy cheap deal offer"}) + "\n"
                                             for i in range(30)))
    return {"docs": str(root / "docs"), "html": str(root / "html"), "eval": str(root / "eval.jsonl"),
            "good": str(root / "good.jsonl"), "spam": str(root / "spam.jsonl")}


def _chain(inputs: dict[str, str], backend):
    pages = extracted("curated/pages", inputs["html"], backend=backend)
    english = language_filtered("curated/english", inputs["docs"], backend=backend)
    clean = quality_filtered("curated/quality", english, backend=backend)
    scorer = quality_classifier("classifiers/spam", inputs["good"], inputs["spam"])
    scored = classifier_filtered("curated/scored", clean, scorer, backend=backend)
    unleaked = decontaminated("curated/decontaminated", scored, inputs["eval"], backend=backend)
    unique = exact_deduplicated("curated/exact", unleaked, backend=backend)
    near = fuzzy_deduplicated("curated/fuzzy", unique, backend=backend)
    # min_chars=10 so that the pages' repeated navigation and footer lines count as boilerplate.
    lines = line_deduplicated("curated/lines", pages, config=LineDedupConfig(min_chars=10), backend=backend)
    return [lines, near]


def _data_files(prefix: Path) -> dict[str, bytes]:
    """Every file the steps wrote, by path inside the prefix, without the runner's records (dot files, and the attempts' logs in .attempts/)."""
    return {str(p.relative_to(prefix)): p.read_bytes() for p in sorted(prefix.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(prefix).parts) and "classifiers" not in p.parts}


def test_every_curation_step_writes_the_same_bytes_on_ray_as_inline(tmp_path, ray_client):
    inputs = _corpus(tmp_path / "inputs")
    written = {}
    for label, backend in (("inline", "inline"), ("ray", ray_client)):
        prefix = tmp_path / label
        report = StepRunner(prefix=str(prefix)).run(_chain(inputs, backend))
        assert not report.failed
        written[label] = _data_files(prefix)
    assert len(written["inline"]) >= 8
    steps = {name.split("/")[1].rsplit("-", 1)[0] for name in written["inline"]}
    assert steps >= {"pages", "english", "quality", "scored", "decontaminated", "exact", "fuzzy", "lines"}
    different = sorted(k for k in written["inline"] if written["inline"][k] != written["ray"].get(k))
    assert set(written["inline"]) == set(written["ray"]) and different == []
