"""A model card from a training step's output folder: what was trained, on what, how, how well, from what.

Everything comes from files the steps already wrote: the training step's ``.artifact.json`` (the
result and its provenance), ``.executor_info`` (its hashed configuration and dependencies, which
lead to the rest of the DAG) and ``metrics.jsonl`` (the loss curves). Evaluation tables come from
eval steps that depend on the training step: the ones given, or those found under the same prefix.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from marin.errors import MarinError
from marin.execution.artifact import ArtifactError, load_artifact, register_result_type
from marin.execution.records.catalog import step_folders
from marin.execution.records.executor_files import STATUS_SUCCESS, prefix_of, read_info, read_status, recorded_dependency_paths
from marin.experiment.describe import describe_optimizer, model_family
from marin.reports.loss_plot import plot_loss_curves, read_loss_curves
from rigging import filesystem as fsx

CARD_FILE = "MODEL_CARD.md"
PLOT_FILE = "loss_curves.png"


class ReportSourceError(MarinError, ValueError):
    """The folder given to the report is not a finished training step's output."""


@dataclass(frozen=True)
class DagStep:
    name: str
    short_hash: str
    output_path: str


@dataclass(frozen=True)
class CardData:
    """What the card says, gathered from the step files (rendered by :func:`render_markdown`)."""

    name: str
    identity: str
    output_path: str
    trained: dict[str, Any]
    config: dict[str, Any]
    provenance: dict[str, Any]
    resources: str | None
    dag: list[DagStep]
    evaluations: list[tuple[str, dict[str, Any]]]
    train_curve: list[tuple[int, float]]
    validation_curves: dict[str, list[tuple[int, float]]]


@register_result_type
@dataclass(frozen=True)
class ModelCard:
    """The result of a report: where the card and its plot are, and which model they describe."""

    model: str
    model_identity: str
    markdown_path: str
    plot_path: str
    evaluations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        evals = ", ".join(self.evaluations) or "none found"
        return f"Model card for {self.model}: {self.markdown_path}\n  loss plot:   {self.plot_path}\n  evaluations: {evals}"


def _artifact_dict(output_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    artifact = load_artifact(output_path)
    provenance = artifact.provenance
    return artifact.result, {k: getattr(provenance, k) for k in ("git_commit", "git_dirty", "argv", "time", "host", "user")}


def _prefix_of(folder: str, info: dict[str, Any]) -> str | None:
    """The prefix the training step's folder lies under now (None for an explicit output path)."""
    if info.get("explicit_output_path"):
        return None
    found = prefix_of(folder, info)
    if found is not None:
        return found
    # Records of older runners carry no location: the folder is "<prefix>/<name>-<short hash>".
    suffix = f"{info['name']}-{info['short_hash']}"
    path = folder.rstrip("/")
    return path[: -len(suffix)].rstrip("/") if path.endswith("/" + suffix) else None


def _dag(info: dict[str, Any], folder: str) -> list[DagStep]:
    """The training step and everything upstream of it, each once, dependencies first."""
    seen: dict[str, DagStep] = {}

    def visit(record: dict[str, Any], where: str) -> None:
        for dep, dep_path in recorded_dependency_paths(where, record):
            if dep["identity"] not in seen and dep_path:
                dep_info = read_info(dep_path)
                if dep_info is not None:
                    visit(dep_info, dep_path)
                seen.setdefault(dep["identity"], DagStep(dep["name"], dep["identity"][:8], dep_path))
        seen.setdefault(record["identity"], DagStep(record["name"], record["short_hash"], where))

    visit(info, folder)
    return list(seen.values())


def _evaluations_of(identity: str, prefix: str | None, given: list[str] | None) -> list[str]:
    """Output folders of finished steps that depend directly on the training step ``identity``."""
    if given is not None:
        return given
    if prefix is None:
        return []
    found = []
    for folder in step_folders(prefix):
        info = read_info(folder)
        status = read_status(folder)
        if info and status and status.status == STATUS_SUCCESS and any(d["identity"] == identity for d in info.get("deps", [])):
            found.append(folder)
    return found


def collect_card(training_output: str, *, evaluations: list[str] | None = None) -> CardData:
    """Everything the card says about the ``train_lm`` step whose output folder is ``training_output``.

    ``evaluations``: output folders of eval steps to tabulate; by default, every finished step under
    the same prefix that depends on the training step and recorded eval results.
    """
    info = read_info(training_output)
    status = read_status(training_output)
    if info is None or status is None or status.status != STATUS_SUCCESS:
        state = "no step files" if info is None else f"a step that is {status.status if status else 'not started'}"
        raise ReportSourceError(
            f"{training_output} holds {state}; give the report the output folder (or step name) of a finished "
            "train_lm step (`marin status` lists them)."
        )
    try:
        trained, provenance = _artifact_dict(training_output)
    except ArtifactError as exc:
        raise ReportSourceError(f"{training_output}: cannot read its result ({exc}).") from exc
    if not isinstance(trained, dict) or "final_step" not in trained:
        raise ReportSourceError(f"{training_output} is the output of {info['name']!r}, not of a train_lm step; "
                                "reports describe trained models.")
    metrics = fsx.read_text(fsx.join(training_output, "metrics.jsonl"))
    curves = read_loss_curves(metrics.splitlines()) if metrics is not None else ([], {})
    evals, eval_steps = [], []
    if isinstance(trained.get("harness"), dict):  # train_lm(evals=...): run on the final weights while training
        evals.append((f"{info['name']} (during training, step {trained['final_step']})", trained["harness"]))
    for folder in _evaluations_of(info["identity"], _prefix_of(training_output, info), evaluations):
        eval_info = read_info(folder) or {}
        try:
            result, _ = _artifact_dict(folder)
        except ArtifactError:
            continue
        if isinstance(result, dict) and ("datasets" in result or "tasks" in result):
            evals.append((eval_info.get("name", folder), result))
            eval_steps.append(DagStep(eval_info.get("name", folder), eval_info.get("short_hash", "?"), folder))
    return CardData(
        name=info["name"], identity=info["identity"], output_path=training_output, trained=trained,
        config=info.get("hash_attrs", {}), provenance=provenance, resources=info.get("resources"),
        dag=_dag(info, training_output) + eval_steps, evaluations=evals, train_curve=curves[0], validation_curves=curves[1],
    )


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def _fmt(value: Any, spec: str = ",") -> str:
    if value is None:
        return "n/a"
    try:
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def render_markdown(card: CardData, plot_file: str = PLOT_FILE) -> str:
    """The model card as Markdown; ``plot_file`` is the loss plot's path relative to the card."""
    trained, config = card.trained, card.config
    model_config = config.get("model", {})
    family = model_family(str(trained.get("model_type", "model")), trained.get("architecture"))
    lines = [f"# Model card: {card.name}", "",
             f"A {family} language model with {_fmt(trained.get('parameters'))} parameters, trained for "
             f"{_fmt(trained.get('final_step'))} steps on {_fmt(trained.get('tokens_trained'))} tokens.", "",
             f"![Training and validation loss]({plot_file})", "", "## Model", ""]
    lines += _table(["setting", "value"], [[key, value] for key, value in model_config.items() if not key.startswith("__")]
                    + [["parameters", _fmt(trained.get("parameters"))], ["vocabulary size", _fmt(trained.get("vocab_size"))]])
    lines += ["", "## Data", ""]
    lines += _table(["dataset", "weight", "source", "training tokens", "validation tokens"],
                    [[d.get("name"), d.get("weight"), d.get("source") + (" (built-in offline corpus)" if d.get("builtin_source") else ""),
                      _fmt(d.get("train_tokens")), _fmt(d.get("validation_tokens"))] for d in trained.get("datasets", [])])
    tokenizer = trained.get("tokenizer")
    lines += ["", f"Tokenizer: `{tokenizer}`" + (" (built-in offline tokenizer)" if trained.get("builtin_tokenizer") else "")
              + f", identity `{str(trained.get('tokenizer_identity', ''))[:19]}...`, vocabulary {_fmt(trained.get('vocab_size'))}.", ""]
    seconds = trained.get("train_seconds") or 0.0
    throughput = trained.get("tokens_trained", 0) / seconds if seconds else None
    optimizer = config.get("optimizer", {})
    lines += ["## Training", ""]
    lines += _table(["", ""], [
        ["steps", _fmt(trained.get("final_step"))], ["tokens", _fmt(trained.get("tokens_trained"))],
        ["batch size x sequence length", f"{config.get('batch_size')} x {config.get('seq_len')}"],
        ["optimizer", describe_optimizer(optimizer)],
        ["optimizer settings", ", ".join(f"{k}={v}" for k, v in optimizer.items() if v is not None)],
        ["compute dtype", config.get("compute_dtype")],
        ["wall time", f"{seconds:,.1f} s"], ["throughput", f"{throughput:,.0f} tokens/s" if throughput else "n/a"],
        ["hardware", f"{card.resources or 'n/a'} on host {card.provenance.get('host') or 'n/a'}"],
        ["final training loss", _fmt(trained.get("final_train_loss"), ".4f")],
        *[[f"validation loss ({name})", _fmt(value, ".4f")] for name, value in trained.get("validation_losses", {}).items()],
    ])
    lines += ["", "## Evaluation", ""]
    if not card.evaluations:
        lines += ["No evaluation steps depend on this model yet (declare `evaluate_lm` or `evaluate_harness` steps).", ""]
    for step_name, result in card.evaluations:
        if "datasets" in result:
            lines += [f"`{step_name}` (sequence length {result.get('seq_len')}):", ""]
            lines += _table(["dataset", "loss", "perplexity", "bits/byte", "tokens", "bytes"],
                            [[name, _fmt(s["loss"], ".4f"), _fmt(s["perplexity"], ",.2f"), _fmt(s["bits_per_byte"], ".4f"),
                              _fmt(s["tokens"]), _fmt(s["bytes"])] for name, s in result["datasets"].items()])
        else:
            lines += [f"`{step_name}` (lm-eval-harness {result.get('lm_eval_version')}, limit {result.get('limit')}):", ""]
            rows = []
            for task, metrics in result["tasks"].items():
                for metric, value in metrics.items():
                    if "_stderr" not in metric:
                        stderr = metrics.get(f"{metric}_stderr")
                        rows.append([task, metric, _fmt(value, ".4f"), _fmt(stderr, ".4f"), result.get("samples", {}).get(task)])
            lines += _table(["task", "metric", "value", "stderr", "documents"], rows)
        lines.append("")
    provenance = card.provenance
    commit = provenance.get("git_commit") or "unknown (not run from a git checkout)"
    if provenance.get("git_dirty"):
        commit += " (with uncommitted changes)"
    argv = provenance.get("argv") or ()
    lines += ["## Provenance", "", f"Code version: `{commit}`; trained {provenance.get('time') or 'n/a'}.", "",
              "Steps of the DAG (a step's hash covers its configuration and all its inputs):", ""]
    lines += _table(["step", "hash", "output"], [[step.name, f"`{step.short_hash}`", f"`{step.output_path}`"] for step in card.dag])
    lines += ["", "To reproduce it, check out that commit and run the same program; finished steps are found cached:", "",
              "```", shlex.join(["python", *argv]) if argv else "(command line not recorded)", "```", ""]
    return "\n".join(lines)


def write_model_card(training_output: str, output_dir: str, *, evaluations: list[str] | None = None) -> ModelCard:
    """Write ``MODEL_CARD.md`` and ``loss_curves.png`` into ``output_dir``; see :func:`collect_card`.

    Both folders may be local paths or URLs (``s3://...``).
    """
    card = collect_card(fsx.absolute(training_output), evaluations=evaluations)
    output_dir = fsx.absolute(output_dir)
    plot_path = plot_loss_curves(card.train_curve, card.validation_curves, fsx.join(output_dir, PLOT_FILE),
                                 title=f"{card.name}: loss per training step")
    markdown_path = fsx.join(output_dir, CARD_FILE)
    fsx.atomic_write(markdown_path, render_markdown(card))
    return ModelCard(model=card.name, model_identity=card.identity, markdown_path=markdown_path, plot_path=plot_path,
                     evaluations=[name for name, _ in card.evaluations])
