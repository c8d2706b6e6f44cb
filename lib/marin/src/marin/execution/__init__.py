"""The execution engine: steps declared as data, run once each in dependency order, cached by identity.

The four public modules sit here: :mod:`~marin.execution.step_spec` (a step as data: the one step
type), :mod:`~marin.execution.lazy` (the handles library helpers return),
:mod:`~marin.execution.step_runner` (``StepRunner().run(steps)``) and
:mod:`~marin.execution.artifact` (typed step results). The rest is grouped by the question each
part answers, lowest first; a part imports only from those below it (a contract in
``pyproject.toml`` checks this):

* :mod:`~marin.execution.hashing`: what makes a step the same step (identity, code fingerprint);
* :mod:`~marin.execution.records`: what a step and a run leave behind (step folder files, run report);
* :mod:`~marin.execution.planning`: what a run will do (graph, plan, reuse, run options);
* :mod:`~marin.execution.ownership`: who owns a step's folder now (fencing, resumable state, stopping);
* :mod:`~marin.execution.running`: where a step's function runs (executors, context, iris jobs);
* :mod:`~marin.execution.scheduling`: when each step is attempted (scheduler, one attempt, slots);
* :mod:`~marin.execution.reproducibility`: is it the same again (explain, reproduce, comparisons);
* :mod:`~marin.execution.command_line`: the ``marin`` subcommands.

``docs/engine.md`` maps what flows between them for one step.
"""
