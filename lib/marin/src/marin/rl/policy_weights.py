"""The policy's weights on their way from the trainer to the rollout workers, by version.

The trainer publishes its live weights as training starts and every ``sync_every`` steps after
(a :class:`levanter.trainer.hooks.ModelPublisher`); a version is the number of training steps behind
the weights. :class:`WeightBoard` keeps the latest version as host arrays (a copy: the trainer's
next step reuses its buffers), and the samplers wait there for a version recent enough for the batch
they are about to sample. A worker turns the arrays back into a model with :func:`model_from_weights`,
over a skeleton of the model built from its config without computing anything.

The arrays travel as numpy: by reference to a worker in the trainer's process, pickled to one in
another process or on another machine (fine for the models RL runs on a CPU; a large model's
weights would want a transfer that does not go through the driver).
"""

from __future__ import annotations

import threading
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from levanter.trainer.hooks import ModelPublisher
from levanter.trainer.mixed_precision import cast_floating
from marin.errors import MarinError


class WeightsClosedError(MarinError, RuntimeError):
    """The run stopped while a sampler waited for weights."""


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray))


def host_weights(model: Any) -> Any:
    """``model``'s arrays, copied to host memory, in a tree shaped like the model (None elsewhere)."""
    arrays = eqx.filter(model, _is_array)
    return jax.tree.map(lambda x: np.array(x), arrays)


def model_skeleton(model_config: Any, vocab_size: int) -> Any:
    """The model's structure without its arrays: what :func:`model_from_weights` fills in."""
    shapes = eqx.filter_eval_shape(lambda key: model_config.build(vocab_size, key=key), jax.random.PRNGKey(0))
    return _without_arrays(shapes)


def _without_arrays(model: Any) -> Any:
    return eqx.partition(model, _is_array)[1]


def model_from_weights(skeleton: Any, arrays: Any, compute_dtype: Any) -> Any:
    """The model from its skeleton and published arrays, floating arrays in ``compute_dtype``."""
    return eqx.combine(cast_floating(jax.tree.map(jnp.asarray, arrays), compute_dtype), skeleton)


def sampling_copy(model: Any, compute_dtype: Any) -> Any:
    """``model`` placed as a rollout worker holds it (:func:`model_from_weights` of its host arrays).

    The trainer's model lies on the training mesh; a generation engine handed it compiles programs
    for that placement. A copy on the default device, like the workers' and like a model read from
    disk, lets the engines that sample these weights share their compiled programs.
    """
    return model_from_weights(_without_arrays(model), host_weights(model), compute_dtype)


class WeightBoard:
    """The latest published weights and their version; thread-safe (see the module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version: int | None = None
        self._arrays: Any = None
        self._closed = False

    def publish(self, model: Any, step: int) -> None:
        arrays = host_weights(model)
        with self._cond:
            self._version, self._arrays = step, arrays
            self._cond.notify_all()

    def publisher(self, every: int) -> ModelPublisher:
        return ModelPublisher("weight sync", self.publish, every=every)

    def wait_for(self, version: int, timeout: float | None = None) -> tuple[int, Any]:
        """The latest ``(version, arrays)`` once a version of at least ``version`` is published."""
        with self._cond:
            ready = self._cond.wait_for(lambda: self._closed or (self._version is not None and self._version >= version), timeout)
            if self._closed:
                raise WeightsClosedError("the run stopped while waiting for new weights")
            if not ready:
                raise TimeoutError(f"no weights of version >= {version} were published within {timeout} s")
            return self._version, self._arrays

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


__all__ = ["WeightBoard", "WeightsClosedError", "host_weights", "model_from_weights", "model_skeleton",
           "sampling_copy"]
