"""The project's built-in evaluation tasks as decontamination references, by name.

The tasks are the lm-eval-harness task files under :data:`marin.evaluation.tasks.TASKS_DIR`, the
names ``evaluate_harness(tasks=..., include_path=TASKS_DIR)`` runs. Names are found by reading the
YAML files (no lm-eval import), so an unknown name fails when the step is declared. When the step
runs, lm-eval renders each evaluation document as the harness would show it to a model: the prompt
followed by each continuation it scores (every choice of a multiple-choice question, the target of
a loglikelihood or generation task), joined by the task's target delimiter. A task's identity is
its name, its version (``metadata.version``) and the content of the files in its folder, so an
edited task never reuses a cached result.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, util
from typing import Any

import yaml

from marin.curation.references import References
from marin.curation.steps import CurationError

LM_EVAL_REQUIREMENT = "lm_eval>=0.4,<0.5"


@dataclass(frozen=True)
class BuiltinTask:
    name: str
    config_file: str  # the task's YAML file; its folder holds its data
    version: str | None


class _TaskYamlLoader(yaml.SafeLoader):
    """Reads task YAML files whose ``!function`` tags name Python code this module never runs."""


_TaskYamlLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def tasks_dir() -> str:
    # Imported here: marin.evaluation's package imports the evaluator (JAX), which declaring a
    # decontamination step without tasks should not pay for.
    from marin.evaluation.tasks import TASKS_DIR

    return TASKS_DIR


@lru_cache(maxsize=1)
def builtin_tasks() -> dict[str, BuiltinTask]:
    """Every task defined under ``TASKS_DIR``, by name."""
    tasks: dict[str, BuiltinTask] = {}
    for root, dirs, names in os.walk(tasks_dir()):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file_name in sorted(names):
            if not file_name.endswith((".yaml", ".yml")):
                continue
            path = os.path.join(root, file_name)
            with open(path, encoding="utf-8") as handle:
                config = yaml.load(handle, Loader=_TaskYamlLoader)
            if isinstance(config, dict) and isinstance(config.get("task"), str):
                version = (config.get("metadata") or {}).get("version")
                tasks[config["task"]] = BuiltinTask(config["task"], path, None if version is None else str(version))
    return tasks


def builtin_task(name: str) -> BuiltinTask:
    """The built-in task called ``name``, or a one-line error naming the known ones."""
    known = builtin_tasks()
    if name in known:
        return known[name]
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise CurationError(f"unknown evaluation task {name!r}: the built-in tasks are {', '.join(sorted(known))}.{hint}")


def task_references(names: Sequence[str]) -> list[References]:
    """One :class:`References` per task name (checked now; lm-eval is imported when the step runs)."""
    if isinstance(names, str) or not all(isinstance(name, str) and name for name in names):
        raise CurationError(f"eval_tasks must be a list of task names, got {names!r}")
    tasks = [builtin_task(name) for name in dict.fromkeys(names)]
    if not tasks:
        return []
    from marin.evaluation.harness import include_path_identity

    if util.find_spec("lm_eval") is None:
        raise CurationError(f"evaluation tasks are read through lm-eval-harness, which is not installed: "
                            f"pip install '{LM_EVAL_REQUIREMENT}'")
    return [References(
        label=f"task {task.name!r}",
        identity={"task": task.name, "version": task.version, "files": include_path_identity(os.path.dirname(task.config_file)),
                  # lm-eval renders the prompts; another release may render them differently
                  "lm_eval": metadata.version("lm_eval")},
        items_at_run_time=lambda ctx, task=task: task_items(task),
    ) for task in tasks]


def task_items(task: BuiltinTask) -> Iterator[tuple[str, str]]:
    """``(<task>:<document index>, text)`` for every text of every evaluation document of ``task``.

    Documents are numbered from 0 in lm-eval's order (its ``doc_id``).
    """
    lm_task = _load_task(task)
    for index, doc in enumerate(lm_task.eval_docs):
        for text in document_texts(lm_task, doc):
            yield f"{task.name}:{index}", text


def _load_task(task: BuiltinTask) -> Any:
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=os.path.dirname(task.config_file), include_defaults=False)
    if hasattr(manager, "load"):  # newer releases, where get_task_dict is deprecated
        return manager.load([task.name])["tasks"][task.name]
    return get_task_dict([task.name], manager)[task.name]


def document_texts(lm_task: Any, doc: dict) -> list[str]:
    """The texts lm-eval would score for ``doc``: the prompt, the delimiter, then each continuation."""
    delimiter = lm_task.config.target_delimiter
    prompt = lm_task.doc_to_text(doc)
    output_type = lm_task.OUTPUT_TYPE
    if output_type == "loglikelihood_rolling":
        return [str(lm_task.doc_to_target(doc))]
    if output_type == "multiple_choice":
        choices = [str(choice) for choice in lm_task.doc_to_choice(doc)]
        if lm_task.multiple_input:  # the choices are the contexts; one target continues each
            return [f"{choice}{delimiter}{_target_text(lm_task, doc, choices)[0]}" for choice in choices]
        return [f"{prompt}{delimiter}{choice}" for choice in choices]
    choices = [str(choice) for choice in lm_task.doc_to_choice(doc)] if lm_task.config.doc_to_choice else []
    return [f"{prompt}{delimiter}{target}" for target in _target_text(lm_task, doc, choices)]


def _target_text(lm_task: Any, doc: dict, choices: Sequence[str]) -> list[str]:
    """A document's target as text: an index names a choice; a list holds several accepted answers."""
    target = lm_task.doc_to_target(doc)
    targets = target if isinstance(target, list) else [target]
    return [choices[t] if isinstance(t, int) and 0 <= t < len(choices) else str(t) for t in targets]
