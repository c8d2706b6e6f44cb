"""``iris job run|list|status|logs|stop``: the command line over :mod:`iris.jobs`."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import sys

from rigging.secrets import SecretNamesError

from iris.jobs import JobNotFound, follow_logs, get_job, list_jobs, read_logs, stop_job, submit_job
from iris.spec import PREEMPTED_EXIT_CODE, InvalidJobSpec, JobSpec, command_text, default_job_name, resources_from_flags
from iris.store import IrisHomeError, JobRecord, JobState, JobStore

EPILOG = f"""Exit code {PREEMPTED_EXIT_CODE} from a job's command means "preempted, run me again" and spends
--max-retries-preemption; any other non-zero exit spends --max-retries-failure. Jobs are kept in
$IRIS_HOME/jobs.db (default: <Marin prefix>/.iris)."""


def installed_version() -> str:
    """The version of the installed distribution iris ships in (``marin``), or ``unknown`` in a bare tree."""
    try:
        return importlib.metadata.version("marin")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="iris", description="Run and watch jobs on a cluster.", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"iris {installed_version()}")
    parser.add_argument("--home", help="iris's folder (database and logs); default $IRIS_HOME or <Marin prefix>/.iris")
    groups = parser.add_subparsers(dest="group", metavar="job")
    job_parser = groups.add_parser("job", help="jobs: run, list, status, logs, stop")
    job = job_parser.add_subparsers(dest="action", metavar="{run,list,status,logs,stop}")

    run = job.add_parser("run", help="run a command as a job: iris job run [options] -- COMMAND...", epilog=EPILOG)
    run.add_argument("--name", help="a short name; the job id starts with it (default: the command's name)")
    run.add_argument("--cpu", type=float, help="CPUs per replica")
    run.add_argument("--memory", help="memory per replica, e.g. 8g")
    run.add_argument("--gpu", metavar="VARIANT:N", help="GPUs per replica, e.g. H100:8 (auto:1 for any)")
    run.add_argument("--tpu", metavar="TYPE", help="a TPU slice type, e.g. v4-32 (one replica per host unless --replicas)")
    run.add_argument("--replicas", type=int, help="copies of the command that run together, all-or-nothing")
    run.add_argument("--max-retries-failure", type=int, default=0, help="retries after a plain failure (default 0)")
    run.add_argument("--max-retries-preemption", type=int, default=0, help=f"retries after exit {PREEMPTED_EXIT_CODE} or SIGTERM (default 0)")
    run.add_argument("--backend", choices=["local", "ray", "slurm"], default="local")
    run.add_argument("--ray-address", help="Ray cluster for --backend ray: auto, ray://HOST:10001; default a private local cluster")
    run.add_argument("--partition", help="Slurm partition for --backend slurm (default: the cluster's default)")
    run.add_argument("--time-limit", type=float, metavar="SECONDS",
                     help="end an attempt that runs longer; counts as a failure (TIMED_OUT)")
    run.add_argument("--attempts-folder", metavar="URL",
                     help="also keep each attempt's output and record in URL/.attempts/NNN/ (any fsspec URL)")
    run.add_argument("--wait", action="store_true",
                     help="stream the job's output until it ends; exit 0 if it succeeded, 1 otherwise")
    run.add_argument("command", nargs="*", help=argparse.SUPPRESS)

    job.add_parser("list", help="all jobs with their states")
    status = job.add_parser("status", help="a job's state, attempts and history")
    status.add_argument("job_id")
    logs = job.add_parser("logs", help="a job's output")
    logs.add_argument("job_id")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    stop = job.add_parser("stop", help="stop a running job")
    stop.add_argument("job_id")
    parser.set_defaults(usage_of=parser)
    job_parser.set_defaults(usage_of=job_parser)
    return parser


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def _when(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _run(args: argparse.Namespace, command: list[str], store: JobStore) -> int:
    resources = resources_from_flags(cpu=args.cpu, memory=args.memory, gpu=args.gpu, tpu=args.tpu)
    spec = JobSpec(
        name=args.name if args.name is not None else default_job_name(command),
        command=tuple(command),
        resources=resources,
        replicas=args.replicas if args.replicas is not None else resources.replicas,
        max_retries_failure=args.max_retries_failure,
        max_retries_preemption=args.max_retries_preemption,
        backend=args.backend,
        ray_address=args.ray_address,
        cwd=os.getcwd(),
        slurm_partition=args.partition,
        time_limit_s=args.time_limit,
        attempts_folder=args.attempts_folder,
    )
    job_id = submit_job(spec, store)
    print(job_id, flush=True)
    if not args.wait:
        return 0
    # The output as the replicas write it (each file announced once), then the job's final word.
    for chunk in follow_logs(job_id, store):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    record = get_job(job_id, store)
    print(f"{job_id}: {record.state.value} {record.message}", file=sys.stderr)
    return 0 if record.state == JobState.SUCCEEDED else 1


def _print_list(records: list[JobRecord]) -> None:
    if not records:
        print("No jobs yet. Start one with: iris job run -- COMMAND")
        return
    rows = [("JOB ID", "STATE", "ATTEMPTS", "BACKEND", "CREATED", "COMMAND")]
    for r in records:
        rows.append((r.job_id, r.state.value, str(r.attempts), r.spec.backend, _when(r.created_at), command_text(r.spec.command)[:60]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


def _print_status(record: JobRecord, store: JobStore) -> None:
    spec = record.spec
    print(f"job:        {record.job_id}")
    print(f"state:      {record.state.value}" + (f" ({record.message})" if record.message else ""))
    print(f"command:    {command_text(spec.command)}")
    print(f"backend:    {spec.backend}, {spec.replicas} replica(s)")
    print(f"attempts:   {record.attempts} (preempted {record.preemptions}, failed {record.failures}; "
          f"budgets: preemption {spec.max_retries_preemption}, failure {spec.max_retries_failure})")
    if record.exit_code is not None:
        print(f"exit code:  {record.exit_code}")
    print(f"logs:       {store.log_folder(record.job_id)}")
    for attempt in store.attempts(record.job_id):
        print(f"  attempt {attempt.attempt}: {attempt.outcome or 'RUNNING'} exit codes {list(attempt.exit_codes)} started {_when(attempt.started_at)}")
    print("history:")
    for at, state, message in store.events(record.job_id):
        print(f"  {_when(at)}  {state:<9}  {message}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options, command = _split_command(argv)
    args = _parser().parse_args(options)
    if args.group is None or args.action is None:
        # `iris` or `iris job` alone: what there is to run, rather than argparse's "required: group".
        args.usage_of.print_help(sys.stderr)
        return 2
    try:
        store = JobStore(args.home, create=args.action == "run")
        if args.action == "run":
            command = list(args.command) + command
            return _run(args, command, store)
        if args.action == "list":
            _print_list(list_jobs(store))
        elif args.action == "status":
            _print_status(get_job(args.job_id, store), store)
        elif args.action == "logs":
            if args.follow:
                for chunk in follow_logs(args.job_id, store):
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            else:
                sys.stdout.write(read_logs(args.job_id, store))
        elif args.action == "stop":
            record = stop_job(args.job_id, store)
            print(f"{record.job_id}: {record.state.value}")
            return 0 if record.state.finished else 1
        return 0
    except (InvalidJobSpec, JobNotFound, IrisHomeError, SecretNamesError) as exc:
        print(f"iris: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`iris job logs ID | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
