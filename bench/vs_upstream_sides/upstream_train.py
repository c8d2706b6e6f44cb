"""Upstream's side of the training comparison: its Llama through its own ``levanter.trainer.Trainer``.

Runs in the upstream interpreter and imports only upstream's packages (and what they install:
jax, numpy) and the standard library. The data are the same seeded random tokens as our side's;
the optimizer is AdamW with global-norm clipping at 1.0, a constant learning rate, no warm-up.
``--layout unrolled`` builds the layers unrolled with no gradient checkpointing and turns off the
trainer's every-10-steps parameter and gradient watch and its jaxpr/HLO logging, so a step does what
ours does; ``--layout defaults`` leaves every model and trainer setting at upstream's default
(scanned layers with checkpointing, the watch, the logging), only the tracker (W&B by default) is
replaced by the no-op one and checkpoints go to a scratch folder.

Prints one JSON line: parameters, the time from building the state to the end of the first step
(initialisation, compilation and one step), and steady-state tokens/s over the steps after warm-up,
each step timed around the trainer's loop (``upstream_loop.py``: upstream runs hooks only from its
third step, so a clock in a hook would miss two steps).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # upstream_loop: run with python -I, whose path omits this folder
from upstream_loop import steady_tokens_per_second, timed_steps  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--hidden", type=int, required=True)
    parser.add_argument("--intermediate", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--tied", action="store_true")
    parser.add_argument("--steps", type=int, required=True, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, required=True)
    parser.add_argument("--layout", choices=("unrolled", "defaults"), required=True)
    args = parser.parse_args()

    import equinox as eqx
    import haliax as hax
    import jax
    import numpy as np
    from levanter.callbacks.watch import WatchConfig
    from levanter.checkpoint import CheckpointerConfig
    from levanter.data.dataset import ListAsyncDataset
    from levanter.models.llama import LlamaConfig
    from levanter.models.lm_model import LmExample
    from levanter.optim.config import AdamConfig
    from levanter.tracker import NoopConfig
    from levanter.trainer import Trainer, TrainerConfig, initialize

    total = args.warmup_steps + args.steps
    shape = dict(max_seq_len=args.seq_len, hidden_dim=args.hidden, intermediate_dim=args.intermediate,
                 num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                 tie_word_embeddings=args.tied)
    unrolled = args.layout == "unrolled"
    model_config = LlamaConfig(**shape, scan_layers=False, gradient_checkpointing=False) if unrolled else LlamaConfig(**shape)
    scratch = tempfile.mkdtemp(prefix="upstream-train-")
    settings = dict(num_train_steps=total, train_batch_size=args.batch, tracker=NoopConfig(), id="bench",
                    log_dir=Path(scratch) / "logs", require_accelerator=False,
                    checkpointer=CheckpointerConfig(base_path=f"{scratch}/checkpoints", save_interval=None, keep=None))
    if unrolled:
        settings.update(watch=WatchConfig(watch_targets=[]), log_jaxprs=False, log_xla_hlo=False)
    trainer_config = TrainerConfig(**settings)
    initialize(trainer_config)
    optimizer = AdamConfig(learning_rate=3e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, epsilon=1e-8,
                           max_grad_norm=1.0, lr_schedule="constant", warmup=0.0).build(total)

    Pos = model_config.max_Pos.resize(args.seq_len)
    Vocab = hax.Axis("vocab", args.vocab)
    tokens = np.random.default_rng(0).integers(0, args.vocab, size=(total * args.batch, args.seq_len)).astype(np.int32)
    examples = [LmExample.causal(hax.named(row, Pos)) for row in tokens]

    def loss_function(model, example, *, key=None):
        return model.compute_next_token_loss(example, key=key)

    with Trainer(trainer_config, optimizer, loss_function) as trainer:
        started = time.perf_counter()
        model_key, training_key = jax.random.split(jax.random.PRNGKey(0))
        state = trainer.initial_state(training_key, model_init=lambda: model_config.build(Vocab, key=model_key))
        parameters = sum(leaf.size for leaf in jax.tree.leaves(eqx.filter(state.model, eqx.is_inexact_array)))
        loader = trainer.data_loader(ListAsyncDataset(examples)).iter_from_step(0)
        marks, _ = timed_steps(trainer.training_steps(state, loader), total)
    tokens_per_s = steady_tokens_per_second(marks, args.warmup_steps, args.batch * args.seq_len)
    print(json.dumps({"parameters": int(parameters), "first_step_s": round(marks[1] - started, 3),
                      "steps": args.steps, "tokens_per_s": round(tokens_per_s, 1),
                      "layout": args.layout, "scan_layers": model_config.scan_layers,
                      "gradient_checkpointing": str(model_config.gradient_checkpointing)}))


if __name__ == "__main__":
    main()
