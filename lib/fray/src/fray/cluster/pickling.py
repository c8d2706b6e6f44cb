"""Shipping code to workers: cloudpickle sends functions and classes *by reference* when their module
is importable here, and the worker imports that module again. A module the workers cannot import
(a test file, a notebook helper outside the project's packages) must travel *by value* instead.
"""

from __future__ import annotations

import sys
import types

import cloudpickle

_by_value: dict[str, types.ModuleType] = {}


def ship_by_value(module: types.ModuleType | str) -> None:
    """Send the functions and classes of ``module`` with their code, for every backend.

    Call it once, before submitting work, for a module that worker processes or Ray nodes cannot
    import. Cheap to repeat.
    """
    if isinstance(module, str):
        module = sys.modules[module]
    if module.__name__ in _by_value:
        return
    _by_value[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    if "ray" in sys.modules:
        apply_to_ray()


def apply_to_ray() -> None:
    """Ray pickles with its own copy of cloudpickle; register the same modules there."""
    import ray.cloudpickle

    for module in _by_value.values():
        try:
            ray.cloudpickle.register_pickle_by_value(module)
        except ValueError:
            pass  # already registered
