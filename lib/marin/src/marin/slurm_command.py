"""``marin slurm start|stop|status``: a private single-node Slurm on this machine.

For trying ``iris:slurm`` without a cluster (docs/cluster.md). ``start`` runs munge, the
controller and the node daemon of :mod:`fray.cluster.slurm_local` in a state folder and returns
with them running; the one line it prints on stdout is the ``export SLURM_CONF=...`` a shell needs,
so ``eval "$(marin slurm start)"`` takes it (the rest goes to stderr). Starting a running one only
prints that line again. ``stop`` cancels its jobs and ends the daemons; stopping twice is harmless.
``status`` says whether one runs (exit 0) or not (exit 1). Needs Debian's slurm-wlm and munge, and root.
"""

from __future__ import annotations

import argparse
import os
import sys

from fray.cluster.slurm_local import (
    STATE_DIR_ENV,
    LocalSlurmCluster,
    SlurmClusterError,
    state_dir_or_default,
    start_local_slurm,
    stop_local_slurm,
)

EXIT_OK = 0
EXIT_NOT_RUNNING = 1
EXIT_FAILED = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    slurm = subparsers.add_parser(
        "slurm",
        help="start, stop or check a private single-node Slurm on this machine",
        description="A private Slurm (munged, slurmctld, slurmd) on this machine, for running steps with "
        "MARIN_CLUSTER=iris:slurm without a cluster. Needs slurm-wlm and munge (scripts/install_slurm.sh) and root.",
    )
    actions = slurm.add_subparsers(dest="slurm_action", metavar="ACTION")
    actions.required = True
    start = actions.add_parser("start", help="start it (unless it runs) and print the SLURM_CONF line for the shell",
                               description="Start the daemons and return once the node is idle; they keep running. "
                               "Prints `export SLURM_CONF=...` on stdout: eval \"$(marin slurm start)\" applies it.")
    start.add_argument("--partition", default="debug", help="the partition's name (default: debug)")
    start.add_argument("--cpus", type=int, help="CPUs of the node (default: this machine's)")
    start.add_argument("--memory-mib", type=int, help="memory of the node in MiB (default: 90%% of this machine's)")
    start.add_argument("--timeout", type=float, default=60, help="seconds to wait for the node (default: 60)")
    start.set_defaults(handler=start_command)
    stop = actions.add_parser("stop", help="cancel its jobs, end its daemons and remove its folder")
    stop.set_defaults(handler=stop_command)
    status = actions.add_parser("status", help="whether it runs (exit 0) or not (exit 1), and its SLURM_CONF line")
    status.set_defaults(handler=status_command)
    for parser in (start, stop, status):
        parser.add_argument("--state-dir", help=f"its folder: configuration, logs, pids (default: ${STATE_DIR_ENV}, "
                            "else ~/.cache/fray/slurm-local)")


def _state_dir(args: argparse.Namespace) -> str:
    return str(state_dir_or_default(args.state_dir))


def _with_state_dir(args: argparse.Namespace, command: str) -> str:
    """``command`` as the user must type it to reach the same folder."""
    return f"{command} --state-dir {args.state_dir}" if args.state_dir else command


def start_command(args: argparse.Namespace) -> int:
    options = {name: value for name, value in (("cpus", args.cpus), ("memory_mib", args.memory_mib)) if value}
    try:
        cluster, started = start_local_slurm(_state_dir(args), timeout=args.timeout, partition=args.partition,
                                             **options)
    except SlurmClusterError as exc:
        print(f"marin slurm start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    what = f"started a private Slurm in {cluster.startup_s:.1f} s" if started else "a private Slurm is already running"
    print(f"marin slurm: {what}: {cluster.describe()}.\n"
          f"  its folder (configuration, logs, pids): {cluster.root}\n"
          f"  for another shell: source {cluster.env_file}\n"
          f"  to stop it: {_with_state_dir(args, 'marin slurm stop')}", file=sys.stderr)
    print(cluster.export_line)
    return EXIT_OK


def stop_command(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    try:
        stopped = stop_local_slurm(state_dir)
    except SlurmClusterError as exc:
        print(f"marin slurm stop: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(f"marin slurm: stopped the private Slurm of {state_dir}" if stopped
          else f"marin slurm: no private Slurm in {state_dir}; nothing to stop", file=sys.stderr)
    return EXIT_OK


def status_command(args: argparse.Namespace) -> int:
    state_dir = _state_dir(args)
    try:
        cluster = LocalSlurmCluster.attach(state_dir)
    except SlurmClusterError as exc:
        print(f"marin slurm status: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if cluster is None:
        print(f"No private Slurm in {state_dir}: start one with {_with_state_dir(args, 'marin slurm start')}")
        return EXIT_NOT_RUNNING
    if not cluster.is_running:
        stopped = cluster.stopped_daemons()
        logs = ", ".join(str(cluster.root / f"{name}.log") for name in stopped)
        why = f"{', '.join(stopped)} stopped (see {logs})" if stopped else "its start has not finished"
        print(f"The private Slurm in {state_dir} is not running: {why}; "
              f"{_with_state_dir(args, 'marin slurm stop')}, then start it again")
        return EXIT_NOT_RUNNING
    print(f"A private Slurm is running: {cluster.describe()}; its folder: {cluster.root}")
    if os.environ.get("SLURM_CONF") != str(cluster.conf_path):
        print("This shell does not use it yet; to use it:")
    print(cluster.export_line)
    return EXIT_OK
