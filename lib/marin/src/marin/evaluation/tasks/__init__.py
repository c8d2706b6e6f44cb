"""Small lm-eval-harness tasks shipped with Marin, for tests and smoke checks of the harness adapter.

Pass :data:`TASKS_DIR` as ``include_path`` to ``evaluate_harness`` (or to ``lm_eval.tasks.TaskManager``)
to make them available by name. Each task reads its data from a jsonl file beside its YAML config,
so nothing is downloaded.
"""

import os

TASKS_DIR = os.path.dirname(os.path.abspath(__file__))

__all__ = ["TASKS_DIR"]
