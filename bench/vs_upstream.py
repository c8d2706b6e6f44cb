"""Side by side with upstream Marin (its packages on PyPI): the same work through each side's own code.

Upstream installs the same import names as ours (``marin``, ``levanter``, ``haliax``), so it lives
in an interpreter of its own, named by ``--upstream-python``. Each comparison runs each side in a
fresh process, alternating (ours, upstream, ours, ...) ``--repeats`` times so that the load of a
shared machine falls on both alike, and reports medians. A side is a small script under
``bench/vs_upstream_sides/`` (upstream's import only upstream's packages and the standard library)
that prints one JSON line with what it timed; this process adds each run's CPU seconds (``wait4``:
the process and the children it waited for) and peak resident memory (the largest ``VmHWM`` of the
process and its descendants, read every 50 ms).

Comparisons (``--only NAME,...``; a name that is no comparison's selects those it begins, e.g.
``train`` or ``engine``):

* ``train_a``, ``train_a_defaults``: training tokens/s, 4 layers, hidden 128, vocabulary 50,257,
  sequence 256, batch 8, f32, Llama, AdamW with clipping; ``train_nano``, ``train_nano_defaults``:
  the shape of ``experiments.llama.llama_nano``, sequence 512, batch 4. The plain variants run both
  with unrolled layers and no rematerialisation; ``_defaults`` each at its own defaults (upstream
  scans its layers with checkpointing and watches gradients every 10 steps). Parameter counts must
  be equal or the comparison is refused.
* ``minhash``: MinHash signatures and LSH bands at upstream's own benchmark's work
  (``bench/dedup_throughput.py``'s kernel comparison, reused).
* ``exact_keys``: exact-duplicate keys at equal work (the same normalisation, then BLAKE2b);
  ``exact_keys_own``: each side's own key (not equal work: upstream hashes the raw text with xxh3).
* ``tokenize``: the GPT-2 tokenizer into a token cache, each side's own cache builder, 10,000
  TinyStories documents (``--tokenize-100k`` adds 100,000).
* ``engine_300``, ``engine_3000``: that many trivial steps under one root through each side's own
  ``StepRunner``: the first run and the all-cached rerun (the median of five in each process: one
  takes milliseconds), ms per step (``--engine-30k`` adds 30,000 steps: about twelve minutes a
  repeat, most of it upstream's first run).

Speed ratios are ours over upstream's throughput (>= 1: ours is faster); memory ratios ours over
upstream's peak RSS (<= 1: ours uses less). Each comparison needs some of upstream's packages
(training: ``marin-levanter`` and ``marin-haliax``; MinHash and exact keys: ``marin-dupekit``;
tokenizing and the engine: ``marin-core``): those the upstream interpreter lacks are skipped, each
named with what it lacks. Without a usable ``--upstream-python``, or when it can run none of the
chosen comparisons, it prints how to make one and exits 0.

Usage: ``python bench/vs_upstream.py --upstream-python /tmp/upstream-venv/bin/python [--repeats 3]
[--only train_a,minhash] [--json] [--tiny]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
SIDES = BENCH / "vs_upstream_sides"
# The shared sample: under MARIN_TEST_DATA when set (a worktree has no shared/ beside it), else beside the checkout.
SHARED = Path(os.environ.get("MARIN_TEST_DATA") or ROOT.parent / "shared")
STORIES = SHARED / "data" / "tinystories" / "train.jsonl"
GPT2 = SHARED / "tokenizers" / "gpt2"
sys.path.insert(0, str(BENCH))  # dedup_throughput's corpus and dupekit worker are reused
from process_sampler import tree_pids  # noqa: E402

UPSTREAM_PACKAGES = ("marin-core", "marin-levanter", "marin-haliax", "marin-dupekit")
TRAINING_PACKAGES = ("marin-levanter", "marin-haliax")
MAKE_UPSTREAM_ENV = (
    "/root/.pyenv/versions/3.12.1/bin/python -m venv /tmp/upstream-venv",
    "/tmp/upstream-venv/bin/pip install marin-levanter marin-haliax marin-core marin-dupekit",
)


# -- running one side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One side's run: the JSON line it printed, its CPU seconds and its peak resident memory."""

    record: dict
    cpu_s: float
    peak_rss_mib: float


class SideFailed(RuntimeError):
    """A side's process failed, timed out or printed no JSON line."""


def run_side(argv: list[str], *, env: dict[str, str], cwd: str, timeout: float) -> Run:
    """Run ``argv`` to its end (its process group killed after ``timeout`` seconds): its last JSON line and usage."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True)
        deadline, peak_kib, tree, next_scan = time.monotonic() + timeout, 0, [process.pid], 0.0
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            now = time.monotonic()
            if now > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                os.wait4(process.pid, 0)
                process.returncode = -signal.SIGKILL
                raise SideFailed(f"{' '.join(argv[:3])} ... ran past its {timeout:.0f} s timeout and was killed")
            if now >= next_scan:  # the tree rarely changes: a /proc scan four times a second
                tree, next_scan = tree_pids(process.pid), now + 0.25
            peak_kib = max(peak_kib, *map(high_water_kib, tree))
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise SideFailed(f"{' '.join(argv[:3])} ... exited {process.returncode}:\n{(stdout + stderr)[-3000:]}")
    return Run(json.loads(lines[-1]), usage.ru_utime + usage.ru_stime, peak_kib / 1024)


def high_water_kib(pid: int) -> int:
    """``VmHWM`` of ``pid``: the peak resident size of its own memory since it started its program.

    Not ``wait4``'s ``ru_maxrss``: Linux carries that across ``exec``, so a child forked from this
    (large) process would start at this process's size.
    """
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next((int(line.split()[1]) for line in handle if line.startswith("VmHWM:")), 0)
    except (OSError, ValueError):
        return 0


def side_env(scratch: str) -> dict[str, str]:
    """The environment of both sides: CPU JAX on the real device count, offline, scratch under ``scratch``."""
    # No persistent compilation cache: each run's compile time is a real compile.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", TMPDIR=scratch, MARIN_PREFIX=os.path.join(scratch, "prefix"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    return env


def run_alternately(comparison: Comparison, interpreters: dict[str, list[str]], folder: str,
                    repeats: int) -> dict[str, list[Run]]:
    """Ours, upstream, ours, upstream, ...: so that both see the same load. Each run in a scratch folder of its own."""
    runs: dict[str, list[Run]] = {"ours": [], "upstream": []}
    for repeat in range(repeats):
        for side in ("ours", "upstream"):
            argv = interpreters[side] + (comparison.ours if side == "ours" else comparison.upstream)
            with tempfile.TemporaryDirectory(dir=folder) as scratch:
                runs[side].append(run_side(argv, env=side_env(scratch), cwd=scratch, timeout=comparison.timeout))
            print(f"{comparison.name} {repeat + 1}/{repeats} {side}: {runs[side][-1].record}", file=sys.stderr, flush=True)
    return runs


# -- what is compared ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """A figure both sides report: ``value`` reads it from a side's JSON line."""

    name: str
    unit: str
    value: Callable[[dict], float]
    higher_is_better: bool = True


@dataclass(frozen=True)
class Comparison:
    """One kind of work, each side's command line (after its interpreter) and the figures compared."""

    name: str
    ours: list[str]
    upstream: list[str]
    metrics: tuple[Metric, ...]
    work: str
    same: tuple[str, ...] = ()  # keys of the JSON lines that must agree, or the comparison is refused
    timeout: float = 900.0
    needs: tuple[str, ...] = UPSTREAM_PACKAGES  # upstream's distributions its upstream side imports


def per_second(count_key: str) -> Callable[[dict], float]:
    return lambda record: record[count_key] / record["seconds"]


def ms_per_step(seconds_key: str) -> Callable[[dict], float]:
    return lambda record: 1000 * record[seconds_key] / record["steps"]


TRAIN_A = dict(layers=4, hidden=128, intermediate=512, heads=4, kv_heads=4, vocab=50257, seq_len=256, batch=8)
TRAIN_TINY = dict(layers=2, hidden=32, intermediate=64, heads=2, kv_heads=2, vocab=1000, seq_len=32, batch=2)
# Timed steps follow warm-up steps; upstream's defaults compile a second step (its watch) at step 10.
STEPS = {"unrolled": (3, 20), "defaults": (12, 20)}
FACTS = ("parameters", "layout", "scan_layers", "remat", "gradient_checkpointing", "documents", "distinct_keys",
         "tokens", "steps", "work", "version")


def nano_shape() -> dict:
    sys.path.insert(0, str(ROOT))
    from experiments.llama import llama_nano

    return dict(layers=llama_nano.num_layers, hidden=llama_nano.hidden_dim, intermediate=llama_nano.intermediate_dim,
                heads=llama_nano.num_heads, kv_heads=llama_nano.num_kv_heads, vocab=50257, seq_len=512, batch=4,
                tied=llama_nano.tie_word_embeddings)


def train_comparison(name: str, shape: dict, layout: str, tiny: bool) -> Comparison:
    warmup, steps = STEPS[layout]
    if tiny:
        warmup, steps = min(warmup, 2) if layout == "unrolled" else warmup, 3
    shape = {**shape, "steps": steps, "warmup_steps": warmup}
    argv = [f"--{key.replace('_', '-')}={value}" for key, value in shape.items() if key != "tied"]
    argv += ["--tied"] if shape.get("tied") else []
    argv += [f"--layout={layout}"]
    return Comparison(
        name, [str(SIDES / "ours_train.py"), *argv], [str(SIDES / "upstream_train.py"), *argv],
        (Metric(name, "tokens/s", lambda r: r["tokens_per_s"]),),
        f"{shape['layers']} layers, hidden {shape['hidden']}, vocabulary {shape['vocab']}, sequence {shape['seq_len']}, "
        f"batch {shape['batch']}, f32, AdamW + clipping at 1.0; {warmup} warm-up then {steps} timed steps; "
        + ("both unrolled, no remat" if layout == "unrolled" else "each side's default layer layout and trainer"),
        same=("parameters",), timeout=1800, needs=TRAINING_PACKAGES)


def plan(args: argparse.Namespace, inputs: dict[str, str]) -> list[Comparison]:
    """Every comparison, at the sizes ``args`` asks for, on the input files in ``inputs``."""
    from dedup_throughput import DUPEKIT_WORKER, KERNEL_WORK

    train_a, nano = (TRAIN_TINY, TRAIN_TINY) if args.tiny else (TRAIN_A, nano_shape())
    found = [train_comparison("train_a", train_a, "unrolled", args.tiny),
             train_comparison("train_a_defaults", train_a, "defaults", args.tiny),
             train_comparison("train_nano", nano, "unrolled", args.tiny),
             train_comparison("train_nano_defaults", nano, "defaults", args.tiny)]
    found.append(Comparison(
        "minhash", [str(BENCH / "dedup_throughput.py"), "--kernel-worker", inputs["texts"]],
        ["-c", DUPEKIT_WORKER, inputs["texts"], json.dumps(KERNEL_WORK)],
        (Metric("minhash", "docs/s", per_second("documents")),),
        "character 5-grams, 286 permutations, 26 bands x 11 rows, batches of 512 texts in memory; each side "
        "normalises its own way first (ours: NFKC + lower case + whitespace; dupekit: CleanText)", same=("documents",),
        needs=("marin-dupekit",)))
    for work, name in (("equal", "exact_keys"), ("own", "exact_keys_own")):
        found.append(Comparison(
            name, [str(SIDES / "ours_data.py"), "exact-keys", inputs["texts"], f"--work={work}"],
            [str(SIDES / "upstream_data.py"), "exact-keys", inputs["texts"], f"--work={work}"],
            (Metric(name, "docs/s", per_second("documents")),),
            "equal: both normalise with the same definition (NFKC, lower case, whitespace runs to one space) inside the "
            "timed region, then BLAKE2b (ours hashlib, 128-bit digest; upstream dupekit over Arrow batches, 512-bit)"
            if work == "equal" else "NOT equal work: each side's own exact-document key (ours normalise + BLAKE2b-128; "
            "upstream xxh3-128 of the raw text)", same=("documents", "distinct_keys"), needs=("marin-dupekit",)))
    for docs_key, name in (("docs", "tokenize"), ("docs_100k", "tokenize_100k")):
        if docs_key in inputs:
            found.append(Comparison(
                name, [str(SIDES / "ours_data.py"), "tokenize", inputs[docs_key], str(GPT2)],
                [str(SIDES / "upstream_data.py"), "tokenize", inputs[docs_key], str(GPT2)],
                (Metric(name, "docs/s", per_second("documents")),),
                "the same jsonl of TinyStories documents, GPT-2 tokenizer, each side's own cache builder end to end "
                "(tokens differ only by the special tokens each appends)", same=("documents",), needs=("marin-core",)))
    for count in (5, 20) if args.tiny else (300, 3000, 30000) if args.engine_30k else (300, 3000):
        found.append(Comparison(
            f"engine_{count}", [str(SIDES / "ours_engine.py"), f"--steps={count}"],
            [str(SIDES / "upstream_engine.py"), f"--steps={count}"],
            (Metric(f"engine_{count}_first", "ms/step", ms_per_step("first_s"), higher_is_better=False),
             Metric(f"engine_{count}_rerun", "ms/step", ms_per_step("rerun_s"), higher_is_better=False)),
            f"{count} trivial steps and one root depending on them, the root given to a fresh StepRunner at its default "
            "concurrency; first run, then all cached (the median of five reruns, each a fresh runner on the DAG declared "
            "again)", same=("steps",), timeout=max(900.0, count * 0.06), needs=("marin-core",)))
    return found


def select(comparisons: list[Comparison], only: str | None) -> list[Comparison]:
    if not only:
        return comparisons
    names = [c.name for c in comparisons]
    chosen = []
    for wanted in only.split(","):
        matches = [c for c in comparisons if c.name == wanted] or [c for c in comparisons if c.name.startswith(wanted)]
        if not matches:
            raise SystemExit(f"--only {wanted!r} names no comparison; choose from {', '.join(names)}")
        chosen += [c for c in matches if c not in chosen]
    return chosen


# -- medians and ratios ----------------------------------------------------------------------------


def ratio(ours: float, upstream: float, *, higher_is_better: bool) -> float:
    """Ours against upstream, >= 1 when ours is better for a throughput; for a cost (ms/step) the inverse."""
    return ours / upstream if higher_is_better else upstream / ours


def summarise(comparison: Comparison, runs: dict[str, list[Run]]) -> list[dict]:
    """The comparison's figures (each a median over its runs) and a peak-memory figure, as JSON objects."""
    first = {side: runs[side][0].record for side in runs}
    differing = [key for key in comparison.same if first["ours"].get(key) != first["upstream"].get(key)]
    refused = "; ".join(f"{key} differ: ours {first['ours'].get(key)}, upstream {first['upstream'].get(key)}"
                        for key in differing) or None

    def details(side: str, metric: Metric | None) -> dict:
        got = runs[side]
        compile_s = [r.record["first_step_s"] for r in got if "first_step_s" in r.record]
        return {"runs": [_significant(metric.value(r.record)) if metric else round(r.peak_rss_mib, 1) for r in got],
                "cpu_s": round(statistics.median(r.cpu_s for r in got), 2),
                "peak_rss_mib": round(statistics.median(r.peak_rss_mib for r in got), 1),
                **({"compile_s": round(statistics.median(compile_s), 2)} if compile_s else {}),
                **{key: first[side][key] for key in FACTS if key in first[side]}}

    found = []
    for metric in comparison.metrics:
        ours, upstream = (statistics.median(metric.value(r.record) for r in runs[side]) for side in ("ours", "upstream"))
        compared = None if refused else round(ratio(ours, upstream, higher_is_better=metric.higher_is_better), 3)
        found.append({"name": metric.name, "kind": "speed", "unit": metric.unit, "ours": _significant(ours),
                      "upstream": _significant(upstream), "ratio": compared,
                      "better": "higher" if metric.higher_is_better else "lower"})
    ours_rss, upstream_rss = (statistics.median(r.peak_rss_mib for r in runs[side]) for side in ("ours", "upstream"))
    found.append({"name": f"{comparison.name}_peak_rss", "kind": "memory", "unit": "MiB", "ours": round(ours_rss, 1),
                  "upstream": round(upstream_rss, 1), "ratio": None if refused else round(ours_rss / upstream_rss, 3),
                  "better": "lower"})
    metrics = {m.name: m for m in comparison.metrics}
    for entry in found:
        metric = metrics.get(entry["name"])
        entry.update(repeats=len(runs["ours"]), work=comparison.work, ours_details=details("ours", metric),
                     upstream_details=details("upstream", metric), **({"refused": refused} if refused else {}))
    return found


# -- the environment ---------------------------------------------------------------------------------


def upstream_versions(python: str | None) -> dict[str, str] | None:
    """The versions of upstream's packages installed in ``python`` (those it lacks are left out) and
    its Python's, or None when the interpreter is missing or does not run."""
    if not python or not os.path.exists(python):
        return None
    code = ("import json, importlib.metadata as m, sys\n"
            f"found = {{'python': sys.version.split()[0]}}\nfor p in {list(UPSTREAM_PACKAGES)!r}:\n"
            "    try: found[p] = m.version(p)\n    except m.PackageNotFoundError: pass\nprint(json.dumps(found))")
    try:
        done = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return json.loads(done.stdout) if done.returncode == 0 else None


def machine() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def our_versions() -> dict[str, str]:
    from importlib.metadata import version

    found = {"marin": version("marin"), "python": platform.python_version()}
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=30)
        found["commit"] = done.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        found["commit"] = "unknown"
    return found


def document_counts(args: argparse.Namespace) -> dict[str, int]:
    """The tokenize comparisons' inputs: each jsonl's key and how many documents it holds."""
    return {"docs": 200 if args.tiny else 10_000, **({"docs_100k": 100_000} if args.tokenize_100k else {})}


def input_paths(folder: Path, args: argparse.Namespace) -> dict[str, str]:
    """Where ``write_inputs`` puts each input (the texts of the dedup comparisons, the tokenize documents)."""
    return {"texts": str(folder / "texts.json"), **{key: str(folder / f"{key}.jsonl") for key in document_counts(args)}}


def write_inputs(folder: Path, args: argparse.Namespace) -> dict[str, str]:
    """The texts of the dedup comparisons (a JSON list) and the tokenize documents (jsonl), shared by both sides."""
    from dedup_throughput import kernel_corpus

    inputs = input_paths(folder, args)
    with open(inputs["texts"], "w") as handle:
        json.dump(kernel_corpus(200 if args.tiny else args.kernel_docs), handle)
    stories = [json.loads(line)["text"] for line in STORIES.read_text().splitlines()]
    for key, count in document_counts(args).items():
        with open(inputs[key], "w") as handle:
            handle.writelines(json.dumps({"text": stories[i % len(stories)]}) + "\n" for i in range(count))
    return inputs


# -- output ------------------------------------------------------------------------------------------


def table(results: list[dict], environment: dict) -> str:
    up, ours = environment["upstream"], environment["ours"]
    lines = [f"upstream: {', '.join(f'{k} {v}' for k, v in up.items())}",
             f"ours: {', '.join(f'{k} {v}' for k, v in ours.items())}",
             f"machine: {environment['machine']['cpu']}, {environment['machine']['cores']} cores, load average "
             f"{environment['machine']['load_average_at_start']} at start, {environment['load_average_at_end']} at end",
             *(f"skipped {name}: {reason}" for name, reason in environment.get("skipped", {}).items()),
             "",
             "| comparison | unit | ours | upstream | ratio | CPU s ours / upstream | compile s ours / upstream |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        o, u = r["ours_details"], r["upstream_details"]
        shown = "refused" if r["ratio"] is None else f"{r['ratio']:.2f}"
        compile_s = f"{o['compile_s']} / {u['compile_s']}" if "compile_s" in o and r["kind"] == "speed" else ""
        cpu = f"{o['cpu_s']} / {u['cpu_s']}" if r["kind"] == "speed" else ""
        lines.append(f"| {r['name']} | {r['unit']} | {_figure(r['ours'])} | {_figure(r['upstream'])} | {shown} | {cpu} | {compile_s} |")
    lines.append("")
    for r in results:
        if r["kind"] == "memory":
            continue
        o, u = r["ours_details"], r["upstream_details"]
        lines.append(f"{r['name']}: {r['work']}.")
        if "refused" in r:
            lines.append(f"  REFUSED: {r['refused']}")
        for side, d in (("ours", o), ("upstream", u)):
            facts = ", ".join(f"{k} {d[k]}" for k in FACTS if k in d and k != "work")
            lines.append(f"  {side}: runs {d['runs']}{'; ' + facts if facts else ''}{'; ' + d['work'] if 'work' in d else ''}")
    return "\n".join(lines)


def _significant(value: float) -> float:
    """``value`` to three decimals, and to four significant figures below one (a cached rerun costs
    thousandths of a millisecond per step)."""
    return round(value, 3) if abs(value) >= 1 else float(f"{value:.4g}")


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def missing_packages(comparison: Comparison, versions: dict[str, str]) -> list[str]:
    """Upstream's packages ``comparison`` needs that the upstream interpreter lacks."""
    return [package for package in comparison.needs if package not in versions]


def skipped_reason(missing: list[str], python: str) -> str:
    return f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed in {python}"


def explain_setup(python: str | None, skipped: list[tuple[Comparison, list[str]]] = ()) -> str:
    lacking = sorted({package for _, missing in skipped for package in missing})
    reason = ("no --upstream-python given" if not python else
              f"{python} does not exist or does not run" if not skipped else
              f"{python} lacks {', '.join(lacking)}, which every chosen comparison needs")
    return (f"Nothing compared: {reason}. Upstream Marin must live in an environment of its own (it installs the same "
            "import names as ours). Make one with:\n\n    " + "\n    ".join(MAKE_UPSTREAM_ENV) +
            "\n\nthen run:  python bench/vs_upstream.py --upstream-python /tmp/upstream-venv/bin/python")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream-python", help="an interpreter with upstream's packages (without one: how to make it)")
    parser.add_argument("--ours-python", default=sys.executable)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated comparison names (or their beginnings: train, engine)")
    parser.add_argument("--json", action="store_true", help="one JSON object per comparison instead of the table")
    parser.add_argument("--kernel-docs", type=int, default=20000, help="texts for minhash and exact_keys")
    parser.add_argument("--tokenize-100k", action="store_true", help="also tokenize 100,000 documents")
    parser.add_argument("--engine-30k", action="store_true", help="also run the engine on 30,000 steps (about 12 minutes a repeat)")
    parser.add_argument("--tiny", action="store_true", help="smoke-test sizes: checks the plumbing, the figures mean nothing")
    args = parser.parse_args(argv)

    versions = upstream_versions(args.upstream_python)
    if versions is None:
        print(explain_setup(args.upstream_python))
        return 0
    # Chosen on the inputs' paths; they are written once something is known to run.
    chosen = select(plan(args, input_paths(Path("inputs"), args)), args.only)
    skipped = [(c, missing) for c in chosen if (missing := missing_packages(c, versions))]
    if len(skipped) == len(chosen):
        print(explain_setup(args.upstream_python, skipped))
        return 0
    for comparison, missing in skipped:
        print(f"{comparison.name} skipped: {skipped_reason(missing, args.upstream_python)}", file=sys.stderr, flush=True)
    environment = {"upstream": versions, "ours": our_versions(), "machine": machine(),
                   "skipped": {c.name: skipped_reason(missing, args.upstream_python) for c, missing in skipped}}
    results = []
    with tempfile.TemporaryDirectory(prefix="vs-upstream-") as folder:
        inputs = write_inputs(Path(folder), args)
        interpreters = {"ours": [args.ours_python], "upstream": [args.upstream_python, "-I"]}
        planned = {c.name: c for c in plan(args, inputs)}
        for comparison in [planned[c.name] for c in chosen if c.name not in environment["skipped"]]:
            try:
                runs = run_alternately(comparison, interpreters, folder, args.repeats)
            except SideFailed as failure:
                print(f"{comparison.name}: {failure}", file=sys.stderr, flush=True)
                results.append({"name": comparison.name, "kind": "speed", "ours": None, "upstream": None, "ratio": None,
                                "repeats": args.repeats, "error": str(failure)[-2000:]})
                continue
            results.extend(summarise(comparison, runs))
    environment["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        for name, reason in environment["skipped"].items():
            print(json.dumps({"name": name, "skipped": reason, "environment": environment}))
        for result in results:
            print(json.dumps({**result, "environment": environment}))
    else:
        print(table([r for r in results if "error" not in r], environment))
        for r in results:
            if "error" in r:
                print(f"\n{r['name']} FAILED: {r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
