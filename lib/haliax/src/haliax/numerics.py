"""How precisely a matrix product is computed here: the relative rounding of its operands.

A float32 matmul is not float32 arithmetic everywhere. At JAX's default precision a TPU rounds
float32 operands to bfloat16 (8 significant bits) before its matrix units multiply them, and an
NVIDIA GPU from Ampere on rounds them to TensorFloat-32 (11 bits); ``jax.default_matmul_precision``
("highest", "high", ...) asks for more. Comparisons of results computed by matmuls must therefore
allow what the platform and precision in force actually do, not what one machine printed:
:func:`matmul_rounding` is that unit, to multiply by the size of the reductions involved.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Unit roundoff (half the spacing at 1) of the formats operands are rounded to.
_BFLOAT16 = 2.0**-8
_TENSORFLOAT32 = 2.0**-11
# Three bfloat16 passes ("high" on a TPU, bf16_3x) leave about 16 significant bits.
_BFLOAT16_3X = 2.0**-16


def matmul_rounding(dtype=jnp.float32, platform: str | None = None, precision: str | None = None) -> float:
    """The relative rounding of one operand of a ``dtype`` matmul on ``platform`` at ``precision``.

    ``platform``: "cpu", "gpu" or "tpu" (default: where JAX computes now, the active mesh's
    platform first); ``precision``: a ``jax.default_matmul_precision`` value (default: the one in
    force). 16-bit operands are exact as given: their own unit roundoff is returned. The products'
    float32 accumulation adds about ``float32 eps`` per term on top, which is negligible beside
    bfloat16 and is covered by the reduction-size factor callers apply.
    """
    dtype = jnp.dtype(dtype)
    if dtype.itemsize <= 2:
        return float(jnp.finfo(dtype).eps) / 2
    if platform is None:
        from haliax.nn.attention_kernels import Platform

        platform = Platform.current().name
    if precision is None:
        precision = jax.config.jax_default_matmul_precision
    float32 = float(jnp.finfo(jnp.float32).eps) / 2
    if precision in ("highest", "float32") or platform == "cpu":
        return float32
    if platform == "tpu":
        return _BFLOAT16_3X if precision in ("high", "bfloat16_3x", "tensorfloat32") else _BFLOAT16
    if platform == "gpu":
        return _TENSORFLOAT32 if precision in (None, "default", "high", "tensorfloat32") else _BFLOAT16
    return float32
