"""docs/cluster.md's table of TPU slices is fray's accelerator table (fray.cluster.accelerators),
row for row: which types ResourceConfig.with_tpu takes, how many hosts (replicas) each is, and
what one host has. A failure prints the table as it should read."""

from __future__ import annotations

import math
from pathlib import Path

from fray.cluster.accelerators import TPU_GENERATIONS, TpuGeneration

PAGE = Path(__file__).resolve().parent.parent / "docs" / "cluster.md"
SECTION = "### TPU slices: hosts and chips"
HEADER = ["TPU type", "N", "N counts", "hosts (replicas)", "chips per host", "host vCPUs", "host memory (GB)",
          "host VM", "published in"]


def _rows(generation: TpuGeneration) -> list[list[str]]:
    """One row per run of consecutive sizes whose hosts are the same VM shape."""
    runs: list[list[int]] = []
    for size in generation.sizes:
        if runs and generation.slice(runs[-1][-1]).host == generation.slice(size).host:
            runs[-1].append(size)
        else:
            runs.append([size])
    written = " or ".join(f"`{name}-N`" for name in (generation.name, *generation.aliases))
    counts = "TensorCores (2 per chip)" if generation.cores_per_chip == 2 else "chips"
    source = f"[TPU {generation.source.rstrip('/').rsplit('/', 1)[1]}]({generation.source})"
    rows = []
    for sizes in runs:
        host = generation.slice(sizes[0]).host
        hosts = str(generation.slice(sizes[0]).hosts) if len(sizes) == 1 else \
            f"N / {generation.cores_per_chip * host.chips}"
        rows.append([written, ", ".join(map(str, sizes)), counts, hosts, str(host.chips), str(host.cpus),
                     f"{host.memory_gb:g}", f"`{host.machine_type}`", source])
    return rows


def expected_table() -> list[list[str]]:
    return [row for generation in TPU_GENERATIONS.values() for row in _rows(generation)]


def _markdown(rows: list[list[str]]) -> str:
    lines = [HEADER, ["---"] * len(HEADER), *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def _page_table() -> list[list[str]]:
    section = PAGE.read_text().split(SECTION, 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("|")]
    assert rows and rows[0] == HEADER, f"{PAGE.name}: the table under {SECTION!r} must start with {HEADER}"
    return rows[2:]


def test_the_pages_tpu_table_is_frays_accelerator_table():
    assert _page_table() == expected_table(), f"{PAGE.name}, {SECTION}, should read:\n\n{_markdown(expected_table())}"


def test_every_host_count_in_the_table_is_right_for_each_size():
    # The "N / k" cells are arithmetic a reader does; check it gives the hosts fray computes.
    for generation in TPU_GENERATIONS.values():
        for row in _rows(generation):
            for size in map(int, row[1].split(", ")):
                hosts = size // int(row[3].split(" / ")[1]) if "/" in row[3] else int(row[3])
                assert hosts == generation.slice(size).hosts, (generation.name, size)


CHIPS_SECTION = "### TPU chips: memory and topology"
CHIPS_HEADER = ["TPU type", "chip", "HBM per chip (GiB)", "topology of each N", "published in"]


def expected_chips_table() -> list[list[str]]:
    """One row per generation: the chip's short name, its HBM, and the grid of each size."""
    rows = []
    for generation in TPU_GENERATIONS.values():
        written = " or ".join(f"`{name}-N`" for name in (generation.name, *generation.aliases))
        shapes = ", ".join(f"{size}: {shape}" for size, shape in zip(generation.sizes, generation.topologies, strict=True))
        source = f"[TPU {generation.source.rstrip('/').rsplit('/', 1)[1]}]({generation.source})"
        rows.append([written, f"`{generation.chip}`", str(generation.hbm_gib), shapes, source])
    return rows


def test_the_pages_chip_table_is_frays_accelerator_table():
    section = PAGE.read_text().split(CHIPS_SECTION, 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in section.splitlines() if line.startswith("|")]
    assert rows and rows[0] == CHIPS_HEADER
    expected = expected_chips_table()
    table = "\n".join("| " + " | ".join(cells) + " |" for cells in [CHIPS_HEADER, ["---"] * len(CHIPS_HEADER), *expected])
    assert rows[2:] == expected, f"{PAGE.name}, {CHIPS_SECTION}, should read:\n\n{table}"


def test_every_topology_has_the_slices_chips():
    for generation in TPU_GENERATIONS.values():
        for size in generation.sizes:
            tpu = generation.slice(size)
            grid = [int(side) for side in tpu.topology.split(":")[1].split("x")]
            assert tpu.topology.startswith(f"{generation.chip}:") and math.prod(grid) == tpu.chips, tpu
