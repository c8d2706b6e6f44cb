"""bench/vs_upstream.py without upstream's environment: it says how to make one, our sides run at tiny
sizes and print what the driver reads, medians and ratios point the right way, no child outlives its timeout."""

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SIDES = BENCH / "vs_upstream_sides"
sys.path.insert(0, str(BENCH))
import vs_upstream  # noqa: E402
from vs_upstream import Comparison, Metric, Run, SideFailed, ratio, run_side, side_env, summarise  # noqa: E402

PIP_LINE = "pip install marin-levanter marin-haliax marin-core marin-dupekit"


def run_ours(tmp_path: Path, script: str, *args: str, timeout: float = 300) -> dict:
    return run_side([sys.executable, str(SIDES / script), *args], env=side_env(str(tmp_path)), cwd=str(tmp_path),
                    timeout=timeout).record


@pytest.mark.parametrize("given", [[], ["--upstream-python", "/nonexistent/bin/python"], ["--upstream-python", sys.executable]])
def test_without_an_upstream_environment_it_prints_how_to_make_one_and_succeeds(given):
    done = subprocess.run([sys.executable, str(BENCH / "vs_upstream.py"), *given], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert PIP_LINE in done.stdout and "-m venv /tmp/upstream-venv" in done.stdout
    assert "--upstream-python /tmp/upstream-venv/bin/python" in done.stdout


def test_comparisons_the_upstream_environment_cannot_run_are_skipped_and_named(monkeypatch, capsys):
    # An environment with upstream's trainer but not its dedup kernels (dupekit has no build of
    # every release): training runs, MinHash is skipped with what it lacks.
    monkeypatch.setattr(vs_upstream, "upstream_versions",
                        lambda python: {"python": "3.11.7", "marin-levanter": "0.2.20", "marin-haliax": "0.2.20"})
    monkeypatch.setattr(vs_upstream, "write_inputs", vs_upstream.input_paths)
    ran = []

    def fake_runs(comparison, interpreters, folder, repeats):
        ran.append(comparison.name)
        return {side: [Run({"tokens_per_s": 10.0, "parameters": 7, "first_step_s": 1.0}, 1.0, 100.0)]
                for side in ("ours", "upstream")}

    monkeypatch.setattr(vs_upstream, "run_alternately", fake_runs)
    assert vs_upstream.main(["--upstream-python", "/up/python", "--tiny", "--only", "minhash,train_a", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert ran == ["train_a"]
    assert lines[0] == {"name": "minhash", "skipped": "marin-dupekit is not installed in /up/python",
                        "environment": lines[0]["environment"]}
    assert [line["name"] for line in lines[1:]] == ["train_a", "train_a_peak_rss"]

    # Nothing it can run: how to make an environment, naming what is missing.
    assert vs_upstream.main(["--upstream-python", "/up/python", "--only", "minhash,engine"]) == 0
    out = capsys.readouterr().out
    assert "Nothing compared: /up/python lacks marin-core, marin-dupekit" in out and PIP_LINE in out


def test_our_training_side_counts_the_parameters_our_config_says_and_reports_rates(tmp_path):
    from levanter.models.llama import LlamaConfig

    record = run_ours(tmp_path, "ours_train.py", "--layers=1", "--hidden=16", "--intermediate=32", "--heads=2",
                      "--kv-heads=2", "--vocab=257", "--seq-len=16", "--batch=2", "--steps=2", "--warmup-steps=1",
                      "--layout=unrolled")
    config = LlamaConfig(hidden_dim=16, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=2, max_seq_len=16)
    assert record["parameters"] == config.num_parameters(257)
    assert record["tokens_per_s"] > 0 and record["first_step_s"] > 0 and record["steps"] == 2
    assert (record["scan_layers"], record["remat"]) == (False, "none")


def test_our_exact_keys_side_finds_the_distinct_normalised_texts(tmp_path):
    texts = ["A  cat sat.", "a cat SAT.", "A dog.", "a cat sat.\n", "Another story."] * 3
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    record = run_ours(tmp_path, "ours_data.py", "exact-keys", str(tmp_path / "texts.json"))
    assert record["documents"] == 15 and record["distinct_keys"] == 3 and record["seconds"] > 0
    assert "BLAKE2b" in record["work"]


def test_our_tokenize_side_writes_the_texts_tokens_plus_one_eos_each(tmp_path, real_data):
    import tokenizers

    lines = real_data.train.read_text().splitlines()[:20]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    record = run_ours(tmp_path, "ours_data.py", "tokenize", str(tmp_path / "docs.jsonl"), str(real_data.gpt2))
    reference = tokenizers.Tokenizer.from_file(str(real_data.gpt2 / "tokenizer.json"))
    content = sum(len(reference.encode(json.loads(line)["text"]).ids) for line in lines)
    assert record["documents"] == 20 and record["tokens"] == content + 20 and record["seconds"] > 0


def test_our_engine_side_runs_then_finds_the_root_cached(tmp_path):
    record = run_ours(tmp_path, "ours_engine.py", "--steps=3")
    assert record["steps"] == 4 and record["first_s"] > 0 and record["rerun_s"] > 0


def test_our_minhash_side_is_dedup_throughputs_kernel_worker(tmp_path):
    (tmp_path / "texts.json").write_text(json.dumps([f"story number {i} about a cat and a dog" for i in range(30)]))
    done = run_side([sys.executable, str(BENCH / "dedup_throughput.py"), "--kernel-worker", str(tmp_path / "texts.json")],
                    env=side_env(str(tmp_path)), cwd=str(tmp_path), timeout=300)
    assert done.record["documents"] == 30 and done.record["seconds"] > 0
    assert done.cpu_s > 0 and done.peak_rss_mib > 10


def _run(value: float, rss: float, **record) -> Run:
    return Run({"seconds": 1.0, "documents": value, **record}, cpu_s=1.0, peak_rss_mib=rss)


def test_speed_ratio_is_ours_over_upstream_throughput_and_memory_ratio_ours_over_upstream_rss():
    assert ratio(200.0, 100.0, higher_is_better=True) == 2.0  # twice the docs/s: 2
    assert ratio(5.0, 10.0, higher_is_better=False) == 2.0  # half the ms per step: 2
    comparison = Comparison("work", [], [], (Metric("work", "docs/s", lambda r: r["documents"] / r["seconds"]),), "w")
    runs = {"ours": [_run(300, 100), _run(100, 120), _run(200, 110)],
            "upstream": [_run(50, 400), _run(100, 380), _run(400, 420)]}
    speed, memory = summarise(comparison, runs)
    assert (speed["kind"], speed["ours"], speed["upstream"], speed["ratio"], speed["repeats"]) == ("speed", 200, 100, 2.0, 3)
    assert speed["ours_details"]["runs"] == [300, 100, 200]
    assert (memory["kind"], memory["name"], memory["ours"], memory["upstream"]) == ("memory", "work_peak_rss", 110, 400)
    assert memory["ratio"] == pytest.approx(110 / 400, abs=1e-3)


def test_a_cost_per_step_is_compared_the_other_way_round():
    comparison = Comparison("engine", [], [], (Metric("engine_first", "ms/step", vs_upstream.ms_per_step("first_s"),
                                                      higher_is_better=False),), "w")
    runs = {"ours": [Run({"steps": 10, "first_s": 0.1}, 1.0, 100)], "upstream": [Run({"steps": 10, "first_s": 0.4}, 1.0, 100)]}
    speed, _ = summarise(comparison, runs)
    assert (speed["ours"], speed["upstream"], speed["ratio"], speed["better"]) == (10, 40, 4.0, "lower")


def test_different_parameter_counts_refuse_the_comparison():
    comparison = Comparison("train", [], [], (Metric("train", "tokens/s", lambda r: r["tokens_per_s"]),), "w",
                            same=("parameters",))
    runs = {"ours": [Run({"tokens_per_s": 10.0, "parameters": 100}, 1.0, 100)],
            "upstream": [Run({"tokens_per_s": 5.0, "parameters": 101}, 1.0, 100)]}
    for entry in summarise(comparison, runs):
        assert entry["ratio"] is None and "parameters differ: ours 100, upstream 101" in entry["refused"]
    assert "refused" in vs_upstream.table(summarise(comparison, runs), {
        "upstream": {}, "ours": {}, "machine": {"cpu": "x", "cores": 1, "load_average_at_start": []},
        "load_average_at_end": []})


def test_a_side_that_outlives_its_timeout_is_killed(tmp_path):
    started = time.monotonic()
    with pytest.raises(SideFailed, match="timeout"):
        run_side([sys.executable, "-c", "import time; time.sleep(60)"], env=side_env(str(tmp_path)), cwd=str(tmp_path),
                 timeout=1)
    assert time.monotonic() - started < 20


def test_every_subprocess_the_benchmark_starts_has_a_timeout():
    files = [BENCH / "vs_upstream.py", BENCH / "tpu_vs_upstream.py", *sorted(SIDES.glob("*.py"))]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess":
                if node.func.attr == "Popen":  # only run_side starts one, and it kills it at its deadline
                    assert path.name == "vs_upstream.py", f"{path.name}:{node.lineno} starts a Popen"
                else:
                    assert any(k.arg == "timeout" for k in node.keywords), f"{path.name}:{node.lineno} has no timeout"


def test_upstream_sides_import_only_upstream_packages_and_the_standard_library():
    # upstream_loop is the sides' own helper, itself held to this rule by the loop below.
    allowed = {"dupekit", "pyarrow", "marin", "levanter", "haliax", "equinox", "jax", "jmp", "numpy", "upstream_loop"}
    for path in sorted(SIDES.glob("upstream_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_only_selects_by_name_or_by_beginning(tmp_path):
    args = vs_upstream.argparse.Namespace(tiny=True, kernel_docs=10, tokenize_100k=False)
    comparisons = vs_upstream.plan(args, {"texts": "t.json", "docs": "d.jsonl"})
    assert [c.name for c in comparisons] == ["train_a", "train_a_defaults", "train_nano", "train_nano_defaults", "minhash",
                                             "exact_keys", "exact_keys_own", "tokenize", "engine_5", "engine_20"]
    assert [c.name for c in vs_upstream.select(comparisons, "train_a,engine")] == ["train_a", "engine_5", "engine_20"]
    with pytest.raises(SystemExit, match="names no comparison"):
        vs_upstream.select(comparisons, "nothing")
