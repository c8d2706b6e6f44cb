"""``python -m infra.cli``: the stack's offline commands.

* ``check SETTINGS``: read and check a settings file; prints the prefix and the worker groups.
* ``cluster-file SETTINGS [-o FILE]``: write the Ray cluster file for ``ray up`` (checked with
  Ray's own validation when Ray is installed).
* ``plan SETTINGS``: run the Pulumi program under Pulumi's mocks and list every resource it
  declares and every grant, without the ``pulumi`` command or an account.

A settings error prints one line naming the field and exits 2; so does ``plan`` without the
``infra`` extra (Pulumi's SDK), saying what to install.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rigging.errors import ExplainedError

from infra.errors import MissingExtraError
from infra.settings import StackSettings, load_settings


def _check(settings: StackSettings, _args: argparse.Namespace) -> None:
    from fray.cluster.accelerators import tpu_slice

    from infra.ray_cluster import node_resources

    print(f"{settings.project}: prefix {settings.prefix_url}")
    for group in settings.cluster.workers:
        hardware = group.machine_type
        if group.tpu_type is not None:  # a worker is a whole slice: say how many hosts ask for resources each
            tpu = tpu_slice(group.tpu_type)
            hardware = f"{tpu.name} ({tpu.hosts} x {tpu.host.machine_type})"
        print(f"  {group.name}: {hardware}, {group.min_workers}-{group.max_workers} workers"
              f"{' (spot)' if group.spot else ''}, resources {node_resources(group)}")


def _cluster_file(settings: StackSettings, args: argparse.Namespace) -> None:
    from infra.ray_cluster import cluster_config, cluster_yaml, validate_cluster_config

    try:
        validate_cluster_config(cluster_config(settings))
    except ImportError:
        print("Ray is not installed: the cluster file was not checked with Ray's validation.", file=sys.stderr)
    text = cluster_yaml(settings)
    if args.output in (None, "-"):
        sys.stdout.write(text)
    else:
        with open(args.output, "w") as handle:
            handle.write(text)
        print(f"wrote {args.output}: `ray up {args.output}` launches it", file=sys.stderr)


_PLAN_KEYS = ("name", "accountId", "repositoryId", "service", "roleId", "role", "member")


def _plan(settings: StackSettings, _args: argparse.Namespace) -> None:
    try:
        from infra.offline import plan
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in ("pulumi", "pulumi_gcp"):
            raise
        raise MissingExtraError(
            f"plan runs the stack's Pulumi program, which needs Pulumi's SDK, and {missing.name!r} is not installed "
            f"here; install the infra extra: pip install -e '.[infra]'"
        ) from None

    for resource in plan(settings):
        inputs = resource.inputs
        detail = ", ".join(f"{key}={inputs[key]}" for key in _PLAN_KEYS if key in inputs)
        print(f"{resource.type.rpartition(':')[2]:<18} {resource.name:<26} {detail}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.cli", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, handler, help_text in (("check", _check, "read and check a settings file"),
                                     ("cluster-file", _cluster_file, "write the Ray cluster file"),
                                     ("plan", _plan, "list the resources the stack declares (offline)")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("settings", help="the stack's settings file (YAML)")
        if name == "cluster-file":
            command.add_argument("-o", "--output", help="file to write (default: standard output)")
        command.set_defaults(handler=handler)
    args = parser.parse_args(argv)
    try:
        args.handler(load_settings(args.settings), args)
    except ExplainedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
