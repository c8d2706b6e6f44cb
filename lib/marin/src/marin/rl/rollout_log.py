"""The run's record of every rollout batch it trains on, and the reason a killed run loses none and repeats none.

Before the trainer takes batch ``i`` (for step ``i + 1``) it is written to
``<run>/rollouts/batch-<i>.json``, atomically. A run that resumes from its checkpoint of step ``k``
reads batches ``k, k + 1, ...`` back from the log for as long as the log has them: the steps it
trains again learn from exactly the rollouts they learnt from before the kill, the steps up to ``k``
(already in the checkpoint) are never given theirs again, and sampling starts at the first batch
the log lacks. The log is also the run's record of what was sampled, scored and trained on, by
which weights version.
"""

from __future__ import annotations

import json

from rigging import filesystem as fsx

from marin.rl.rollouts import RolloutBatch

LOG_FOLDER = "rollouts"


class RolloutLog:
    def __init__(self, run_folder: str):
        self.folder = fsx.join(run_folder, LOG_FOLDER)

    def path_of(self, index: int) -> str:
        return fsx.join(self.folder, f"batch-{index:06d}.json")

    def read(self, index: int) -> RolloutBatch | None:
        text = fsx.read_text(self.path_of(index))
        return None if text is None else RolloutBatch.from_json(json.loads(text))

    def write(self, batch: RolloutBatch) -> None:
        fsx.atomic_write(self.path_of(batch.index), json.dumps(batch.to_json()))

    def first_missing(self, start: int) -> int:
        """The first batch number from ``start`` on that the log lacks."""
        index = start
        while fsx.exists(self.path_of(index)):
            index += 1
        return index


__all__ = ["LOG_FOLDER", "RolloutLog"]
