"""Model-FLOPs utilisation of one model training on one accelerator, through the real loader and
Trainer, next to a PyTorch peer of the same shape in the same run.

    python bench/mfu.py                                  # llama_1_4b, batch 8 x 2048, with the peer
    python bench/mfu.py --model llama_600m --batch 16
    python bench/mfu.py --model moe_1_4b_a600m --batch 16
    python bench/mfu.py --tiny                           # tiny shapes on CPU, both sides (< 1 minute)
    python bench/mfu.py --tiny --model moe_1_4b_a600m    # the same with a tiny MoE / Mixtral

``--model`` is any size of ``experiments/llama.py`` or ``experiments/moe.py``; ``--tiny`` keeps
its family but shrinks it to a few layers of width 64 on CPU.

Ours: random documents of ``--doc-len`` tokens (default 100 to 600) are written to a temporary token
cache, and ``levanter.data`` cuts them into packed windows with segment ids, so attention is
masked per document as in training; the Trainer then runs ``--warmup-steps`` + ``--steps`` steps
(scanned layers, bf16 compute on accelerators), evaluates on ``--eval-batches`` held-out
batches and saves a final checkpoint (``--no-checkpoint`` to skip), as a real run ends.

The peer (``bench/mfu_torch_peer.py``, when ``torch`` and ``transformers`` import): the same shape
as a ``transformers`` model trained with bf16 autocast, SDPA attention, fused AdamW and
``torch.compile`` on CUDA, on random tokens without packing (its output says so). It runs first, in
a subprocess, before JAX takes the device, so the two never share device memory.

MFU = flops_per_token x tokens/s / (peak bf16 FLOP/s of the device) for both sides, with the
``6N + 12 L H d T`` count of the model config's ``flops_per_token`` (active experts only for MoE) and
the peak of ``levanter.trainer.hardware``; null on CPU. Tokens/s are over the timed steps only.
Peak device memory: JAX's ``peak_bytes_in_use``, ``torch.cuda.max_memory_allocated``; null on CPU.

Output: the peer's JSON line, then, last, one JSON object: ours, the peer's figures and
``ratio`` = ours / peer tokens/s. The exit status is 0 only if our side succeeded; a failed peer is
reported in the JSON (``peer.error``) without failing the run.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PEER_SCRIPT = Path(__file__).with_name("mfu_torch_peer.py")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama_1_4b", help="a size from experiments/llama.py or experiments/moe.py")
    p.add_argument("--tiny", action="store_true", help="a tiny model of the same family on CPU (smoke check)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default 8; 4 with --tiny)")
    p.add_argument("--seq-len", type=int, default=None, help="default 2048; 128 with --tiny")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20; 5 with --tiny)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (compilation); at least 1")
    p.add_argument("--vocab", type=int, default=None, help="default: the vocabulary the size is named with")
    p.add_argument("--doc-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="document lengths, uniform (default 100 600; 20 120 with --tiny)")
    p.add_argument("--eval-batches", type=int, default=2, help="held-out batches evaluated after the last step (0: none)")
    p.add_argument("--checkpoint", action=argparse.BooleanOptionalAction, default=True, help="save a final checkpoint")
    p.add_argument("--remat", default=None, choices=("none", "full", "save_matmuls"), help="gradient checkpointing policy (default: the model config's)")
    p.add_argument("--microbatch", type=int, default=None)
    p.add_argument("--attention", default=None, help="attention implementation, where the model config has one")
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True, help="run the PyTorch peer when torch imports")
    p.add_argument("--peer-compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile on the peer (default: on CUDA only)")
    p.add_argument("--peer-timeout", type=float, default=1200, help="seconds before the peer is given up")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of each side (default: 1 with --tiny, else all)")
    args = p.parse_args(argv)
    if args.warmup_steps < 1:
        p.error("--warmup-steps must be at least 1: the first step includes compilation")
    return args


# -- the model --------------------------------------------------------------------------------


def model_sizes() -> dict[str, tuple[object, int]]:
    from experiments.llama import LLAMA3_VOCAB_SIZE, LLAMA_SIZES, llama_nano
    from experiments.moe import MOE_SIZES, moe_nano

    sizes = {name: (config, vocab) for name, (config, vocab) in LLAMA_SIZES.items()}
    sizes.update({name: (config, vocab) for name, (config, vocab, _, _) in MOE_SIZES.items()})
    sizes.update({"llama_nano": (llama_nano, LLAMA3_VOCAB_SIZE), "moe_nano": (moe_nano, LLAMA3_VOCAB_SIZE)})
    return sizes


def resolve_model(args):
    """(name, config, vocab) with the bench's shape applied."""
    from levanter.models.moe import MoeConfig

    sizes = model_sizes()
    if args.model not in sizes:
        raise SystemExit(f"Unknown --model {args.model!r}; choose one of: {', '.join(sorted(sizes))}")
    config, vocab = sizes[args.model]
    name = args.model
    if args.tiny:
        tiny = dict(hidden_dim=64, intermediate_dim=256, num_layers=2, num_heads=4, num_kv_heads=2, tie_word_embeddings=False)
        if isinstance(config, MoeConfig):
            config = MoeConfig(**{**tiny, "intermediate_dim": 128}, num_experts=4, num_experts_per_token=2)
        else:
            config = type(config)(**tiny)
        name, vocab = f"tiny {name.split('_')[0]}", 512
    vocab = args.vocab or vocab
    changes = {
        "max_seq_len": max(config.max_seq_len, args.seq_len),
        "use_scan": not args.tiny,
        **({"remat": args.remat} if args.remat is not None else {}),
    }
    if args.attention is not None:
        changes["attention"] = args.attention
    return name, dataclasses.replace(config, **changes), vocab


def hf_config_of(config, vocab: int) -> dict:
    from levanter.models.moe import MoeConfig

    if isinstance(config, MoeConfig):
        from levanter.compat.hf_mixtral import mixtral_config_dict

        return mixtral_config_dict(config, vocab)
    from levanter.compat.hf_checkpoints import hf_config_dict

    return hf_config_dict(config, vocab)


# -- the PyTorch peer -----------------------------------------------------------------------------


def run_peer(args, config, vocab: int, flops_per_token: float) -> dict:
    """The peer's JSON object, or ``{"error": ...}``; it runs before this process starts JAX's backend."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        return {"error": f"not run: {', '.join(missing)} not importable"}
    command = [
        sys.executable, str(PEER_SCRIPT), "--hf-config", json.dumps(hf_config_of(config, vocab)),
        "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--steps", str(args.steps),
        "--warmup-steps", str(args.warmup_steps), "--flops-per-token", repr(flops_per_token),
    ]
    if args.tiny:
        command += ["--device", "cpu"]
    if args.threads:
        command += ["--threads", str(args.threads)]
    if args.peer_compile is not None:
        command.append("--compile" if args.peer_compile else "--no-compile")
    print(f"peer: {' '.join(command[:2])} ... (PyTorch, same shape)", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(command, check=False, stdout=subprocess.PIPE, text=True, timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.peer_timeout:.0f}s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit status {done.returncode}; its stderr is above", "exit_status": done.returncode}
    print(lines[-1], flush=True)  # the peer's own line, as it printed it
    return json.loads(lines[-1])


# -- our side ----------------------------------------------------------------------------------


def write_documents(url: str, num_tokens: int, vocab: int, doc_len: tuple[int, int], rng) -> int:
    """A token cache of random documents, ``num_tokens`` in all; returns how many documents."""
    from zephyr.token_cache import dtype_for_vocab, finalize_token_cache, write_token_cache_shard

    lengths = []
    while sum(lengths) < num_tokens:
        lengths.append(int(rng.integers(doc_len[0], doc_len[1] + 1)))
    documents = (rng.integers(0, vocab, size=n) for n in lengths)
    write_token_cache_shard(f"{url}/shard-00000", documents, dtype_for_vocab(vocab))
    finalize_token_cache(url, ["shard-00000"], vocab_size=vocab)
    return len(lengths)


def run_ours(args, config, vocab: int, flops_per_token: float, workdir: str) -> dict:
    import jax
    import numpy as np

    from levanter.data import CacheSource, build_text_data
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig, peak_flops_per_device

    total = args.warmup_steps + args.steps
    rng = np.random.default_rng(0)
    window = args.seq_len
    # Headroom for the loader's read-ahead, so no window is read twice.
    train_docs = write_documents(f"{workdir}/train", (total + 8) * args.batch * window, vocab, args.doc_len, rng)
    write_documents(f"{workdir}/validation", max(args.eval_batches, 1) * args.batch * window, vocab, args.doc_len, rng)
    data = build_text_data(
        [CacheSource("random-documents", f"{workdir}/train", f"{workdir}/validation")],
        seq_len=args.seq_len, batch_size=args.batch, vocab_size=vocab,
    )
    segments = data.train.batch_at(0).segment_ids
    trainer_config = TrainerConfig(
        num_train_steps=total, batch_size=args.batch, microbatch_size=args.microbatch, log_every=5,
        mesh=MeshConfig(data=1), checkpoint_at_end=args.checkpoint,
    )
    eval_sources = {"random-documents": data.validation["random-documents"]} if args.eval_batches else {}
    trainer = Trainer(trainer_config, AdamConfig(3e-4, 0.1, warmup=2), output_dir=f"{workdir}/run", flops_per_token=flops_per_token)
    device = jax.devices()[0]
    print(
        f"ours: {device.device_kind}, {config.num_parameters(vocab) / 1e9:.3f}B params, batch {args.batch} x {args.seq_len}, "
        f"{flops_per_token / 1e9:.2f} GFLOP/token, {train_docs} documents of {args.doc_len[0]}-{args.doc_len[1]} tokens",
        file=sys.stderr, flush=True,
    )
    started = time.monotonic()
    result = trainer.train(lambda key: config.build(vocab, key=key), data.train, eval_sources)
    train_wall_s = time.monotonic() - started
    rows = [r for r in result.history if "loss" in r]
    t0, t1 = rows[args.warmup_steps - 1]["wall_time"], rows[-1]["wall_time"]
    tokens_per_s = args.steps * args.batch * args.seq_len / (t1 - t0)
    peak = peak_flops_per_device()
    stats = device.memory_stats() or {}
    return {
        "device": device.device_kind,
        "compute_dtype": str(trainer.compute_dtype),
        "attention": config.attention,
        "remat": config.remat,
        "data": (
            f"packed random documents of {args.doc_len[0]}-{args.doc_len[1]} tokens from a token cache through "
            f"levanter.data, segment ids on ({segments.max(axis=1).mean() + 1:.1f} documents per row)"
        ),
        "tokens_per_s": round(tokens_per_s, 1),
        "first_step_s": round(rows[0]["wall_time"], 2),
        "train_wall_s": round(train_wall_s, 2),
        "peak_flops": peak,
        "mfu": None if peak is None else round(flops_per_token * tokens_per_s / peak, 4),  # one device
        "peak_memory_bytes": stats.get("peak_bytes_in_use"),
        "final_loss": rows[-1]["loss"],
        "eval_loss": result.eval_losses.get("random-documents"),
        "checkpoint_steps": result.checkpoint_steps,
    }


# -- the run ------------------------------------------------------------------------------------


def configure_cpu_threads(threads: int) -> None:
    """Both sides get the same intra-op thread count on CPU; must run before JAX starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}"
    ).strip()
    os.environ["OMP_NUM_THREADS"] = str(threads)


def report_threads_at_exit() -> None:
    """Name any thread still running when the interpreter exits: one inside a native (JAX, Orbax)
    call then is ended mid-call and aborts the process ("terminate called after throwing an
    instance of ''"), after a successful run."""
    import threading
    import traceback

    frames = sys._current_frames()
    for thread in threading.enumerate():
        if thread is threading.main_thread() or not thread.is_alive():
            continue
        frame = frames.get(thread.ident)
        where = "".join(traceback.format_stack(frame, limit=1)).strip() if frame is not None else "?"
        print(f"WARNING: thread {thread.name!r} (daemon={thread.daemon}) still running at exit: {where}", file=sys.stderr)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tiny:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        args.threads = args.threads or 1
    args.batch = args.batch or (4 if args.tiny else 8)
    args.seq_len = args.seq_len or (128 if args.tiny else 2048)
    args.steps = args.steps or (5 if args.tiny else 20)
    args.doc_len = tuple(args.doc_len or ((20, 120) if args.tiny else (100, 600)))
    if args.threads:
        configure_cpu_threads(args.threads)
    atexit.register(report_threads_at_exit)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("absl").setLevel(logging.WARNING)

    name, config, vocab = resolve_model(args)
    flops_per_token = config.flops_per_token(vocab, args.seq_len)
    active = getattr(config, "num_active_parameters", config.num_parameters)(vocab)
    summary = {
        "model": name,
        "family": "moe" if hasattr(config, "num_experts") else "llama",
        "params": config.num_parameters(vocab),
        "active_params": active,
        "vocab": vocab,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "flops_per_token": flops_per_token,
    }
    # The peer first: once JAX has started its backend it holds most of the device's memory.
    peer = run_peer(args, config, vocab, flops_per_token) if args.peer else {"error": "not run: --no-peer"}

    status = 0
    with tempfile.TemporaryDirectory(prefix="mfu-") as workdir:
        try:
            ours = run_ours(args, config, vocab, flops_per_token, workdir)
        except Exception as e:  # still print the line, with the peer's figures and the error
            logging.getLogger("bench.mfu").exception("our side failed")
            ours, status = {"error": f"{type(e).__name__}: {e}"[:2000]}, 1
    ratio = None
    if ours.get("tokens_per_s") and peer.get("tokens_per_s"):
        ratio = round(ours["tokens_per_s"] / peer["tokens_per_s"], 3)
    line = {
        **summary,
        **ours,
        "peer_tokens_per_s": peer.get("tokens_per_s"),
        "peer_mfu": peer.get("mfu"),
        "peer_peak_memory_bytes": peer.get("peak_memory_bytes"),
        "ratio": ratio,
        "peer": peer,
    }
    print(json.dumps(line), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
