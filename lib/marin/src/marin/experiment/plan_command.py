"""``marin plan SCRIPT.py [STEP ...]``: compile each training step for the TPU pod its resources name,
on this machine, and say whether it fits (:mod:`marin.experiment.plan`).

The script runs as ``marin run --dry-run`` would run it: its steps are declared, none runs, and
nothing is written under the prefix. The prefix is only read, for the vocabulary of the datasets'
tokenizers where their tokenize steps have run; ``--vocab-size`` gives it otherwise.

Exit status: 0 when every step planned fits, or there was nothing to compile (no training step, or
steps on GPUs or CPUs); 1 when a step does not fit; 2 when the script or a step cannot be planned.
Progress (a line per compile, and every 30 s while one lasts) goes to stderr; ``--json`` prints one
JSON object per step on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rigging.config.discovery import discover_config

from marin.execution.command_line.commands import script_settings
from marin.execution.planning.run_defaults import RunOverrides
from marin.execution.running.script_launch import declared_steps

# JAX, levanter and the planner are imported when a plan is asked for, not whenever `marin` starts.

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_USAGE = 2
GIB = 2**30
NOT_A_TPU = "compiling ahead is for TPUs (libtpu compiles for a TPU topology without the chips); nothing to plan"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="compile each training step for the TPU pod its resources name, here, and say whether it fits",
        description="Declare SCRIPT.py's steps as `marin run --dry-run` would (nothing runs, nothing is written), and "
        "compile each training step (train_lm, sft, dpo) on with_tpu(...) resources for that pod's devices on this "
        "machine: memory per chip, FLOPs and collectives per step, and whether it fits; a step that does not fit gets "
        "a change that does, planned too. Exit 0: fits; 1: does not fit; 2: cannot plan.",
    )
    parser.add_argument("script", help="the experiment script, as given to marin run")
    parser.add_argument("steps", nargs="*", metavar="STEP", help="the training steps to plan, by name (default: all)")
    parser.add_argument("--json", action="store_true", help="print one JSON object per step")
    parser.add_argument("--vocab-size", type=int, metavar="N",
                        help="the tokenizer's vocabulary, where the datasets' tokenize steps have not run under the prefix")
    parser.add_argument("--prefix", help="where to read finished tokenize steps (default: as marin run finds it)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME.KEY=VALUE", help="as for marin run")
    parser.add_argument("--config", dest="config_files", action="append", default=[], metavar="NAME=FILE.yaml", help="as for marin run")
    parser.set_defaults(handler=plan_command)


def plan_command(args: argparse.Namespace) -> int:
    from levanter.errors import LevanterError

    from marin.errors import MarinError
    from marin.experiment.plan import PlanError
    from marin.experiment.train import training_request_of

    script = Path(args.script)
    if not script.is_file():
        return _refuse(f"no such script {script}")
    settings, config_files, problem = script_settings(args)
    if problem:
        return _refuse(problem)
    if args.vocab_size is not None and args.vocab_size < 1:
        return _refuse("--vocab-size must be a positive number of tokens")
    overrides = RunOverrides(prefix=discover_config(prefix=args.prefix).prefix if args.prefix else None, dry_run=True,
                             settings=settings, config_files=config_files)
    try:
        declared, launched = declared_steps(script, getattr(args, "passthrough", []), overrides)
    except (MarinError, LevanterError) as exc:  # refused as the script declared its steps
        return _refuse(str(exc))
    unread = launched.unread_config_names()
    if unread:
        return _refuse(f"settings were given for {', '.join(unread)}, which {script} never read")
    training = [(runner, spec, training_request_of(spec)) for runner, spec in declared]
    training = [entry for entry in training if entry[2] is not None]
    names = sorted({spec.name for _, spec, _ in training})
    unknown = [name for name in args.steps if name not in names]
    if unknown:
        return _refuse(f"{script} declares no training step {', '.join(map(repr, unknown))}; its training steps are: "
                       f"{', '.join(names) or 'none'}")
    chosen = [entry for entry in training if not args.steps or entry[1].name in args.steps]
    if not chosen:
        print(f"{script} declares no training step (train_lm, sft, dpo): nothing to plan.")
        return EXIT_FITS
    worst = EXIT_FITS
    for runner, spec, request in chosen:
        try:
            record = _plan_one(runner, spec, request, args.vocab_size)
        except (PlanError, LevanterError) as exc:
            return _refuse(str(exc))
        print(json.dumps(record) if args.json else "\n".join(_describe(record)), flush=True)
        if record.get("fits") is False:
            worst = EXIT_DOES_NOT_FIT
    return worst


def _plan_one(runner: Any, spec: Any, request: Any, vocab_size: int | None) -> dict[str, Any]:
    from levanter.trainer.mesh_choice import resource_devices

    from marin.experiment.plan import find_fitting_change, plan_step, pod_of

    pod = pod_of(spec.resources)
    if pod is None:
        return {"step": spec.name, "resources": resource_devices(spec.resources).resources, "planned": False,
                "fits": None, "reason": NOT_A_TPU}
    vocab = vocab_size or _vocab_of_datasets(runner, spec, request)
    with _progress(f"{spec.name}: compiling for {pod.topology}" + (f" x {pod.slices} slices" if pod.slices > 1 else "")
                   + f" ({pod.chips} chips, mesh {request.trainer.mesh.describe()})"):
        plan = plan_step(spec.name, request, spec.resources, vocab)
    change = None
    if not plan.fits:
        def announce(settings: dict[str, Any]) -> None:
            _say(f"{spec.name}: does not fit; planning {', '.join(f'{k}={v!r}' for k, v in settings.items())}")

        with _progress(f"{spec.name}: looking for a change that fits"):
            change = find_fitting_change(plan, spec.resources, on_try=announce)
    return _record(plan, change)


def _vocab_of_datasets(runner: Any, spec: Any, request: Any) -> int:
    """The vocabulary of the datasets' tokenizer, read from their finished tokenize steps (read only)."""
    from marin.execution.artifact import load_artifact
    from marin.execution.records.executor_files import STATUS_SUCCESS, read_status
    from marin.experiment.plan import PlanError
    from marin.processing.tokenize import TokenizedDataset

    sizes, missing = set(), []
    for handle in request.weights:
        output = runner.output_path_for(handle)
        status = read_status(output)
        if status is None or status.status != STATUS_SUCCESS:
            missing.append(handle.name)
            continue
        sizes.add(int(load_artifact(output, TokenizedDataset).result.vocab_size))
    if missing:
        raise PlanError(
            f"Step {spec.name!r} trains with the vocabulary of {', '.join(missing)}'s tokenizer, known once that step "
            f"has run, which it has not under {runner.prefix}: run it first (marin run SCRIPT --run-only "
            f"{missing[0]}), or pass --vocab-size N (128256 for Llama 3's tokenizer and Marin's)."
        )
    return max(sizes)


def _record(plan: Any, change: Any) -> dict[str, Any]:
    """One step's plan (a :class:`marin.experiment.plan.StepPlan`) and the change that fits it, when
    it does not, as plain data: the JSON object, and what the text is written from."""
    from levanter.trainer.ahead_of_time import CompiledStep

    result, pod = plan.result, plan.pod
    model = plan.request.model
    record: dict[str, Any] = {
        "step": plan.step,
        "resources": pod.resources,
        "planned": True,
        "topology": pod.topology,
        "slices": pod.slices,
        "chips": pod.chips,
        "device_kind": result.device_kind,
        "note": "; ".join(note for note in (pod.note, plan.caveat) if note),
        "mesh": result.mesh,
        "model": type(model).__name__,
        "remat": getattr(model, "remat", None),
        "vocab_size": plan.vocab_size,
        "batch_size": plan.request.trainer.batch_size,
        "microbatch_size": plan.request.trainer.microbatch_size,
        "seq_len": plan.request.seq_len,
        "fits": plan.fits,
        "per_chip_bytes": plan.per_chip_bytes,
        "available_bytes": plan.available_bytes,
        "hbm_bytes": pod.hbm_bytes,
        "flops_per_chip": plan.flops_per_chip,
        "flops_per_step": plan.flops_per_chip * pod.chips if plan.flops_per_chip is not None else None,
        "model_flops_per_step": plan.model_flops_per_step,
        "kernels_not_counted": result.step_flops.kernels if result.step_flops is not None else {},
        "compile_seconds": round(result.compile_seconds, 1),
    }
    if isinstance(result, CompiledStep):
        memory = result.memory
        record["memory"] = {"arguments": memory.arguments, "temporaries": memory.temporaries, "outputs": memory.outputs,
                            "aliased": memory.aliased, "generated_code": memory.generated_code, "total": memory.total,
                            "peak": memory.peak}
        record["collectives"] = result.collectives.summary()
    else:
        record["refusal"] = result.message
    if not plan.fits:
        record["suggestion"] = None if change is None else {
            "change": change.settings, "text": change.describe(), "fits": change.plan.fits,
            "per_chip_bytes": change.plan.per_chip_bytes, "compile_seconds": round(change.plan.result.compile_seconds, 1)}
    return record


def _describe(record: dict[str, Any]) -> list[str]:
    """The text ``marin plan`` prints for one step."""
    if not record["planned"]:
        return [f"{record['step']}: {record['resources']}: {record['reason']}."]
    lines = [f"{record['step']}: {record['resources']}",
             f"  topology   {record['topology']}" + (f" x {record['slices']} slices" if record["slices"] > 1 else "")
             + f", {record['chips']} chips of {record['device_kind']} ({_gib(record['hbm_bytes'])} HBM each)"]
    if record["note"]:
        lines.append(f"  note       {record['note']}")
    lines.append(f"  mesh       {' x '.join(f'{axis}={size}' for axis, size in record['mesh'].items())}")
    micro = f", microbatches of {record['microbatch_size']}" if record["microbatch_size"] else ""
    lines.append(f"  step       {record['model']} (remat {record['remat']}, vocabulary {record['vocab_size']:,}), "
                 f"batch {record['batch_size']} x {record['seq_len']:,} tokens{micro}; compiled in {record['compile_seconds']} s")
    if "memory" in record:
        memory = record["memory"]
        lines.append(f"  HBM/chip   arguments {_size(memory['arguments'])}, temporaries {_size(memory['temporaries'])}, "
                     f"outputs {_size(memory['outputs'])} ({_size(memory['aliased'])} of them in place of the arguments): "
                     f"{_gib(memory['total'])} together, {_gib(record['per_chip_bytes'])} alive at the peak (XLA's count), "
                     f"of {_gib(record['hbm_bytes'])}")
    if record["flops_per_step"] is not None:
        kernels = ", ".join(f"{name} x{count}" for name, count in record["kernels_not_counted"].items())
        lines.append(f"  FLOPs      {record['flops_per_step']:.3g} per step in matmuls, {record['flops_per_chip']:.3g} per chip"
                     + (f" (Pallas kernels not counted: {kernels} per chip)" if kernels else "")
                     + (f"; the model's own count (6N + attention): {record['model_flops_per_step']:.3g}"
                        if record["model_flops_per_step"] else ""))
    if "collectives" in record:
        shown = ", ".join(f"{kind} x{entry['count']} ({_size(entry['bytes'])})" for kind, entry in record["collectives"].items())
        lines.append(f"  collectives per step on each chip: {shown or 'none'}")
    if record["fits"]:
        lines.append("  fits")
        return lines
    needed = _gib(record["per_chip_bytes"]) if record["per_chip_bytes"] is not None else "more"
    lines.append(f"  does not fit: needs {needed} of {_gib(record['available_bytes'])} per chip ({record['refusal']})")
    suggestion = record["suggestion"]
    if suggestion is None:
        lines.append("  no change tried fits (remat, smaller microbatches, a larger slice): use more chips or a smaller model")
    else:
        lines.append(f"  change     train_lm(..., {suggestion['text']}) fits: {_gib(suggestion['per_chip_bytes'])} per chip "
                     f"(planned: compiled in {suggestion['compile_seconds']} s; a new hash for the step, as the model and batch are hashed)")
    return lines


def _gib(nbytes: int | None) -> str:
    return "?" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def _size(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps a figure of at least 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


@contextlib.contextmanager
def _progress(what: str, every: float = 30.0) -> Iterator[None]:
    """``what...`` now, ``what: N s`` every ``every`` seconds while the block runs, and its time at the end."""
    started, done = time.monotonic(), threading.Event()
    _say(f"{what}...")

    def heartbeat() -> None:
        while not done.wait(every):
            _say(f"{what}: {time.monotonic() - started:.0f} s")

    thread = threading.Thread(target=heartbeat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        _say(f"{what}: done in {time.monotonic() - started:.1f} s")


def _say(line: str) -> None:
    print(f"marin plan: {line}", file=sys.stderr, flush=True)


def _refuse(message: str) -> int:
    print(f"marin plan: {message}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["plan_command", "register"]
