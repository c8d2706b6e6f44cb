"""MoE training with the experts split over devices (expert parallelism) against the experts
replicated on every device, on 8 simulated CPU devices, side by side.

    python bench/expert_parallel.py
    python bench/expert_parallel.py --experts 32 --hidden 256 --steps 10

Each mesh trains in its own process (so its peak RSS is its own), through the real Trainer, the
same model, data and optimizer: ``data=8`` (experts replicated), ``experts=8`` and
``data=2 x experts=4``. Printed per mesh: tokens per second over the timed steps (after warm-up
steps that absorb compilation), the parameter and optimizer-state bytes the fullest device holds,
the process's peak RSS, the final loss and the fraction of routed rows dropped. The last line is
one JSON object with every figure.

On simulated devices all eight share this machine's cores and memory, and an all-to-all is a
memory copy, so the rate compares computation, not interconnects; the bytes per device are what a
real mesh would hold.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

MESHES = {"replicated (data=8)": {"data": 8}, "experts=8": {"data": 1, "experts": 8}, "data=2 x experts=4": {"data": 2, "experts": 4}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=256, help="of each expert")
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--experts-per-token", type=int, default=2)
    p.add_argument("--capacity-factor", type=float, default=2.0)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5, help="timed steps per mesh")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a mesh's JSON: run it in this process
    return p.parse_args(argv)


def run_worker(args) -> dict:
    """Train on the mesh ``args.worker`` describes; return its figures."""
    import resource

    import jax
    import numpy as np

    from levanter.models.moe import MoeConfig
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig
    from levanter.trainer.sources import InMemoryWindows

    model = MoeConfig(
        hidden_dim=args.hidden, intermediate_dim=args.intermediate, num_layers=args.layers, num_heads=4, num_kv_heads=4,
        num_experts=args.experts, num_experts_per_token=args.experts_per_token, max_seq_len=args.seq_len,
        expert_capacity_factor=args.capacity_factor,
    )
    steps = args.warmup_steps + args.steps
    config = TrainerConfig(num_train_steps=steps, batch_size=args.batch, mesh=MeshConfig(**json.loads(args.worker)),
                           checkpoint_at_end=False, log_every=steps)
    tokens = np.random.default_rng(0).integers(0, args.vocab, size=64 * args.batch * args.seq_len)
    source = InMemoryWindows(tokens, seq_len=args.seq_len, batch_size=args.batch, seed=0)
    with tempfile.TemporaryDirectory() as out:
        result = Trainer(config, AdamConfig(1e-3), output_dir=out, asynchronous_checkpoints=False).train(
            lambda key: model.build(args.vocab, key=key), source
        )
    history = result.history
    seconds = history[-1]["wall_time"] - history[args.warmup_steps - 1]["wall_time"]
    state_bytes = {d: 0 for d in jax.devices()}
    for array in jax.tree.leaves((result.state.params, result.state.opt_state)):
        for shard in array.addressable_shards:
            state_bytes[shard.device] += shard.data.nbytes
    expert_bytes = sum(
        getattr(layer.moe, name).nbytes for layer in result.state.params.layers for name in ("gate_proj", "up_proj", "down_proj")
    )
    return {
        "tokens_per_second": args.steps * args.batch * args.seq_len / seconds,
        "state_bytes_per_device": max(state_bytes.values()),
        "expert_weight_bytes_total": expert_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux reports KiB
        "final_loss": history[-1]["loss"],
        "dropped_fraction": max(r["moe/dropped_fraction"] for r in history),
    }


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(["--xla_force_host_platform_device_count=8", *flags])
    figures = {}
    for name, mesh in MESHES.items():
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", json.dumps(mesh)],
                              env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
        figures[name] = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 1024 * 1024
    print(f"MoE: {args.layers} layers, hidden {args.hidden}, {args.experts} experts of {args.intermediate} "
          f"(top-{args.experts_per_token}), capacity factor {args.capacity_factor}; batch {args.batch} x {args.seq_len} tokens")
    print(f"{'mesh':<22}{'tokens/s':>10}{'params+opt MiB/device':>23}{'peak RSS MiB':>14}{'final loss':>12}{'dropped':>9}")
    for name, f in figures.items():
        print(f"{name:<22}{f['tokens_per_second']:>10.0f}{f['state_bytes_per_device'] / mib:>23.1f}"
              f"{f['peak_rss_bytes'] / mib:>14.0f}{f['final_loss']:>12.4f}{f['dropped_fraction']:>9.4f}")
    print(json.dumps({"args": vars(args), "figures": figures}))


if __name__ == "__main__":
    main()
