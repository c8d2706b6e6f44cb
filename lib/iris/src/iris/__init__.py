"""iris: job orchestration on a cluster.

Owns submitting, watching, retrying (on failure and on preemption) and stopping jobs, and their
logs. It builds on fray and rigging.

A job's command signals "I was preempted, run me again" by exiting with
:data:`PREEMPTED_EXIT_CODE` (75, ``EX_TEMPFAIL`` from ``sysexits.h``). A replica killed by
``SIGTERM`` from outside iris (a spot VM being reclaimed, a scheduler evicting it) counts as a
preemption too. Preemptions spend ``max_retries_preemption``; any other non-zero exit spends
``max_retries_failure``. A command that exits with :data:`FENCED_OFF_EXIT_CODE` (77,
``EX_NOPERM``) says its work now belongs to someone else: the job ends FAILED, never retried.
"""

from iris.jobs import (
    JobNotFound,
    follow_logs,
    get_job,
    list_jobs,
    read_logs,
    stop_job,
    submit_job,
    wait_for_job,
)
from iris.spec import FENCED_OFF_EXIT_CODE, PREEMPTED_EXIT_CODE, InvalidJobSpec, JobSpec
from iris.store import JobRecord, JobState, JobStore, default_home

__all__ = [
    "FENCED_OFF_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "InvalidJobSpec",
    "JobNotFound",
    "JobRecord",
    "JobSpec",
    "JobState",
    "JobStore",
    "default_home",
    "follow_logs",
    "get_job",
    "list_jobs",
    "read_logs",
    "stop_job",
    "submit_job",
    "wait_for_job",
]
