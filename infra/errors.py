"""The base class of the errors ``infra`` raises on purpose (see :mod:`rigging.errors`)."""

from __future__ import annotations

from rigging.errors import ExplainedError


class InfraError(ExplainedError):
    """Base of the errors raised by ``infra``: stack settings that cannot be provisioned."""


class StackSettingsError(InfraError, ValueError):
    """A stack setting no cloud would accept (unknown GPU or TPU type, a bad bucket name, ...);
    raised before any resource is declared, naming the field."""


class MissingExtraError(InfraError, ImportError):
    """A command that needs the ``infra`` extra's packages, run without them; says what to install."""
