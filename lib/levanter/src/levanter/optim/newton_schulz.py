"""The Newton-Schulz iteration that maps a matrix ``G = U S Vᵀ`` to (nearly) ``U Vᵀ``, its nearest
semi-orthogonal matrix: the steepest-descent direction under the spectral norm. Muon and Scion
apply it to their momentum.

The quintic ``X <- a X + b (X Xᵀ) X + c (X Xᵀ)² X`` with Keller Jordan's coefficients pushes every
singular value into roughly [0.7, 1.2] in five steps rather than converging exactly, which costs
nothing in training and saves steps. The input is first scaled to Frobenius norm 1 so that every
singular value starts at most 1. Computed in float32 whatever the input dtype (the PyTorch
implementations run it in bfloat16 for speed on GPUs; on TPUs JAX's default matmul precision
already uses bfloat16 passes for float32 products).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

KELLER_JORDAN_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    x: jax.Array,
    *,
    steps: int = 5,
    coefficients: tuple[float, float, float] = KELLER_JORDAN_COEFFICIENTS,
    eps: float = 1e-7,
) -> jax.Array:
    """``x`` (``[..., m, n]``) with its singular values pushed towards 1, one matrix per leading index."""
    a, b, c = coefficients
    dtype = x.dtype
    x = x.astype(jnp.float32)
    wide = x.shape[-2] <= x.shape[-1]
    if not wide:  # iterate on the short side: (X Xᵀ) is then the smaller Gram matrix
        x = jnp.swapaxes(x, -1, -2)
    norm = jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True))
    x = x / jnp.maximum(norm, eps)
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * gram @ gram) @ x
    if not wide:
        x = jnp.swapaxes(x, -1, -2)
    return x.astype(dtype)
