"""``model_report(...)``: the model card of a ``train_lm`` step, as a cached, versioned step.

It depends on the training step and on the eval steps it tabulates, so a rerun of the same graph
finds it cached and a new checkpoint (any change to the training step) gives it a new identity.
"""

from __future__ import annotations

from collections.abc import Sequence

from fray.cluster import ResourceConfig
from marin.execution.lazy import LazyStep, lazy_step
from marin.reports.model_card import ModelCard, ReportSourceError, write_model_card

# Bumped when the card's layout changes, so old cards are regenerated.
REPORT_STEP_VERSION = "1"


def model_report(
    name: str,
    *,
    model: LazyStep,
    evaluations: Sequence[LazyStep] = (),
    version: str | None = None,
    output_path: str | None = None,
) -> LazyStep:
    """A lazy handle writing ``MODEL_CARD.md`` and ``loss_curves.png`` into its output folder.

    ``model``: a ``train_lm(...)`` handle. ``evaluations``: ``evaluate_lm`` / ``evaluate_harness``
    handles whose results the card tabulates (only those: the card of a cached step must not
    depend on what else happens to sit under the prefix).
    """
    if not isinstance(model, LazyStep):
        raise ReportSourceError(f"model must be a train_lm(...) handle, got {type(model).__name__}; "
                                "for a finished run's folder use `marin report FOLDER`.")
    evaluations = tuple(evaluations)
    for handle in evaluations:
        if not isinstance(handle, LazyStep):
            raise ReportSourceError(f"evaluations must be evaluate_lm/evaluate_harness handles, got {type(handle).__name__}.")

    def run(ctx) -> ModelCard:
        return write_model_card(ctx.dep_output_path(model), ctx.output_path,
                                evaluations=[ctx.dep_output_path(handle) for handle in evaluations])

    return lazy_step(
        name,
        run,
        deps=(model, *evaluations),
        hash_attrs={"model": model.name, "evaluations": [h.name for h in evaluations], "format": REPORT_STEP_VERSION},
        version=version,
        resources=ResourceConfig.with_cpu(),
        output_path=output_path,
    )
