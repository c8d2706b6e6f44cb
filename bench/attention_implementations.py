"""Forward+backward time of every attention implementation that runs on this platform.

    python bench/attention_implementations.py            # the issue's shape, bfloat16
    python bench/attention_implementations.py --tiny     # a small float32 shape a CPU runs in seconds

Default shape: batch 8 x 2048 tokens, 16 query heads, 8 kv heads, head dim 128, bfloat16, with
packed documents of 100-600 tokens (segment ids). Each implementation of
``haliax.nn.dot_product_attention`` is timed as one jitted ``jax.grad`` of the attention output
against a fixed cotangent (the median of ``--repeats`` calls after a compile/warm-up call), and
checked against a float32 masked-softmax reference on the same inputs: ``max_err_out`` and
``max_err_grad`` are the largest absolute differences of the output and of dq, dk, dv. One JSON
line per implementation; one that cannot run here prints the reason instead. ``"auto": true``
marks the one ``implementation="auto"`` would run.

On Hopper or newer NVIDIA GPUs two more lines try cuDNN's packed ("THD") layout, which describes
each row's documents by their offsets and lengths instead of a [T, T] mask. JAX exposes it only
through a private function (``jax._src.cudnn.fused_attention_stablehlo.dot_product_attention``:
``q_offsets``/``kv_offsets`` [B, M + 1], ``q_seqlen``/``kv_seqlen`` [B, M] for at most M
documents per row), so it is an experiment here, not an implementation of the library:
``cudnn_packed_experimental`` repeats the kv heads to the query heads first, and
``cudnn_packed_gqa_experimental`` passes the kv heads as they are (JAX scales the kv offsets by
the query head count, which looks wrong for GQA; ``max_err_*`` says whether it is).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="batch 2 x 256 tokens, 4/2 heads of 32, float32, documents of 20-120")
    p.add_argument("--batch", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--min-doc", type=int, help="shortest packed document, tokens")
    p.add_argument("--max-doc", type=int, help="longest packed document, tokens")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per implementation")
    p.add_argument("--implementations", nargs="*", help="only these (default: every one)")
    args = p.parse_args()
    full = {"batch": 8, "seq_len": 2048, "heads": 16, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "min_doc": 100, "max_doc": 600}
    tiny = {"batch": 2, "seq_len": 256, "heads": 4, "kv_heads": 2, "head_dim": 32, "dtype": "float32", "min_doc": 20, "max_doc": 120}
    for name, value in (tiny if args.tiny else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def packed_segment_ids(batch: int, seq_len: int, min_doc: int, max_doc: int, seed: int = 0):
    """Documents 0, 1, 2, ... per row, of lengths drawn uniformly from [min_doc, max_doc]; the last
    one is cut at the end of the window, as packing does."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        lengths = rng.integers(min_doc, max_doc + 1, size=seq_len // max(min_doc, 1) + 1)
        rows.append(np.repeat(np.arange(len(lengths)), lengths)[:seq_len])
    return np.stack(rows).astype(np.int32)


def reference(q, k, v, segment_ids):
    """float32 masked softmax attention over the whole [T, T] scores."""
    import jax.numpy as jnp

    from haliax.nn import attend, attention_mask

    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    return attend(q, k, v, attention_mask(q.shape[1], segment_ids))


def packed_layout(segment_ids, max_documents: int):
    """cuDNN's packed-layout arguments for documents that are runs of equal ids: per row the start
    of each document (padded with -1 to ``max_documents + 1``) and its length (padded with -1)."""
    import jax
    import jax.numpy as jnp

    first = jnp.ones_like(segment_ids[:, :1], dtype=bool)
    starts_here = jnp.concatenate([first, segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    document = jnp.cumsum(starts_here, axis=1) - 1
    lengths = jax.vmap(lambda d: jnp.bincount(d, length=max_documents))(document)
    valid = jnp.arange(max_documents)[None, :] <= document[:, -1:]
    seqlens = jnp.where(valid, lengths, -1).astype(jnp.int32)
    offsets = jnp.where(valid, jnp.cumsum(lengths, axis=1) - lengths, -1).astype(jnp.int32)
    offsets = jnp.concatenate([offsets, jnp.full_like(offsets[:, :1], -1)], axis=1)
    return seqlens, offsets


def cudnn_packed_attention(max_documents: int, *, repeat_kv: bool):
    import math

    import jax.numpy as jnp
    from jax._src.cudnn.fused_attention_stablehlo import MaskType
    from jax._src.cudnn.fused_attention_stablehlo import dot_product_attention as cudnn_sdpa

    def attention(q, k, v, segment_ids):
        if repeat_kv:
            group = q.shape[2] // k.shape[2]
            k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
        seqlens, offsets = packed_layout(segment_ids, max_documents)
        return cudnn_sdpa(
            q, k, v, q_seqlen=seqlens, kv_seqlen=seqlens, q_offsets=offsets, kv_offsets=offsets,
            scale=1.0 / math.sqrt(q.shape[-1]), mask_type=MaskType.PADDING_CAUSAL,
        )  # fmt: skip

    return attention


def gradient_function(attention):
    import jax
    import jax.numpy as jnp

    def loss(q, k, v, segment_ids, cotangent):
        return jnp.sum(attention(q, k, v, segment_ids).astype(jnp.float32) * cotangent)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def library_attention(q, k, v, segment_ids, *, name: str):
    from haliax.nn import dot_product_attention

    return dot_product_attention(q, k, v, segment_ids=segment_ids, implementation=name)


def main() -> None:
    args = parse_args()
    import jax
    import jax.numpy as jnp

    from haliax.nn.attention import IMPLEMENTATIONS, AttentionImplementationError, resolve_implementation
    from haliax.nn.attention_kernels import Platform

    dtype = jnp.dtype(args.dtype)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(keys[0], (args.batch, args.seq_len, args.heads, args.head_dim), dtype)
    k = jax.random.normal(keys[1], (args.batch, args.seq_len, args.kv_heads, args.head_dim), dtype)
    v = jax.random.normal(keys[2], (args.batch, args.seq_len, args.kv_heads, args.head_dim), dtype)
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    segment_ids = jnp.asarray(packed_segment_ids(args.batch, args.seq_len, args.min_doc, args.max_doc))
    inputs = (q, k, v, segment_ids, cotangent)

    platform = Platform.current()
    shape = {"seq_len": args.seq_len, "head_dim": args.head_dim, "dtype": dtype, "has_segments": True}
    auto = resolve_implementation("auto", platform, **shape)
    common = {
        "platform": platform.name, "device": jax.devices()[0].device_kind, "batch": args.batch, "seq_len": args.seq_len,
        "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": dtype.name,
        "documents_per_row": round(float(jnp.mean(segment_ids.max(axis=1) + 1)), 1),
    }  # fmt: skip

    _, expected = gradient_function(reference)(*inputs)
    expected_out = jax.jit(reference)(q, k, v, segment_ids)
    candidates = {}
    for name in IMPLEMENTATIONS[1:]:
        candidates[name] = functools.partial(library_attention, name=name)
    hopper = platform.name == "gpu" and (platform.cuda_capability or (0, 0)) >= (9, 0)
    max_documents = int(segment_ids.max()) + 1
    for name, repeat_kv in (("cudnn_packed_experimental", True), ("cudnn_packed_gqa_experimental", False)):
        candidates[name] = cudnn_packed_attention(max_documents, repeat_kv=repeat_kv) if hopper else None
    for name, attention in candidates.items():
        if args.implementations and name not in args.implementations:
            continue
        record = {"implementation": name, **common, "auto": name == auto}
        if attention is None:
            print(json.dumps({**record, "skipped": "needs an NVIDIA GPU of compute capability 9.0 or newer"}), flush=True)
            continue
        if name in IMPLEMENTATIONS:
            try:
                resolve_implementation(name, platform, **shape)
            except AttentionImplementationError as exc:
                print(json.dumps({**record, "skipped": str(exc)}), flush=True)
                continue
        step = gradient_function(attention)
        start = time.perf_counter()
        jax.block_until_ready(step(*inputs))
        compile_s = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            jax.block_until_ready(step(*inputs))
            times.append(time.perf_counter() - start)
        _, grads = step(*inputs)
        out = jax.jit(attention)(q, k, v, segment_ids)
        record.update(
            fwd_bwd_ms=round(statistics.median(times) * 1e3, 3),
            compile_s=round(compile_s, 2),
            max_err_out=float(jnp.max(jnp.abs(out.astype(jnp.float32) - expected_out))),
            max_err_grad=max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - e))) for g, e in zip(grads, expected)),
        )
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
