"""``python -m fray.cluster.job_worker PAYLOAD``: call a cloudpickled ``(fn, args, kwargs)``.

Exit status 0 when ``fn`` returns, 1 (with the traceback on stderr) when it raises.
"""

from __future__ import annotations

import sys
import traceback

import cloudpickle


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m fray.cluster.job_worker PAYLOAD", file=sys.stderr)
        return 2
    with open(argv[0], "rb") as handle:
        fn, args, kwargs = cloudpickle.load(handle)
    try:
        fn(*args, **kwargs)
    except BaseException:  # noqa: BLE001 - the job's own failure, reported through the exit status
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
