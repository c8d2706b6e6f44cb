"""Which runs one scaling law may be fitted to: those that differ only in size and budget.

A scaling law says how loss moves with parameters N and tokens D when nothing else moves. Runs that
also differ in their optimizer or its learning rate, their data, their initial weights or the
validation set their loss is read on measure something else, and fitting them together gives a
confident curve through a mixture. So the runs are split by everything that went into their
identity (:func:`marin.execution.reproducibility.explain.identity_settings`) except the model's size fields and
the number of steps, plus the validation set: the largest group is fitted, and every other run is
refused with what sets it apart, by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marin.scaling.points import ScalingRun

# The settings a size-and-budget sweep changes between its points: the model's shape (what makes
# N) and the steps trained (what makes D at a fixed batch and sequence length).
SIZE_FIELDS = ("hidden_dim", "intermediate_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim_override",
               "num_experts", "num_experts_per_token", "shared_expert_dim")
SIZE_AND_BUDGET = frozenset({*(f"hash_attrs.model.{name}" for name in SIZE_FIELDS), "hash_attrs.num_train_steps"})
VALIDATION_KEY = "validation set"
MISSING = "(not set)"


@dataclass(frozen=True)
class Refused:
    run: ScalingRun
    reason: str


def comparable_settings(identity: Mapping[str, Any], validation: str) -> dict[str, str]:
    """The settings that must agree between runs of one fit, as text: identity settings less size
    and budget, and the validation set the loss is read on."""
    settings = {key.removeprefix("hash_attrs."): json.dumps(value, sort_keys=True, default=str)
                for key, value in identity.items() if key not in SIZE_AND_BUDGET}
    settings[VALIDATION_KEY] = json.dumps(validation)
    return settings


def split_comparable(runs: Sequence[ScalingRun], settings: Mapping[str, Mapping[str, str]]
                     ) -> tuple[list[ScalingRun], list[Refused]]:
    """``(kept, refused)``: the largest group of runs whose ``settings[run.name]`` agree, and every other
    run with what differs. Ties go to the group spanning more budgets, then to the first by run name."""
    groups: dict[str, list[ScalingRun]] = {}
    for run in runs:
        groups.setdefault(json.dumps(settings.get(run.name, {}), sort_keys=True), []).append(run)
    if len(groups) <= 1:
        return list(runs), []
    kept = min(groups.values(), key=lambda group: (-len(group), -len({r.budget or r.flops for r in group}),
                                                   min(r.name for r in group)))
    reference = settings.get(kept[0].name, {})
    refused = [Refused(run, describe_difference(settings.get(run.name, {}), reference, len(kept)))
               for run in runs if run not in kept]
    return kept, refused


def describe_difference(mine: Mapping[str, str], fitted: Mapping[str, str], count: int) -> str:
    """``"differs from the 9 runs fitted in optimizer.type ("muon", theirs "adam"); ..."`` (a few named, then a count)."""
    keys = sorted(set(mine) | set(fitted), key=lambda key: (key != VALIDATION_KEY, key))
    differing = [key for key in keys if mine.get(key, MISSING) != fitted.get(key, MISSING)]
    shown = [f"{key} ({mine.get(key, MISSING)}, theirs {fitted.get(key, MISSING)})" for key in differing[:4]]
    more = f" and {len(differing) - 4} more" if len(differing) > 4 else ""
    return (f"differs from the {count} run(s) fitted in more than size and budget: {'; '.join(shown)}{more} "
            f"(narrow the runs with --steps, or fit them anyway with --mixed)")
