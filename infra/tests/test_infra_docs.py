"""docs/infra.md keeps to the program: its shell blocks are run or marked cloud-only, its list of
what the default stack creates is the list the program declares for the page's own settings, and
its table of GPU machine types is fray's accelerator table."""

from __future__ import annotations

import re
from pathlib import Path

from fray.cluster.accelerators import GPU_MACHINE_TYPES

from infra.offline import plan
from infra.settings import StackSettings, load_settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "infra.md"
TEXT = PAGE.read_text()
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def test_every_shell_block_is_run_by_the_docs_test_or_marked_as_needing_the_cloud():
    blocks = [(match.group(1).split(), match.start()) for match in FENCE.finditer(TEXT)]
    shell = [(info, start) for info, start in blocks if info[:1] in (["bash"], ["sh"], ["shell"])]
    # tests/test_docs.py runs every shell block whose fence does not say no-run.
    assert len([info for info, _ in shell if info == ["bash"]]) >= 4
    for info, start in shell:
        assert info in (["bash"], ["bash", "no-run"]), info
        if info == ["bash", "no-run"]:
            before = TEXT[max(0, start - 400):start]
            assert re.search(r"cloud-only|account", before), TEXT[start:start + 80]


def _page_settings(folder: Path) -> StackSettings:
    """The settings file the page writes, read as ``python -m infra.cli`` reads it."""
    heredoc = re.search(r"cat > infra/stacks/dev.yaml <<'EOF'\n(.*?\n)EOF\n", TEXT, re.DOTALL)
    assert heredoc is not None
    path = folder / "dev.yaml"
    path.write_text(heredoc.group(1))
    return load_settings(str(path))


def test_the_list_of_what_the_default_stack_creates_is_what_the_program_declares(tmp_path):
    section = TEXT.split("## What the default stack creates", 1)[1].split("\n## ", 1)[0]
    listed = set()
    for row in section.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith("`"):
            listed.update(re.findall(r"`([a-z0-9-]+)`", cells[1]))
    declared = {resource.name for resource in plan(_page_settings(tmp_path))}
    assert declared == listed


GPU_SECTION = "#### GPU machine types"
GPU_HEADER = ["machine type", "GPU", "GPUs", "vCPUs", "memory (GB)"]


def expected_gpu_rows() -> list[list[str]]:
    return [[f"`{m.name}`", m.gpu, str(m.gpus), str(m.cpus), f"{m.memory_gb:g}"] for m in GPU_MACHINE_TYPES.values()]


def test_the_gpu_machine_table_is_frays_accelerator_table():
    section = TEXT.split(GPU_SECTION, 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    expected = [GPU_HEADER, ["---"] * len(GPU_HEADER), *expected_gpu_rows()]
    markdown = "\n".join("| " + " | ".join(cells) + " |" for cells in expected)
    assert rows == expected, f"docs/infra.md, {GPU_SECTION}, should read:\n\n{markdown}"
