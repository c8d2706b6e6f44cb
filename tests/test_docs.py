"""Every ```python block in docs/*.md runs as written, and so does every ```bash run block.

Blocks of one page run in order in one namespace, in a scratch working directory, with
MARIN_PREFIX pointing at a scratch prefix. Blocks fenced ```python no-run are skipped. Shell
blocks run only when fenced ```bash run (a page's other shell blocks are examples), each page's in
order in one scratch folder, with this Python's environment first on PATH.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, code) for each runnable python block of ``page``."""
    text = page.read_text()
    blocks = []
    for match in FENCE.finditer(text):
        info = match.group(1).strip().split()
        if info[:1] == ["python"] and "no-run" not in info[1:]:
            blocks.append((text.count("\n", 0, match.start()) + 1, match.group(2)))
    return blocks


def shell_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, script) for each ```bash run block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(2)) for match in FENCE.finditer(text)
            if match.group(1).strip().split() == ["bash", "run"]]


PAGES = sorted(DOCS.glob("*.md"))
SHELL_PAGES = [page for page in PAGES if shell_blocks(page)]


def test_fence_parser_skips_no_run_blocks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\nx = 1\n```\n\n```python no-run\nraise SystemExit\n```\n\n```bash\nls\n```\n")
    assert [code for _, code in python_blocks(page)] == ["x = 1\n"]


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_docs_examples_run(page, tmp_path, monkeypatch):
    blocks = python_blocks(page)
    if not blocks:
        pytest.skip(f"{page.name} has no runnable python blocks")
    workdir = tmp_path / "work"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("MARIN_PREFIX", str(tmp_path / "prefix"))
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    for line, code in blocks:
        try:
            exec(compile(code, f"{page}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{page.name}, block at line {line} failed: {exc!r}") from exc


@pytest.mark.parametrize("page", SHELL_PAGES, ids=[p.name for p in SHELL_PAGES])
def test_docs_shell_blocks_run(page, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {**os.environ, "MARIN_PREFIX": str(tmp_path / "prefix"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line, script in shell_blocks(page):
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{page.name}, block at line {line} failed:\n{done.stdout}\n{done.stderr}"
