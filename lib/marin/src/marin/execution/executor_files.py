"""The files the runner keeps in each step's output folder, and how to read them.

``.executor_info``   JSON: what ran (name, identity, version, hash attributes, function, dependency
                     names/identities/paths, resources). Written before the step starts.
``.executor_status`` JSON: ``{"status": ..., "time": ..., "holder": ..., "error": ...}`` where
                     status is RUNNING, SUCCESS, FAILED or DEP_FAILED. SUCCESS is written last.
``.executor_lock``   the lease (see :mod:`rigging.lease`): who is running the step right now.
``.artifact.json``   the step's typed result and provenance (see :mod:`marin.execution.artifact`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx

INFO_FILE = ".executor_info"
STATUS_FILE = ".executor_status"
LOCK_FILE = ".executor_lock"
ARTIFACT_FILE = ".artifact.json"

STATUS_RUNNING = "RUNNING"
STATUS_SUCCESS = "SUCCESS"
STATUS_FAILED = "FAILED"
STATUS_DEP_FAILED = "DEP_FAILED"
ALL_STATUSES = (STATUS_RUNNING, STATUS_SUCCESS, STATUS_FAILED, STATUS_DEP_FAILED)


@dataclass(frozen=True)
class StatusRecord:
    status: str
    time: float
    holder: str | None = None
    error: str | None = None

    def to_json(self) -> str:
        return json.dumps({"status": self.status, "time": self.time, "holder": self.holder, "error": self.error}, indent=1)


def read_status(output_path: str) -> StatusRecord | None:
    """The step's status record, or ``None`` when it never started (or the file is unreadable)."""
    text = fsx.read_text(fsx.join(output_path, STATUS_FILE))
    if text is None:
        return None
    try:
        data = json.loads(text)
        return StatusRecord(data["status"], float(data.get("time", 0.0)), data.get("holder"), data.get("error"))
    except (ValueError, KeyError, TypeError):
        # A bare word is accepted too, so a hand-edited status file still reads.
        word = text.strip()
        return StatusRecord(word, 0.0) if word in ALL_STATUSES else None


def write_status(output_path: str, status: str, *, holder: str | None = None, error: str | None = None) -> StatusRecord:
    record = StatusRecord(status, time.time(), holder, error)
    fsx.atomic_write(fsx.join(output_path, STATUS_FILE), record.to_json())
    return record


def read_info(output_path: str) -> dict[str, Any] | None:
    text = fsx.read_text(fsx.join(output_path, INFO_FILE))
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def write_info(output_path: str, info: dict[str, Any]) -> None:
    fsx.atomic_write(fsx.join(output_path, INFO_FILE), json.dumps(info, indent=2, sort_keys=True, default=str))
