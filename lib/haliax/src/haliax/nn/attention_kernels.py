"""Fused attention kernels for accelerators, behind the contract of ``dot_product_attention``.

Each kernel computes causal self-attention restricted to equal segment ids (packed documents never
see each other), with grouped-query attention, on ``q`` [B, T, H, D] and ``k``, ``v``
[B, T, KV, D]; the result equals ``attend(q, k, v, attention_mask(T, segment_ids))`` up to
rounding. They differ in what they need from the platform, shape and dtype (each has a
``*_unsupported`` check that returns the reason it cannot run, or ``None``) and in how they are
told about documents:

- ``cudnn_attention``: cuDNN's fused flash attention through ``jax.nn.dot_product_attention``.
  Causality is the kernel's own (it skips the upper triangle); documents are a boolean
  [B, 1, T, T] mask, which cuDNN applies as an additive bias. GQA is native.
- ``pallas_gpu_attention``: JAX's Pallas (Triton) flash attention, which takes segment ids
  directly. It has no GQA, so keys and values are repeated to the query heads.
- ``splash_attention``: JAX's Pallas TPU splash attention with a causal mask and segment ids;
  GQA is native.

The Pallas kernels have no sharding rule of their own; under ``haliax.partitioning.use_mesh``
they run per shard (``jax.shard_map``) over the batch and, where both q and kv heads are split
alike, the heads.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from haliax.axes import BATCH, HEAD_DIM, HEADS, KV_HEADS, SEQ
from haliax.partitioning import current_mesh, partition_spec

# cuDNN's flash attention: Ampere or newer; head dims up to 128, or 256 from Hopper on.
CUDNN_MIN_CAPABILITY = (8, 0)
CUDNN_WIDE_HEAD_CAPABILITY = (9, 0)
# Pallas GPU: query/key blocks of 16 rows at least (Triton's smallest matmul tile), up to 128.
PALLAS_GPU_BLOCKS = (128, 64, 32, 16)
PALLAS_GPU_BACKWARD_BLOCK = 32
# Splash: key blocks must be multiples of the TPU's 128 lanes; larger blocks run faster, up to
# 1024 (2048 runs out of the kernel's scoped VMEM). With the fused backward (one kernel computing
# dq, dk and dv from one recomputation of the scores) forward + backward at llama_600m's shape
# (batch 8 x 2048, 16 heads and 8 KV heads of 64, packed documents) took 6.07 ms on a TPU v5e,
# against 8.54 ms with blocks of 512 and the split backward (bench/tpu_kernels.py --only splash).
SPLASH_BLOCKS = (1024, 512, 256, 128)
# What the splash kernel names its output and softmax statistics for ``jax.checkpoint`` policies:
# a policy that saves this name keeps the backward from rerunning the forward kernel. The same name
# as the models' attention output (levanter.models.transformer.ATTENTION_CHECKPOINT).
SPLASH_RESIDUALS_NAME = "attention"


@dataclass(frozen=True)
class Platform:
    """Where attention will run: ``name`` is ``"cpu"``, ``"gpu"`` or ``"tpu"``;
    ``cuda_capability`` is the NVIDIA compute capability (``(9, 0)`` on an H100/H200), ``None``
    off CUDA."""

    name: str
    cuda_capability: tuple[int, int] | None = None

    @classmethod
    def current(cls) -> Platform:
        """The platform of the active ``use_mesh`` mesh, else of JAX's default devices."""
        active = current_mesh()
        device = active[0].devices.flat[0] if active is not None else jax.devices()[0]
        return cls(device.platform, _cuda_capability(device))


def _cuda_capability(device) -> tuple[int, int] | None:
    """``(major, minor)`` from a CUDA device's ``compute_capability`` ("9.0"); None for any other
    device (ROCm reports names such as "gfx90a")."""
    parts = str(getattr(device, "compute_capability", "")).split(".")
    if len(parts) != 2 or not all(part.isdigit() for part in parts):
        return None
    return int(parts[0]), int(parts[1])


# -- cuDNN --------------------------------------------------------------------------------------


def cudnn_unsupported(platform: Platform, *, seq_len: int, head_dim: int, dtype, has_segments: bool) -> str | None:
    if platform.name != "gpu" or platform.cuda_capability is None:
        return "cuDNN runs only on NVIDIA (CUDA) GPUs"
    if platform.cuda_capability < CUDNN_MIN_CAPABILITY:
        return f"cuDNN flash attention needs compute capability 8.0 or newer, this GPU has {platform.cuda_capability}"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"cuDNN flash attention takes bfloat16 or float16 inputs, got {jnp.dtype(dtype).name}"
    max_head_dim = 256 if platform.cuda_capability >= CUDNN_WIDE_HEAD_CAPABILITY else 128
    if head_dim % 8 or head_dim > max_head_dim:
        return f"cuDNN flash attention needs a head dim that is a multiple of 8 and at most {max_head_dim}, got {head_dim}"
    if has_segments and seq_len % 2:
        return f"cuDNN flash attention with a document mask needs an even sequence length, got {seq_len}"
    return None


def cudnn_call_arguments(segment_ids: jax.Array | None) -> dict:
    """The keyword arguments that make ``jax.nn.dot_product_attention`` compute our attention:
    causal, and with ``segment_ids`` a [B, 1, T, T] mask of same-document pairs (cuDNN has no
    segment ids of its own). The default scale, 1/sqrt(head_dim), is ours.

    Kept apart from the call so that the arguments can be checked on any platform with
    ``implementation="xla"``, which gives the same semantics.
    """
    arguments: dict = {"is_causal": True}
    if segment_ids is not None:
        arguments["mask"] = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    return arguments


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, **cudnn_call_arguments(segment_ids), implementation="cudnn")


# -- Pallas GPU (Triton) ------------------------------------------------------------------------


def _import_optional(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@functools.cache
def _pallas_gpu_module():
    return _import_optional("jax.experimental.pallas.ops.gpu.attention")


def pallas_gpu_unsupported(platform: Platform, *, seq_len: int, head_dim: int, dtype, has_segments: bool) -> str | None:
    del has_segments
    if platform.name != "gpu":
        return "the Pallas GPU kernel runs only on GPUs"
    if _pallas_gpu_module() is None:
        return "this JAX has no jax.experimental.pallas.ops.gpu.attention"
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"the Pallas GPU kernel takes floating-point inputs, got {jnp.dtype(dtype).name}"
    if _dividing_block(seq_len, PALLAS_GPU_BLOCKS) is None:
        return f"the Pallas GPU kernel needs a sequence length that is a multiple of 16, got {seq_len}"
    if not 16 <= head_dim <= 256:
        return f"the Pallas GPU kernel needs a head dim from 16 to 256, got {head_dim}"
    return None


def pallas_gpu_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, *, interpret: bool = False
) -> jax.Array:
    """``interpret=True`` runs the kernel's Python semantics on any platform (slowly): for tests."""
    triton_attention = _pallas_gpu_module()
    seq_len, head_dim = q.shape[1], q.shape[3]
    block = _dividing_block(seq_len, PALLAS_GPU_BLOCKS)
    backward = min(block, PALLAS_GPU_BACKWARD_BLOCK)
    block_sizes = triton_attention.BlockSizes(
        block_q=block, block_k=block, block_q_dkv=backward, block_kv_dkv=backward, block_q_dq=backward, block_kv_dq=backward
    )

    def kernel(q, k, v, segment_ids):
        # No GQA in this kernel: query head h reads kv head h // group, so repeat each kv head.
        group = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        return triton_attention.mha(
            q, k, v, segment_ids, sm_scale=1.0 / math.sqrt(head_dim), causal=True, block_sizes=block_sizes, interpret=interpret
        )

    return _per_shard(kernel, q, k, v, _as_int32(segment_ids))


# -- Splash (TPU) -------------------------------------------------------------------------------


@functools.cache
def _splash_modules():
    kernel = _import_optional("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel")
    mask = _import_optional("jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_mask")
    return None if kernel is None or mask is None else (kernel, mask)


def splash_unsupported(platform: Platform, *, seq_len: int, head_dim: int, dtype, has_segments: bool) -> str | None:
    del head_dim, has_segments
    if platform.name != "tpu":
        return "splash attention runs only on TPUs"
    if _splash_modules() is None:
        return "this JAX has no jax.experimental.pallas.ops.tpu.splash_attention"
    if not jnp.issubdtype(dtype, jnp.floating):
        return f"splash attention takes floating-point inputs, got {jnp.dtype(dtype).name}"
    if _dividing_block(seq_len, SPLASH_BLOCKS) is None:
        return f"splash attention needs a sequence length that is a multiple of 128, got {seq_len}"
    return None


@functools.lru_cache(maxsize=32)
def _splash_kernel(seq_len: int, num_heads: int, block: int, interpret: bool, logit_softcap: float | None = None):
    """The kernel for one shape: its block-sparsity tables are computed from the causal mask with
    numpy when it is made, so it is made once per shape, as concrete arrays (not values of the
    trace that first asked for it) so that later traces can share it."""
    splash, masks = _splash_modules()
    causal = masks.MultiHeadMask([masks.CausalMask((seq_len, seq_len)) for _ in range(num_heads)])
    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        use_fused_bwd_kernel=True,
    )  # fmt: skip
    with jax.ensure_compile_time_eval():
        return splash.make_splash_mha_single_device(
            causal, block_sizes=sizes, interpret=interpret, attn_logits_soft_cap=logit_softcap,
            residual_checkpoint_name=SPLASH_RESIDUALS_NAME,
        )


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    *,
    block_size: int | None = None,
    interpret: bool = False,
    logit_softcap: float | None = None,
) -> jax.Array:
    """``block_size`` (a multiple of 128 dividing T) defaults to the largest of ``SPLASH_BLOCKS``
    that divides T. ``interpret=True`` runs the kernel's Python semantics on any platform: for tests.
    ``logit_softcap``: the kernel's own soft-capping of the (scaled) scores."""
    splash, _ = _splash_modules()
    seq_len, head_dim = q.shape[1], q.shape[3]
    block = block_size or _dividing_block(seq_len, SPLASH_BLOCKS)
    scale = 1.0 / math.sqrt(head_dim)

    def kernel(q, k, v, segment_ids):
        # The kernel is per example, heads first ([H, T, D] over [KV, T, D]; query head h reads kv
        # head h // group), and leaves the scaling of the scores to its caller.
        run = _splash_kernel(seq_len, q.shape[2], block, interpret, logit_softcap)
        q = jnp.swapaxes(q * jnp.asarray(scale, q.dtype), 1, 2)
        k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
        if segment_ids is None:
            out = jax.vmap(run)(q, k, v)
        else:
            out = jax.vmap(lambda q, k, v, s: run(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(q, k, v, segment_ids)
        return jnp.swapaxes(out, 1, 2)

    precision = _mosaic_precision(q.dtype)
    if precision is not None:
        kernel = _traced_at_precision(kernel, precision)
    return _per_shard(kernel, q, k, v, _as_int32(segment_ids))


def _mosaic_precision(dtype) -> str | None:
    """The matmul precision to trace the splash kernel under, where the one asked for cannot compile
    (None: the asked one can).

    Mosaic contracts at two precisions only, its default and "highest" (float32), and 16-bit
    operands at its default only: under ``jax.default_matmul_precision("highest")`` a bfloat16
    kernel fails with "Bad lhs type". Products of 16-bit operands are exact in the float32
    accumulator, so for them the default computes what was asked; float32 operands asked for any
    precision above the default ("high", "tensorfloat32", ...) get "highest", at least as precise.
    """
    asked = jax.config.jax_default_matmul_precision
    if asked in (None, "default", "bfloat16", "fastest"):
        return None
    if jnp.dtype(dtype).itemsize <= 2:
        return "default"
    return None if asked in ("highest", "float32") else "highest"


def _traced_at_precision(kernel: Callable, precision: str) -> Callable:
    """``kernel`` with its forward and its backward both traced under ``precision``.

    The backward of a ``custom_vjp`` is traced when the gradient is taken, after the forward's trace
    has returned, so a context around the call alone would not reach it.
    """

    def forward(q, k, v, segment_ids):
        with jax.default_matmul_precision(precision):
            out, backward = jax.vjp(lambda q, k, v: kernel(q, k, v, segment_ids), q, k, v)
        return out, (backward, segment_ids)

    def backward(residuals, cotangent):
        backward_of_kernel, segment_ids = residuals
        with jax.default_matmul_precision(precision):
            dq, dk, dv = backward_of_kernel(cotangent)
        return dq, dk, dv, None if segment_ids is None else np.zeros(segment_ids.shape, jax.dtypes.float0)

    @jax.custom_vjp
    def run(q, k, v, segment_ids):
        with jax.default_matmul_precision(precision):
            return kernel(q, k, v, segment_ids)

    run.defvjp(forward, backward)
    return run


# -- shared -------------------------------------------------------------------------------------


def _dividing_block(seq_len: int, candidates: tuple[int, ...]) -> int | None:
    """The first (largest) candidate block length that divides ``seq_len``."""
    return next((block for block in candidates if seq_len % block == 0), None)


def _as_int32(segment_ids: jax.Array | None) -> jax.Array | None:
    return None if segment_ids is None else segment_ids.astype(jnp.int32)


def _per_shard(kernel: Callable, q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """``kernel(q, k, v, segment_ids)``, run on each device's shard under an active mesh.

    The batch is split as the mesh rules say; heads only where q heads and kv heads split alike
    (then each shard holds whole GQA groups); sequence and head dim stay whole.
    """
    active = current_mesh()
    if active is None:
        return kernel(q, k, v, segment_ids)
    mesh, rules = active
    q_spec = partition_spec((BATCH, SEQ, HEADS, HEAD_DIM), q.shape, mesh, rules)
    kv_spec = partition_spec((BATCH, SEQ, KV_HEADS, HEAD_DIM), k.shape, mesh, rules)
    batch = q_spec[0] if q_spec[0] == kv_spec[0] else None
    heads = q_spec[2] if q_spec[2] == kv_spec[2] else None
    if batch is None and heads is None:
        return kernel(q, k, v, segment_ids)
    qkv = PartitionSpec(batch, None, heads, None)
    if segment_ids is None:
        def per_shard(q, k, v):
            return kernel(q, k, v, None)

        return jax.shard_map(per_shard, mesh=mesh, in_specs=(qkv, qkv, qkv), out_specs=qkv, check_vma=False)(q, k, v)
    in_specs = (qkv, qkv, qkv, PartitionSpec(batch, None))
    return jax.shard_map(kernel, mesh=mesh, in_specs=in_specs, out_specs=qkv, check_vma=False)(q, k, v, segment_ids)


UNSUPPORTED_CHECKS = {
    "cudnn": cudnn_unsupported,
    "pallas_gpu": pallas_gpu_unsupported,
    "splash": splash_unsupported,
}
KERNELS = {
    "cudnn": cudnn_attention,
    "pallas_gpu": pallas_gpu_attention,
    "splash": splash_attention,
}
