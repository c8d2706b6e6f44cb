"""The execution engine: steps, their identity, the runner, lazy handles and artifacts.

Modules: :mod:`~marin.execution.step_spec` (a step as data), :mod:`~marin.execution.identity`
(hashing), :mod:`~marin.execution.step_runner` (running a DAG once, in order),
:mod:`~marin.execution.step_context` (what a running step sees), :mod:`~marin.execution.lazy`
(handles that library helpers return), :mod:`~marin.execution.artifact` (typed step results) and
:mod:`~marin.execution.executor_files` (the per-step files on disk).
"""
