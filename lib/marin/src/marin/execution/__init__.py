"""The execution engine: steps, their identity, the runner, lazy handles and artifacts.

Modules: :mod:`~marin.execution.step_spec` (a step as data: the one step type),
:mod:`~marin.execution.identity` (hashing), :mod:`~marin.execution.lazy` (the handles library
helpers return), :mod:`~marin.execution.step_graph` (collecting a run's steps),
:mod:`~marin.execution.step_runner` (planning and scheduling a DAG, once, in order),
:mod:`~marin.execution.step_attempt` (one step under its lease),
:mod:`~marin.execution.output_reuse` (when an existing output may be reused),
:mod:`~marin.execution.run_report` (what a run did), :mod:`~marin.execution.step_failures` (how
a failure is shown), :mod:`~marin.execution.run_defaults` (a run's options and ``marin run``'s
overrides), :mod:`~marin.execution.interrupts` (Ctrl-C and SIGTERM),
:mod:`~marin.execution.step_context` (what a running step sees),
:mod:`~marin.execution.artifact` (typed step results) and :mod:`~marin.execution.executor_files`
(the per-step files on disk).
"""
