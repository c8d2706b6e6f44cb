"""Long-context training speed on CPU: masked full attention vs blocked causal attention, and the
plain vs fused (blocked) cross-entropy, for ``llama_nano`` at batch 4 x seq_len 2048.

    python bench/attention_long_context.py             # attention alone + whole train steps
    python bench/attention_long_context.py --sweep     # also: block size vs seq_len (crossover)

"reference" is the attention used before blocking: one ``jax.nn.dot_product_attention`` over the
whole [T, T] scores with a segment mask and ``is_causal``. "blocked" is
``haliax.nn.dot_product_attention`` (its default block size for T), which with packed documents
also limits blocks to a window of recent keys when their documents allow; "without document
windows" turns that off (every block attends to all keys before it). Attention alone times
forward+backward of one layer's attention; a train step is forward, backward and an AdamW update
of the whole model, jitted, in float32, with packed documents (segment ids). Each figure is the
median of timed repetitions after a compile/warm-up call. The last line printed is one JSON
object with every figure in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=4063)
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per figure")
    p.add_argument("--mean-doc-len", type=int, default=200,
                   help="mean packed document length in tokens (the tutorial's built-in stories: ~200)")
    p.add_argument("--sweep", action="store_true", help="also time block sizes over sequence lengths")
    return p.parse_args()


def configure_cpu() -> None:
    # One CPU device using every core; must be set before jax starts.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags.split() if "force_host_platform_device_count" not in f)


def median_seconds(fn, *args, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(*args))  # compile + warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reference_attention(q, k, v, *, segment_ids=None, implementation=None):
    """Masked full attention: the implementation before blocking. (``implementation``, which the
    model passes from its config, is ignored.)"""
    import jax

    mask = None if segment_ids is None else (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)


def packed_segment_ids(batch: int, seq_len: int, mean_doc_len: int = 200, seed: int = 0):
    """Document ids 0, 1, 2, ... per row, as packing stories into windows gives."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        lengths = rng.integers(mean_doc_len // 2, mean_doc_len * 3 // 2, size=seq_len)
        rows.append(np.repeat(np.arange(seq_len), lengths)[:seq_len])
    return np.stack(rows).astype(np.int32)


def attention_fwd_bwd(attention, block_size=None):
    import jax
    import jax.numpy as jnp

    kwargs = {} if block_size is None else {"block_size": block_size}

    def loss(q, k, v, segment_ids):
        return jnp.sum(attention(q, k, v, segment_ids=segment_ids, **kwargs) ** 2)

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def time_attention(batch, seq_len, heads, head_dim, repeats, attention, block_size=None, mean_doc_len=200):
    import jax
    import jax.numpy as jnp

    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(kq, (batch, seq_len, heads, head_dim))
    k = jax.random.normal(kk, (batch, seq_len, heads, head_dim))
    v = jax.random.normal(kv, (batch, seq_len, heads, head_dim))
    segment_ids = jnp.asarray(packed_segment_ids(batch, seq_len, mean_doc_len))
    return median_seconds(attention_fwd_bwd(attention, block_size), q, k, v, segment_ids, repeats=repeats)


def time_train_step(args, *, attention, fused_loss: bool) -> float:
    import dataclasses

    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import levanter.models.transformer as transformer
    from experiments.llama import llama_nano
    from haliax.nn import dot_product_attention
    from levanter.trainer.state import TrainState
    from levanter.trainer.step import DeviceBatch, build_step_functions

    # The model looks the attention function up in its module at trace time.
    transformer.dot_product_attention = attention
    try:
        config = llama_nano if args.seq_len <= llama_nano.max_seq_len else dataclasses.replace(llama_nano, max_seq_len=args.seq_len)
        model = config.build(args.vocab, key=jax.random.PRNGKey(0))
        params, static = eqx.partition(model, eqx.is_inexact_array)
        optimizer = optax.adamw(3e-4, weight_decay=0.1)
        steps = build_step_functions(
            static_model=static, optimizer=optimizer, lr_schedule=lambda step: 3e-4, compute_dtype=jnp.float32,
            z_loss_weight=1e-4, num_microbatches=1, fused_loss=fused_loss,
        )
        rng = np.random.default_rng(0)
        tokens = rng.integers(0, args.vocab, size=(args.batch, args.seq_len)).astype(np.int32)
        batch = DeviceBatch(
            tokens=jnp.asarray(tokens),
            loss_mask=jnp.ones(tokens.shape, jnp.float32),
            segment_ids=jnp.asarray(packed_segment_ids(args.batch, args.seq_len, args.mean_doc_len)),
        )
        state = TrainState(step=jnp.int32(0), params=params, opt_state=optimizer.init(params), key=jax.random.PRNGKey(1))
        state, _ = steps.train_step(state, batch)  # compile + warm-up
        jax.block_until_ready(state)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            state, metrics = steps.train_step(state, batch)
            jax.block_until_ready((state, metrics))
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        transformer.dot_product_attention = dot_product_attention


def nano_heads() -> tuple[int, int]:
    """(heads, head_dim) of ``llama_nano``: the attention the tutorial trains."""
    from experiments.llama import llama_nano

    return llama_nano.num_heads, llama_nano.head_dim


def sweep(args) -> dict:
    from haliax.nn import dot_product_attention

    results = {}
    for seq_len in (128, 256, 512, 1024, 2048, 4096):
        batch = max(1, args.batch * args.seq_len // seq_len)  # same number of tokens
        row = {"full": time_attention(batch, seq_len, *nano_heads(), args.repeats, dot_product_attention, seq_len)}
        row["reference"] = time_attention(batch, seq_len, *nano_heads(), args.repeats, reference_attention)
        for block in (32, 64, 128, 256, 512):
            if block < seq_len:
                row[str(block)] = time_attention(batch, seq_len, *nano_heads(), args.repeats, dot_product_attention, block)
        results[seq_len] = row
        print(f"T={seq_len:5d} B={batch:3d}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in row.items()), file=sys.stderr)
    return results


def main() -> None:
    args = parse_args()
    configure_cpu()
    from haliax.nn import dot_product_attention
    from haliax.nn.attention import causal_block_size

    block = causal_block_size(args.seq_len)
    print(f"B={args.batch} T={args.seq_len} V={args.vocab}; default block size {block}", file=sys.stderr)
    figures: dict = {"batch": args.batch, "seq_len": args.seq_len, "vocab": args.vocab, "block_size": block}
    if args.sweep:
        figures["sweep_attention_s"] = sweep(args)

    import functools

    # Document windows off: every block attends to all the keys before it.
    no_windows = functools.partial(dot_product_attention, document_window=args.seq_len)
    shape = (args.batch, args.seq_len, *nano_heads(), args.repeats)
    doc_len = {"mean_doc_len": args.mean_doc_len}
    figures["mean_doc_len"] = args.mean_doc_len
    figures["attention_reference_s"] = time_attention(*shape, reference_attention, **doc_len)
    figures["attention_blocked_no_document_windows_s"] = time_attention(*shape, no_windows, **doc_len)
    figures["attention_blocked_s"] = time_attention(*shape, dot_product_attention, **doc_len)
    print(
        f"attention fwd+bwd, one layer (documents ~{args.mean_doc_len} tokens): reference "
        f"{figures['attention_reference_s']:.3f} s, blocked without document windows "
        f"{figures['attention_blocked_no_document_windows_s']:.3f} s, blocked {figures['attention_blocked_s']:.3f} s",
        file=sys.stderr,
    )
    seconds = time_train_step(args, attention=no_windows, fused_loss=True)
    figures["step_blocked_attention_no_document_windows_fused_loss_s"] = seconds
    print(f"nano train step: blocked attention without document windows, fused loss: {seconds:.3f} s", file=sys.stderr)
    for attention_name, attention in (("reference", reference_attention), ("blocked", dot_product_attention)):
        for loss_name, fused in (("plain", False), ("fused", True)):
            seconds = time_train_step(args, attention=attention, fused_loss=fused)
            figures[f"step_{attention_name}_attention_{loss_name}_loss_s"] = seconds
            print(f"nano train step: {attention_name} attention, {loss_name} loss: {seconds:.3f} s", file=sys.stderr)
    before = figures["step_reference_attention_plain_loss_s"]
    # "after" is what the trainer now runs by default: blocked attention, and the loss its rule picks.
    import jax

    from experiments.llama import llama_nano
    from levanter.trainer.step import prefers_fused_loss

    auto_fused = prefers_fused_loss(
        llama_nano.build(args.vocab, key=jax.random.PRNGKey(0)), num_tokens=args.batch * args.seq_len, num_devices=1
    )
    figures["default_loss"] = "fused" if auto_fused else "plain"
    after = figures[f"step_blocked_attention_{figures['default_loss']}_loss_s"]
    figures["step_speedup"] = round(before / after, 2)
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    main()
