"""How conftest.py places test files on the pytest-xdist workers: every file it names exists, so a
file renamed or moved does not silently lose its place (a shared cluster, an early start)."""

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_suite_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", REPO / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_the_scheduler_names_exists():
    conftest = load_suite_conftest()
    named = [path for paths in conftest.SHARED_WORKER.values() for path in paths]
    named += [*conftest.SPREAD_BY_TEST, *conftest.WAITING_FILES]
    assert named and len(set(named)) == len(named), "a file is named twice"
    assert [path for path in named if not (REPO / path).is_file()] == []
