"""The options of a run, and the one rule that decides which source of each option wins.

Sources, strongest first:

1. the launcher's :class:`RunOverrides`: what the person at the terminal just asked ``marin run``
   for (a ``--dry-run`` that the script could silently undo would be dangerous);
2. the arguments of ``StepRunner.run(...)``;
3. the arguments of ``StepRunner(...)`` (``prefix``, ``strict``);
4. the defaults (``prefix``: :func:`rigging.config.discovery.discover_config`).

How overrides reach a script's runner. ``marin run script.py --dry-run`` cannot add arguments to
the script's own ``StepRunner().run(steps)`` call. So the command builds a :class:`RunOverrides`
and runs the script inside ``with launch(overrides):``, which holds them in a context variable
for exactly that block (reset on the way out, error or not). ``StepRunner(overrides=None)`` takes
the launch's overrides when it is constructed, and counts its runs on the launch, which is how
the command notices a script that never ran anything. A runner given ``overrides=`` explicitly
uses those instead. Nothing is process-global: under plain ``python`` there is no launch and the
script's arguments apply, and a thread the script starts itself begins with an empty context, so
runners it builds see no overrides unless it was started in a copy of the launch's context
(``contextvars.copy_context().run``).

A launch can also take the script's steps instead of running them (``launch(..., take_run=f)``):
every ``StepRunner.run(steps)`` of the script then returns ``f(runner, steps)`` and runs nothing.
``marin reproduce`` reads which steps a script declares, and under which prefix, that way.

The launch also carries the script's settings (``marin run --config NAME=FILE --set NAME.key=value``)
to :func:`marin.experiment.config.script_config`, which records each NAME it was asked for. The
script's first ``StepRunner.run`` refuses settings for a NAME not read by then, before planning
anything (a typo would otherwise run the default, and be found out only after the whole run); the
command refuses them again at the end for a script that never ran anything.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from marin.errors import MarinError

# Used when max_concurrent is None: enough for wide DAGs of small steps, bounded so a 10,000-wide
# fan-out does not start 10,000 threads at once.
DEFAULT_MAX_CONCURRENT = 32


class RunOptionError(MarinError, ValueError):
    """An option of ``run`` that cannot be used (bad ``run_only`` pattern, ``max_concurrent`` < 1)."""


class ConfigError(MarinError, ValueError):
    """A setting that cannot be applied to a config: unknown key, wrong type, unreadable file."""


@dataclass(frozen=True)
class RunOverrides:
    """Options imposed on every run of a launch; ``None`` means "not given"."""

    prefix: str | None = None
    dry_run: bool | None = None
    force_run_failed: bool | None = None
    run_only: str | None = None
    max_concurrent: int | None = None
    strict: bool | None = None
    # The script's settings: ``NAME.key=value`` strings, and (NAME, YAML file) pairs.
    settings: tuple[str, ...] = ()
    config_files: tuple[tuple[str, str], ...] = ()


@dataclass
class Launch:
    """One ``marin run`` of a script: the overrides it imposes, how many runs the script started and
    which settings names it read."""

    overrides: RunOverrides
    runs_started: int = 0
    configs_read: set[str] = field(default_factory=set)
    # ``f(runner, steps)``: what each run of the script returns instead of running (see the module docstring).
    take_run: Callable[[Any, list[Any]], Any] | None = None

    def unread_config_names(self) -> list[str]:
        """Names given settings on the command line that the script never asked for."""
        given = {setting.partition(".")[0] for setting in self.overrides.settings}
        given |= {name for name, _ in self.overrides.config_files}
        return sorted(given - self.configs_read)

    def refuse_unread_settings(self) -> None:
        """Refuse settings for a name the script has not read by its first run: run then, they would
        be ignored (a typo running the default), and found out only after every step had run."""
        unread = self.unread_config_names()
        if unread:
            read = ", ".join(sorted(self.configs_read)) or "none"
            raise ConfigError(
                f"settings were given for {', '.join(unread)}, which the script did not read before its first "
                f"StepRunner.run (it asked script_config for: {read}); nothing was run."
            )


_current_launch: contextvars.ContextVar[Launch | None] = contextvars.ContextVar("marin_launch", default=None)


@contextlib.contextmanager
def launch(overrides: RunOverrides, *, take_run: Callable[[Any, list[Any]], Any] | None = None) -> Iterator[Launch]:
    """Runners constructed inside the block take ``overrides``, and hand their steps to ``take_run``
    when it is given (see the module docstring)."""
    current = Launch(overrides, take_run=take_run)
    token = _current_launch.set(current)
    try:
        yield current
    finally:
        _current_launch.reset(token)


def current_launch() -> Launch | None:
    return _current_launch.get()


def current_overrides() -> RunOverrides:
    """The overrides of the launch in progress, or none."""
    active = _current_launch.get()
    return active.overrides if active is not None else RunOverrides()


@dataclass(frozen=True)
class RunOptions:
    """The options one ``run`` uses, each decided once."""

    dry_run: bool
    force_run_failed: bool
    run_only: str | None
    max_concurrent: int
    strict: bool


def resolve_options(
    overrides: RunOverrides,
    *,
    dry_run: bool | None,
    force_run_failed: bool | None,
    run_only: str | None,
    max_concurrent: int | None,
    strict: bool | None,
    runner_strict: bool,
) -> RunOptions:
    """Each option from the strongest source that gives it: overrides, then ``run``'s arguments,
    then the runner's, then the default."""
    concurrency = _first(overrides.max_concurrent, max_concurrent)
    if concurrency is not None and concurrency < 1:
        raise RunOptionError(f"max_concurrent must be at least 1 (or None for the default, {DEFAULT_MAX_CONCURRENT}), got {concurrency}.")
    return RunOptions(
        dry_run=bool(_first(overrides.dry_run, dry_run, False)),
        force_run_failed=bool(_first(overrides.force_run_failed, force_run_failed, True)),
        run_only=_first(overrides.run_only, run_only),
        max_concurrent=concurrency or DEFAULT_MAX_CONCURRENT,
        strict=bool(_first(overrides.strict, strict, runner_strict)),
    )


def _first(*values):
    return next((value for value in values if value is not None), None)
