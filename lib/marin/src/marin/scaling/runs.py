"""The finished training runs under a prefix, as :class:`~marin.scaling.points.ScalingRun` points.

A run is a step folder whose status is SUCCESS and whose artifact is a ``train_lm`` result
(:class:`marin.experiment.train.TrainedModel`, read as JSON here: the fits need no model code).
Its size is the artifact's ``parameters``, its data ``tokens_trained``, its loss the final
validation loss (of the set ``validation`` names, else the first the run evaluated), its compute
``flops_per_token * tokens_trained``; a run recorded before FLOPs were kept is counted at
``6 * parameters * tokens`` and says so. A sweep's budget comes from the step's annotations in
``.executor_info`` (:mod:`marin.experiment.sweep`). Runs that differ in more than size and budget
(optimizer, data, initial weights, validation set) are not fitted together: the largest group of
alike runs is, and the others are refused naming what differs (:mod:`marin.scaling.comparable`).
Runs that cannot be used are listed with the reason, never silently dropped. Records are read only
when they are regular files inside the prefix, in bounded amounts (:mod:`rigging.regular_files`), so
the web view can call this too; a run folder that is itself a link out of the prefix is listed as
refused, unread. A run is one step identity: a folder copied under another name (its
``.executor_info`` names the same identity) is counted once, at the folder its identity names, and
the copies are listed as not used.
"""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import dataclass, field
from typing import Any

from rigging import filesystem as fsx
from rigging.regular_files import RefusedFileError, read_bounded_text, stays_within

from marin.execution.records.catalog import describe_folder, step_folders
from marin.execution.records.executor_files import ARTIFACT_FILE, STATUS_SUCCESS, CorruptRecordError, read_info
from marin.execution.reproducibility.explain import identity_settings
from marin.execution.hashing.identity import SHORT_HASH_LENGTH, short_hash
from marin.scaling.comparable import comparable_settings, split_comparable
from marin.scaling.points import ScalingRun

TRAINED_MODEL_TYPE = "marin.experiment.train:TrainedModel"
# FLOPs per parameter per token of a forward and backward pass, for runs that did not record their own count.
APPROXIMATE_FLOPS_PER_PARAM_TOKEN = 6.0


@dataclass(frozen=True)
class SkippedRun:
    name: str
    path: str
    reason: str


@dataclass(frozen=True)
class CollectedRuns:
    """The runs a fit can use, those it cannot (with why), and notes on how values were read."""

    runs: list[ScalingRun] = field(default_factory=list)
    skipped: list[SkippedRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    validation_sets: list[str] = field(default_factory=list)  # every validation set the runs evaluated


def collect_runs(prefix: str, *, steps: str | None = None, validation: str | None = None,
                 mixed: bool = False) -> CollectedRuns:
    """Every finished ``train_lm`` run under ``prefix`` whose step name matches the glob ``steps``,
    less those that differ from the largest group of alike runs in more than size and budget
    (refused with the reason), unless ``mixed``."""
    prefix = prefix.rstrip("/")
    runs: list[ScalingRun] = []
    skipped: list[SkippedRun] = []
    notes: set[str] = set()
    sets: set[str] = set()
    settings: dict[str, dict[str, str]] = {}
    counted: dict[str, ScalingRun] = {}  # identity -> its run
    links: list[str] = []
    folders = step_folders(prefix, links=links)
    for link in links:  # a run folder that is a link out of the prefix is named, not read
        location = _without_suffix(link[len(prefix):].strip("/"))
        if not stays_within(prefix, link) and (steps is None or fnmatch.fnmatchcase(location, steps)):
            skipped.append(SkippedRun(location, link, f"refused: the folder is a link to a place outside {prefix}"))
    for folder in folders:
        listing = describe_folder(folder, prefix)
        if steps is not None and not fnmatch.fnmatchcase(listing.name, steps):
            continue
        record = _read_artifact(folder, prefix)
        if record is None:
            if listing.status != STATUS_SUCCESS and _declared_as_training(folder, prefix):
                skipped.append(SkippedRun(listing.name, folder, f"not finished (status {listing.status or 'none'})"))
            continue
        if isinstance(record, str):
            skipped.append(SkippedRun(listing.name, folder, record))
            continue
        if record.get("result_type") != TRAINED_MODEL_TYPE:
            continue  # not a training run (tokenized data, an eval, ...)
        if listing.status != STATUS_SUCCESS:
            skipped.append(SkippedRun(listing.name, folder, f"not finished (status {listing.status or 'none'})"))
            continue
        result = record.get("result") or {}
        sets.update(k for k in (result.get("validation_losses") or {}) if isinstance(k, str))
        info = _info(folder, prefix)
        point = _scaling_run(listing.name, folder, result, _budget_of(info), validation, notes)
        if isinstance(point, str):
            skipped.append(SkippedRun(listing.name, folder, point))
            continue
        identity = _info(folder, prefix).get("identity")
        if not isinstance(identity, str) or identity not in counted:
            if isinstance(identity, str):
                counted[identity] = point
            runs.append(point)
            settings[point.name] = comparable_settings(identity_settings(info), _validation_used(result, validation))
            continue
        # The same run twice: the one at the folder its identity names counts, the other is a copy.
        first = counted[identity]
        copy, original = (first, point) if _at_own_folder(folder, listing.name, identity) else (point, first)
        if copy is first:
            runs[runs.index(first)] = point
            counted[identity] = point
            settings[point.name] = comparable_settings(identity_settings(info), _validation_used(result, validation))
        skipped.append(SkippedRun(copy.name, copy.path, f"a copy of {original.path} (the same step identity); counted once"))
    kept, refused = split_comparable(runs, settings)
    if mixed and refused:
        notes.add(f"fitted with --mixed: {len(refused)} of the runs differ from the rest in more than size and budget")
    elif refused:
        runs = kept
        skipped += [SkippedRun(item.run.name, item.run.path or "", item.reason) for item in refused]
    if validation is None and len(sets) > 1:
        notes.add(f"the runs evaluated {len(sets)} validation sets; each run's loss is its first one "
                  "(choose one with validation=..., --validation on the command line)")
    return CollectedRuns(runs, skipped, sorted(notes), sorted(sets))


def _without_suffix(location: str) -> str:
    """A step folder's location without its ``-<short hash>`` (what a step name glob is matched with)."""
    head, _, tail = location.rpartition("-")
    return head if head and len(tail) == SHORT_HASH_LENGTH and all(c in "0123456789abcdef" for c in tail) else location


def _at_own_folder(folder: str, name: str, identity: str) -> bool:
    """Whether ``folder`` is where a step of this name and identity puts its output: ``<name>-<hash>``."""
    return folder.rstrip("/").endswith(f"/{name}-{short_hash(identity)}")


def _read_artifact(folder: str, prefix: str) -> dict[str, Any] | str | None:
    """The artifact record; ``None`` when there is none; a reason (str) when it cannot be read."""
    url = fsx.join(folder, ARTIFACT_FILE)
    try:
        text = read_bounded_text(url, within=prefix)
    except RefusedFileError as exc:
        return str(exc)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except ValueError as exc:
        return f"{ARTIFACT_FILE} is damaged ({exc})"
    return record if isinstance(record, dict) else f"{ARTIFACT_FILE} is not a JSON object"


def _info(folder: str, prefix: str) -> dict[str, Any]:
    try:
        return read_info(folder, within=prefix) or {}
    except CorruptRecordError:
        return {}


def _declared_as_training(folder: str, prefix: str) -> bool:
    """An unfinished step that a sweep declared (a training point not done yet is worth naming)."""
    return isinstance((_info(folder, prefix).get("annotations") or {}).get("sweep"), dict)


def _budget_of(info: dict[str, Any]) -> float | None:
    sweep = (info.get("annotations") or {}).get("sweep")
    budget = sweep.get("budget") if isinstance(sweep, dict) else None
    return float(budget) if _positive(budget) else None


def _validation_used(result: dict[str, Any], validation: str | None) -> str:
    """The validation set a run's fitted loss is read on (the named one, else its first)."""
    return validation or next(iter(result.get("validation_losses") or {}), "")


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _scaling_run(name: str, folder: str, result: dict[str, Any], budget: float | None, validation: str | None,
                 notes: set[str]) -> ScalingRun | str:
    """The run as a point, or why it cannot be one."""
    params, tokens = result.get("parameters"), result.get("tokens_trained")
    if not _positive(params) or not _positive(tokens):
        return "its record has no parameter or token count"
    losses = {k: v for k, v in (result.get("validation_losses") or {}).items() if _positive(v)}
    if validation is not None:
        if validation not in losses:
            return f"no validation loss for {validation!r} (it has: {', '.join(losses) or 'none'})"
        loss = losses[validation]
    elif losses:
        loss = next(iter(losses.values()))
    else:
        return "no validation loss (its data had no validation split)"
    flops_per_token = result.get("flops_per_token")
    if _positive(flops_per_token):
        flops = float(flops_per_token) * float(tokens)
    else:
        flops = APPROXIMATE_FLOPS_PER_PARAM_TOKEN * float(params) * float(tokens)
        notes.add("some runs recorded no FLOP count; theirs is 6 x parameters x tokens")
    return ScalingRun(name=name, params=float(params), tokens=float(tokens), flops=flops, loss=float(loss),
                      budget=budget, path=folder)
