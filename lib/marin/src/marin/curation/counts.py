"""What a chain of curation steps kept and removed, one line per step, for a person to read.

The counts are each step's own summary (its ``.artifact.json``): documents in and out, and the
documents removed by each reason. A step that has not run under the runner's prefix (a dry run, a
failed dependency) is shown as such rather than skipped, so the table always has one line per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from marin.execution.artifact import ArtifactError, load_artifact
from marin.execution.lazy import LazyStep


def removal_line(name: str, summary: Mapping[str, Any], width: int = 0) -> str:
    """``name  IN -> OUT  reason N, reason M`` from a curation step's summary."""
    removed = summary.get("removed") or {}
    marked = summary.get("marked") or {}
    reasons = ", ".join(f"{reason} {bucket['documents']:,}" for reason, bucket in removed.items())
    if marked:
        reasons += (", " if reasons else "") + ", ".join(f"{reason} {bucket['documents']:,} (marked)"
                                                          for reason, bucket in marked.items())
    counts = f"{summary.get('documents_in', 0):,} -> {summary.get('documents_out', 0):,}"
    return f"{name:<{width}}  {counts:>14}  {reasons or 'nothing removed'}"


def curation_table(runner: Any, steps: Iterable[LazyStep]) -> str:
    """One :func:`removal_line` per step, read from the step's result under ``runner``'s prefix."""
    steps = list(steps)
    width = max((len(step.name) for step in steps), default=0)
    lines = [f"{'step':<{width}}  {'documents':>14}  removed"]
    for step in steps:
        try:
            summary = load_artifact(runner.output_path_for(step)).result["summary"]
        except (ArtifactError, KeyError, TypeError):
            lines.append(f"{step.name:<{width}}  {'not run':>14}")
            continue
        lines.append(removal_line(step.name, summary, width))
    return "\n".join(lines)


__all__ = ["curation_table", "removal_line"]
