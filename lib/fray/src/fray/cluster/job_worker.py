"""``python -m fray.cluster.job_worker PAYLOAD [RESULT]``: call a cloudpickled ``(fn, args, kwargs)``.

Exit status 0 when ``fn`` returns, 1 (with the traceback on stderr) when it raises. With ``RESULT``
the outcome is also pickled there, ``(True, value)`` or ``(False, exception)``, for a caller on
another machine (a remote call on Slurm); an exception that cannot be pickled travels as a
:class:`~fray.cluster.task_map.TaskError` holding its text and traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

import cloudpickle


def _write_result(path: str, outcome: tuple[bool, object]) -> None:
    try:
        blob = cloudpickle.dumps(outcome)
    except Exception:  # noqa: BLE001 - a value or exception that cannot travel
        from fray.cluster.task_map import TaskError

        text = "".join(traceback.format_exception(outcome[1])) if not outcome[0] else traceback.format_exc()
        blob = cloudpickle.dumps((False, TaskError(f"the result could not be sent back:\n{text}")))
    staging = f"{path}.{os.getpid()}.tmp"
    with open(staging, "wb") as handle:
        handle.write(blob)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, path)  # a reader on another machine sees all of it or nothing


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m fray.cluster.job_worker PAYLOAD [RESULT]", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as handle:
        fn, args, kwargs = cloudpickle.load(handle)
    try:
        value = fn(*args, **kwargs)
    except BaseException as error:  # noqa: BLE001 - the job's own failure, reported through the exit status
        traceback.print_exc()
        if len(argv) == 2:
            _write_result(argv[1], (False, error))
        return 1
    if len(argv) == 2:
        _write_result(argv[1], (True, value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
