"""The stack's program run offline, under Pulumi's own mocks: what ``pulumi up`` would declare,
without the ``pulumi`` command, an account or a network.

:func:`plan` sets :class:`RecordingMocks` with ``pulumi.runtime.set_mocks`` (the Python SDK's
unit-testing hook), runs :func:`infra.stack.declare_stack` and returns every resource with the
inputs the program gave it. The mocks answer the few outputs the cloud would compute and the
program reads back (a service account's email and name, a custom role's name, a service's URL)
in the form Google Cloud gives them, so dependent resources see realistic values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra.settings import StackSettings


@dataclass(frozen=True)
class DeclaredResource:
    """One resource the program declared: its Pulumi type token, logical name and inputs (wire names)."""

    type: str
    name: str
    inputs: dict[str, Any] = field(default_factory=dict)


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that keep every declared resource and compute the outputs the cloud would."""

    def __init__(self, project: str) -> None:
        self.project = project
        self.resources: list[DeclaredResource] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        self.resources.append(DeclaredResource(args.typ, args.name, inputs))
        outputs = dict(inputs)
        if args.typ == "gcp:serviceaccount/account:Account":
            email = f"{inputs['accountId']}@{self.project}.iam.gserviceaccount.com"
            outputs.update(email=email, name=f"projects/{self.project}/serviceAccounts/{email}")
        elif args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            outputs["name"] = f"projects/{self.project}/roles/{inputs['roleId']}"
        elif args.typ == "gcp:cloudrunv2/service:Service":
            outputs["uri"] = f"https://{inputs['name']}-offline.a.run.app"
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


def ensure_event_loop() -> None:
    """Pulumi's mocks run on the thread's current asyncio loop; code that ran before (a web server,
    another library's event loop) may have closed it or left none set."""
    import asyncio

    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
        if not loop.is_closed():
            return
    except RuntimeError:
        pass
    asyncio.set_event_loop(asyncio.new_event_loop())


def plan(settings: StackSettings) -> list[DeclaredResource]:
    """Every resource :func:`~infra.stack.declare_stack` declares for ``settings``, in order."""
    from infra.stack import declare_stack

    mocks = RecordingMocks(settings.project)
    ensure_event_loop()
    pulumi.runtime.set_mocks(mocks, project="marin-infra", stack="offline", preview=False)

    @pulumi.runtime.test
    def run() -> pulumi.Output:
        stack = declare_stack(settings)
        return pulumi.Output.all(stack.bucket.urn, stack.identities.web.email)

    run()
    return list(mocks.resources)


__all__ = ["DeclaredResource", "RecordingMocks", "ensure_event_loop", "plan"]
