"""Forward and backward of a training step's parts, each in several ways, timed on the accelerator.

    python bench/tpu_kernels.py                       # every part at llama_600m's shapes, batch 8 x 2048
    python bench/tpu_kernels.py --only rope,splash    # some parts
    python bench/tpu_kernels.py --hidden 512 --heads 8 --kv-heads 8 --batch 16   # llama_150m's

The parts a profile of a training step (``bench/tpu_step.py --profile``) shows to dominate, each
isolated so that its variants can be compared in one process on one chip:

- ``rope``: the q and k projections with rotary positions applied (the model's ``apply_rotary`` and
  other ways of writing the same rotation);
- ``splash``: splash attention over packed documents, by block sizes, with the fused or the split
  backward, and with the sequence or the head dimension minor in memory;
- ``loss``: the output layer and cross-entropy (``fused_next_token_loss``) by block of tokens and by
  block of words.

Each variant is compiled, run twice, then timed over ``--repeats`` runs of forward + backward (the
gradient with respect to every input); printed as one JSON line each: milliseconds per run and,
where the part's FLOPs are known, TFLOP/s. Variants that compute the same thing are checked to agree
with the first one to bfloat16 rounding (``max_rel_diff``), so a fast wrong one is seen as such.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("rope", "splash", "loss")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=128_256)
    p.add_argument("--repeats", type=int, default=10)
    return p.parse_args(argv)


def timed(fn, args, repeats: int) -> tuple[float, object]:
    import jax

    compiled = jax.jit(fn).lower(*args).compile()
    out = compiled(*args)
    jax.block_until_ready(compiled(*args))
    started = time.perf_counter()
    for _ in range(repeats):
        out = compiled(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - started) / repeats * 1000, out


def max_rel_diff(a, b) -> float:
    import jax
    import numpy as np

    worst = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
        worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return worst


def report(part: str, variant: str, ms: float, flops: float | None, diff: float | None, **extra) -> None:
    line = {"part": part, "variant": variant, "ms": round(ms, 3)}
    if flops:
        line["tflops"] = round(flops / ms / 1e9, 1)
    if diff is not None:
        line["max_rel_diff"] = float(f"{diff:.3g}")
    print(json.dumps({**line, **extra}), flush=True)


def compare(part, variants: dict, args_of, flops, repeats):
    """``variants``: name -> a function of no arguments that builds the variant's step."""
    reference = None
    for name, build in variants.items():
        try:
            ms, out = timed(build(), args_of(), repeats)
        except Exception as e:  # a variant that does not compile or run here is reported, not fatal
            print(json.dumps({"part": part, "variant": name, "error": str(e).splitlines()[0][:300]}), flush=True)
            continue
        diff = None if reference is None else max_rel_diff(out, reference)
        reference = out if reference is None else reference
        report(part, name, ms, flops, diff)


# -- rope --------------------------------------------------------------------------------------------


def rope_variants():
    import jax.numpy as jnp

    from haliax.nn.rotary import apply_rotary

    def f32_concat(x, cos, sin):
        return apply_rotary(x, cos, sin)

    def input_dtype(x, cos, sin):
        half = x.shape[-1] // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos[..., None, :].astype(x.dtype) + rotated * sin[..., None, :].astype(x.dtype)

    def f32_halves(x, cos, sin):
        half = x.shape[-1] // 2
        x32 = x.astype(jnp.float32)
        x1, x2 = x32[..., :half], x32[..., half:]
        c, s = cos[..., None, :half], sin[..., None, :half]
        return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)

    def f32_roll(x, cos, sin):
        half = x.shape[-1] // 2
        x32 = x.astype(jnp.float32)
        signed = jnp.concatenate([-sin[..., :half], sin[..., half:]], axis=-1)
        return (x32 * cos[..., None, :] + jnp.roll(x32, half, axis=-1) * signed[..., None, :]).astype(x.dtype)

    return {"f32_concat": f32_concat, "input_dtype": input_dtype, "f32_halves": f32_halves, "f32_roll": f32_roll}


def bench_rope(a):
    import jax
    import jax.numpy as jnp

    from haliax.nn.rotary import rotary_cos_sin

    head_dim = a.hidden // a.heads
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    h = jax.random.normal(keys[0], (a.batch, a.seq_len, a.hidden), jnp.bfloat16)
    wq = (0.02 * jax.random.normal(keys[1], (a.hidden, a.heads, head_dim))).astype(jnp.bfloat16)
    wk = (0.02 * jax.random.normal(keys[2], (a.hidden, a.kv_heads, head_dim))).astype(jnp.bfloat16)
    gq = jax.random.normal(keys[3], (a.batch, a.seq_len, a.heads, head_dim), jnp.bfloat16)
    gk = jax.random.normal(keys[4], (a.batch, a.seq_len, a.kv_heads, head_dim), jnp.bfloat16)
    cos, sin = rotary_cos_sin(jnp.arange(a.seq_len), head_dim, 10000.0)

    def step_of(rope):
        def loss(h, wq, wk):
            q = rope(jnp.einsum("btd,dhk->bthk", h, wq), cos, sin)
            k = rope(jnp.einsum("btd,dhk->bthk", h, wk), cos, sin)
            return jnp.sum((q * gq).astype(jnp.float32)) + jnp.sum((k * gk).astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))

    flops = 3 * 2 * a.batch * a.seq_len * a.hidden * head_dim * (a.heads + a.kv_heads)
    compare("rope", {name: (lambda rope=rope: step_of(rope)) for name, rope in rope_variants().items()}, lambda: (h, wq, wk), flops, a.repeats)


# -- splash ------------------------------------------------------------------------------------------


def bench_splash(a):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    sys.path.insert(0, str(ROOT / "bench"))
    from tpu_step import random_batch

    head_dim = a.hidden // a.heads
    keys = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(keys[0], (a.batch, a.heads, a.seq_len, head_dim), jnp.bfloat16)
    k = jax.random.normal(keys[1], (a.batch, a.kv_heads, a.seq_len, head_dim), jnp.bfloat16)
    v = jax.random.normal(keys[2], (a.batch, a.kv_heads, a.seq_len, head_dim), jnp.bfloat16)
    g = jax.random.normal(keys[3], (a.batch, a.heads, a.seq_len, head_dim), jnp.bfloat16)
    segments = jnp.asarray(random_batch(a.batch, a.seq_len, 8, (100, 600)).segment_ids)
    mask = masks.MultiHeadMask([masks.CausalMask((a.seq_len, a.seq_len)) for _ in range(a.heads)])
    seq_minor = splash.QKVLayout.SEQ_MINOR

    def kernel_of(block_q, block_kv, fused, layout=None, block_bwd=None):
        block_bwd = block_bwd or block_q
        extra = {} if layout is None else {"q_layout": layout, "k_layout": layout, "v_layout": layout}
        sizes = splash.BlockSizes(
            block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
            block_q_dkv=block_bwd, block_kv_dkv=block_bwd, block_kv_dkv_compute=block_bwd,
            block_q_dq=None if fused else block_bwd, block_kv_dq=None if fused else block_bwd,
            use_fused_bwd_kernel=fused, **extra,
        )  # fmt: skip
        with jax.ensure_compile_time_eval():
            run = splash.make_splash_mha_single_device(mask, block_sizes=sizes)

        def loss(q, k, v):
            out = jax.vmap(lambda q, k, v, s: run(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s)))(q, k, v, segments)
            return jnp.sum((out * g).astype(jnp.float32))

        return jax.grad(loss, argnums=(0, 1, 2))

    variants = {}
    for block in (512, 1024, 2048):
        if a.seq_len % block:
            continue
        variants[f"b{block}_split"] = lambda block=block: kernel_of(block, block, False)
        variants[f"b{block}_fused"] = lambda block=block: kernel_of(block, block, True)
    variants["b512_fused_seq_minor"] = lambda: kernel_of(512, 512, True, seq_minor)
    variants["b512_split_seq_minor"] = lambda: kernel_of(512, 512, False, seq_minor)
    variants["q1024_kv512_fused"] = lambda: kernel_of(1024, 512, True, block_bwd=512)
    variants["q2048_kv512_fused_bwd1024"] = lambda: kernel_of(2048, 512, True, block_bwd=1024)
    # Causal halves the square; forward 2 matmuls, backward 4 (recomputing the scores once more): 2+5 matmuls of 2 flops.
    flops = 7 * 2 * a.batch * a.heads * a.seq_len * a.seq_len * head_dim / 2
    compare("splash", variants, lambda: (q, k, v), flops, a.repeats)
    del np


# -- loss --------------------------------------------------------------------------------------------


def bench_loss(a):
    import jax
    import jax.numpy as jnp

    from levanter.models.loss import default_block_size, fused_next_token_loss

    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    hidden = jax.random.normal(keys[0], (a.batch, a.seq_len, a.hidden), jnp.bfloat16)
    w = (0.02 * jax.random.normal(keys[1], (a.hidden, a.vocab))).astype(jnp.bfloat16)
    tokens = jax.random.randint(keys[2], (a.batch, a.seq_len), 0, a.vocab, jnp.int32)
    mask = jnp.ones((a.batch, a.seq_len), jnp.float32)

    def step_of(**options):
        def loss(hidden, w):
            sums = fused_next_token_loss(hidden, w, tokens, mask, z_loss_weight=1e-4, **options)
            return (sums.loss_sum + sums.z_loss_sum) / sums.weight_sum

        return jax.grad(loss, argnums=(0, 1))

    default = default_block_size(a.vocab)
    variants = {f"tokens_{default}_default": lambda: step_of(block_size=default)}
    for tokens_per_block in (2048, 4096):
        variants[f"tokens_{tokens_per_block}"] = lambda n=tokens_per_block: step_of(block_size=n)
    for words in (4096, 8192, 16384, 32768):
        variants[f"words_{words}"] = lambda n=words: step_of(vocab_block=n)
    # Model FLOPs: the output layer's forward and two backward matmuls (recomputation is extra work).
    flops = 3 * 2 * a.batch * a.seq_len * a.hidden * a.vocab
    compare("loss", variants, lambda: (hidden, w), flops, a.repeats)


def main(argv=None) -> int:
    sys.path[:0] = [str(ROOT)]
    args = parse_args(argv)
    import jax

    print(json.dumps({"devices": [str(d) for d in jax.devices()], "device_kind": jax.devices()[0].device_kind,
                      "shape": vars(args)}), flush=True)
    for part in args.only.split(","):
        {"rope": bench_rope, "splash": bench_splash, "loss": bench_loss}[part](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
