"""Dedup workers spill keys to sorted runs: the merge is an exact sort, and buffer sizes change nothing."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
from marin.curation.dedup.spill import (
    ENTRY,
    RunWriter,
    SpillSettings,
    groups,
    list_runs,
    merge_sorted,
    read_run,
)
from marin.curation.dedup_steps import (
    LineDedupConfig,
    exact_deduplicated,
    fuzzy_deduplicated,
    line_deduplicated,
)
from marin.execution.artifact import load_artifact
from marin.execution.step_runner import StepRunner
from storygen import generate_stories

TINY = SpillSettings(batch_docs=3, buffer_entries=5, read_chunk=2, fan_in=2, lookup_batch=1, record_buffer=2)
HUGE = SpillSettings(batch_docs=100_000, buffer_entries=1 << 20, read_chunk=1 << 20, fan_in=1000,
                     lookup_batch=1 << 20, record_buffer=1 << 20)


def random_entries(rng: np.random.Generator, count: int, distinct_keys: int) -> np.ndarray:
    entries = np.empty(count, dtype=ENTRY)
    # Few distinct keys, spread over the whole 64-bit range, so groups straddle blocks and partitions.
    palette = rng.integers(0, 1 << 63, size=distinct_keys, dtype=np.uint64) * np.uint64(2)
    entries["key"] = rng.choice(palette, size=count)
    entries["key2"] = rng.integers(0, 3, size=count)
    entries["shard"] = rng.integers(0, 4, size=count)
    entries["ordinal"] = np.arange(count)
    return entries


def fully_sorted(entries: np.ndarray) -> np.ndarray:
    return entries[np.lexsort((entries["ordinal"], entries["shard"], entries["key2"], entries["key"]))]


def test_runs_merge_back_to_one_sorted_stream_per_partition(tmp_path):
    rng = np.random.default_rng(0)
    entries = random_entries(rng, 5000, 300)
    partitions = 3
    writer = RunWriter(str(tmp_path), shard=0, partitions=partitions,
                       settings=SpillSettings(buffer_entries=97, read_chunk=13, fan_in=4))
    for start in range(0, len(entries), 41):
        writer.add(entries[start:start + 41])
    runs = writer.close()
    assert len(runs) <= 4 and list_runs(str(tmp_path)) == sorted(runs)  # 52 runs merged down to the fan-in
    merged = [np.concatenate(list(merge_sorted([read_run(run, p, p + 1, 13) for run in runs])))
              for p in range(partitions)]
    assert [len(m) for m in merged] != [0, 0, len(entries)] and sum(len(m) for m in merged) == len(entries)
    # In key order (equal keys may straddle blocks, so only the key's order is promised), nothing lost.
    everything = np.concatenate(merged)
    assert (everything["key"][1:] >= everything["key"][:-1]).all()
    assert (fully_sorted(everything) == fully_sorted(entries)).all()
    # Grouping across block boundaries: every (key, key2) group of at least 3, whole, in order.
    expected = {}
    for entry in entries.tolist():
        expected.setdefault((entry[0], entry[1]), []).append(entry[3])
    found = {}
    for p in range(partitions):
        for group in groups(merge_sorted([read_run(run, p, p + 1, 13) for run in runs]), min_size=3):
            found[(int(group["key"][0]), int(group["key2"][0]))] = sorted(group["ordinal"].tolist())
    assert found == {key: sorted(members) for key, members in expected.items() if len(members) >= 3}


def test_merge_of_no_runs_and_empty_partitions_is_empty(tmp_path):
    assert list(merge_sorted([])) == []
    writer = RunWriter(str(tmp_path), shard=1, partitions=2, settings=SpillSettings(buffer_entries=8))
    entry = np.zeros(1, dtype=ENTRY)  # key 0: partition 0 only
    writer.add(entry)
    [run] = writer.close()
    assert list(read_run(run, 1, 2, 4)) == []
    assert [b.tolist() for b in merge_sorted([read_run(run, 0, 1, 4)])] == [entry.tolist()]


@pytest.mark.parametrize("value", [0, -1])
def test_spill_settings_refuse_empty_buffers(value):
    with pytest.raises(ValueError, match="buffer_entries"):
        SpillSettings(buffer_entries=value)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two jsonl files: stories, exact copies, near copies (one word changed) and a shared footer line."""
    rng = random.Random(4)
    stories = generate_stories(60, seed=9)
    docs = [(f"doc-{i:03d}", s + "\nShared footer line, present in many documents here.") for i, s in enumerate(stories)]
    for n, i in enumerate(rng.sample(range(60), 8)):
        docs.append((f"copy-{n:03d}", docs[i][1].upper()))
    for n, i in enumerate(rng.sample(range(60), 10)):
        words = stories[i].split()
        words[rng.randrange(len(words))] = "pebble"
        docs.append((f"near-{n:03d}", " ".join(words)))
    rng.shuffle(docs)
    folder = tmp_path_factory.mktemp("spill") / "docs"
    folder.mkdir()
    for f in range(2):
        with open(folder / f"part-{f}.jsonl", "w") as handle:
            handle.writelines(json.dumps({"id": i, "text": t}) + "\n" for i, t in docs[f::2])
    return folder


def output_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)}


def test_tiny_buffers_remove_exactly_what_huge_buffers_remove(corpus, tmp_path):
    """Every buffer at its smallest (runs of 5 entries merged pairwise, reads of 2) against one run per shard."""
    outputs = []
    for settings in (TINY, HUGE):
        runner = StepRunner(prefix=str(tmp_path / str(settings.buffer_entries)))
        steps = [exact_deduplicated("dedup/exact", str(corpus), backend="inline", spill=settings),
                 fuzzy_deduplicated("dedup/fuzzy", str(corpus), backend="inline", spill=settings),
                 line_deduplicated("dedup/lines", str(corpus), config=LineDedupConfig(min_documents=3),
                                   backend="inline", spill=settings)]
        runner.run(steps)
        results = {step.name: load_artifact(runner.output_path_for(step)).result for step in steps}
        folders = {step.name: Path(runner.output_path_for(step)) for step in steps}
        outputs.append(({name: output_bytes(folder) for name, folder in folders.items()},
                        {name: folder.name for name, folder in folders.items()}, results))
    (tiny, tiny_names, _), (huge, huge_names, results) = outputs
    assert tiny == huge and tiny_names == huge_names  # same bytes, and the settings are not in the identity
    # The comparison is not between empty outputs: each step removed or cut something.
    assert results["dedup/exact"]["summary"]["removed"]["exact-duplicate"]["documents"] == 8
    assert results["dedup/fuzzy"]["summary"]["removed"]["near-duplicate"]["documents"] >= 10
    assert results["dedup/lines"]["details"]["lines_removed"] >= 60


def test_components_of_a_chain_across_partitions_keep_the_smallest_id(tmp_path):
    """d-c, c-b, b-a, and x-y apart: labels travel the chain in rounds, a message run per record."""
    from marin.curation.dedup.components import component_decisions

    def edge(member: str, root: str, similarity: float) -> dict:
        return {"id": member, "file": 0, "position": ord(member), "root": root, "root_file": 0,
                "root_position": ord(root), "similar_to": root, "similarity": similarity}

    files = []
    for i, edges in enumerate([[edge("d", "c", 0.9), edge("c", "c", 0.9)], [edge("c", "b", 0.8)],
                               [edge("b", "a", 0.75), edge("y", "x", 0.95)]]):
        files.append(str(tmp_path / f"edges-{i}.jsonl"))
        Path(files[-1]).write_text("".join(json.dumps(e) + "\n" for e in edges))
    Path(tmp_path / "edges-empty.jsonl").write_text("")
    decisions, counters = component_decisions(files + [str(tmp_path / "edges-empty.jsonl")], str(tmp_path / "work"),
                                              "inline", 3, SpillSettings(record_buffer=1))
    found = {chr(d.position): d.attributes for d in decisions.collect(backend="inline")}
    assert {node: a["cluster"] for node, a in found.items()} == {**dict.fromkeys("abcd", "a"), "x": "x", "y": "x"}
    assert [node for node, a in sorted(found.items()) if a.get("kept") is False] == ["b", "c", "d", "y"]
    assert (found["d"]["similar_to"], found["d"]["similarity"]) == ("c", 0.9)
    assert counters["components/rounds"] >= 2  # d learns of a only through c and b
