"""The loss-curve figure of a model card: training loss per step, validation loss at each evaluation."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable

from rigging import filesystem as fsx


def read_loss_curves(metrics_lines: Iterable[str]) -> tuple[list[tuple[int, float]], dict[str, list[tuple[int, float]]]]:
    """``(train [(step, loss)], {validation set: [(step, loss)]})`` from the lines of ``metrics.jsonl``."""
    train: list[tuple[int, float]] = []
    validation: dict[str, list[tuple[int, float]]] = {}
    for line in metrics_lines:
        if not line.strip():
            continue
        record = json.loads(line)
        step = record.get("step")
        if step is None:
            continue
        if isinstance(record.get("loss"), (int, float)):
            train.append((int(step), float(record["loss"])))
        for key, value in record.items():
            if key.startswith("eval/") and key.endswith("/loss") and isinstance(value, (int, float)):
                validation.setdefault(key[len("eval/"):-len("/loss")], []).append((int(step), float(value)))
    return train, validation


def plot_loss_curves(train, validation, path: str, *, title: str) -> str:
    """Write the figure as a PNG at ``path``, a local path or URL (Agg backend: no display needed); returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    if train:
        steps, losses = zip(*train)
        axes.plot(steps, losses, color="tab:blue", linewidth=1.2, alpha=0.9, label="training loss")
    for i, (name, points) in enumerate(sorted(validation.items())):
        steps, losses = zip(*points)
        axes.plot(steps, losses, marker="o", markersize=5, linewidth=1.5, color=f"C{(i + 1) % 10}",
                  label=f"validation loss ({name})")
    axes.set_xlabel("training step")
    axes.set_ylabel("loss (nats per token)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if train or validation:
        axes.legend(loc="upper right")
    else:
        axes.text(0.5, 0.5, "no losses recorded", ha="center", va="center", transform=axes.transAxes)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    plt.close(figure)
    fsx.atomic_write(path, png.getvalue())
    return path
