"""Every optimizer of ``levanter.optim`` on the same small Llama, the same tokens and the same budget,
each at a few learning rates and compared at its best: final validation loss, throughput, state size.

    python bench/optimizer_comparison.py                       # the default run: ~11 minutes on 2 idle CPU cores
    python bench/optimizer_comparison.py --optimizers AdamW,Muon --num-rates 5
    python bench/optimizer_comparison.py --model llama_30m --vocab full --batch-size 16 --tokens 360000
    python bench/optimizer_comparison.py --tiny                # 2 optimizers, 3 steps, a few stories (smoke check)

The protocol is the one a fair comparison needs: every optimizer gets its own learning-rate sweep
(``--num-rates`` rates spaced by ``--lr-step`` around a centre suited to it), everything else shared
(model, data order, token budget, warm-up, cosine decay to 10%, weight decay 0.1, clipping at 1),
and each is judged by its validation loss at the end of training at its best rate.

Data: the shared TinyStories sample (``data/tinystories/{train,validation}.jsonl`` under
``MARIN_TEST_DATA``, else ``shared/`` beside the checkout, else ``~/.cache/marin/test-data``: where
the tests' ``real_data`` fixture looks), tokenized with the GPT-2 tokenizer (``tokenizers/gpt2``),
stories separated by ``<|endoftext|>``. Training draws random windows from ``train.jsonl``; the loss
is over every window of ``validation.jsonl``, stories never trained on. ``--vocab sample`` (the
default) renumbers the GPT-2 ids that occur in the sample (about 6,600 of 50,257) densely, so the
output layer is 8x smaller and a CPU trains 4x more tokens in the same time; ``--vocab full`` keeps
all 50,257. The sample holds 370k training tokens: a larger ``--tokens`` repeats it. Without the
sample the script prints why and exits 0.

Every run goes through ``levanter.main.train_lm`` in this process. The learning rate is an input of
the compiled step, so the rates of one optimizer share one compiled program (through the persistent
compilation cache ``train_lm`` turns on). Tokens/s: the median over an optimizer's runs, the first
step (compilation) left out. State bytes: ``jax.eval_shape`` of the optimizer's ``init`` on the
model's parameters, as ``bench/optimizer_state_memory.py``.

Prints one line per run, then the table; ``--out FILE`` also writes one JSON object per optimizer.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPT2_EOS = 50256
GPT2_VOCAB = 50257


# -- the optimizers ---------------------------------------------------------------------------------

# Shared by every optimizer (schedule-free keeps its own constant schedule after the same warm-up).
SHARED = dict(weight_decay=0.1, warmup=0.1, min_lr_ratio=0.1, lr_schedule="cosine", max_grad_norm=1.0)


@dataclass(frozen=True)
class Candidate:
    """An optimizer to compare: how to configure it at a rate, and the rate its sweep is centred on."""

    name: str
    centre_lr: float
    make: Callable[[float], object]  # learning rate -> OptimizerConfig

    def rates(self, count: int, step: float) -> list[float]:
        """``count`` rates spaced by the factor ``step``, centred on ``centre_lr`` (lowest first)."""
        return [self.centre_lr * step ** (i - (count - 1) / 2) for i in range(count)]


def candidates() -> list[Candidate]:
    """The optimizers in the order of the table, AdamW first.

    Centres suit the default run (100 steps of ``llama_nano``: higher rates than long runs want):
    the best rate of earlier sweeps of that run (five rates for AdamW to ADOPT, three for the rest),
    one factor of 2 further where that best was the sweep's lowest or highest rate. Sophia, whose
    clipped step is sign-like early on, starts from Lion's; schedule-free AdamW, without decay,
    from half AdamW's.
    """
    from levanter.optim import (
        AdamConfig,
        AdamMiniConfig,
        AdoptConfig,
        KronConfig,
        LionConfig,
        MarsConfig,
        MuonConfig,
        ScheduleFreeAdamConfig,
        ScionConfig,
        SOAPConfig,
        SophiaConfig,
    )

    constant = {**SHARED, "lr_schedule": "constant", "min_lr_ratio": 0.0}
    return [
        Candidate("AdamW", 8e-3, lambda lr: AdamConfig(lr, **SHARED)),
        Candidate("Lion", 2e-3, lambda lr: LionConfig(lr, **SHARED)),
        # Moonshot's scale: AdamW's rate carries over to the matrices, so one rate sweeps both parts.
        Candidate("Muon", 3.2e-2, lambda lr: MuonConfig(lr, **SHARED, update_scale="adamw_rms")),
        Candidate("Scion", 5e-4, lambda lr: ScionConfig(lr, **SHARED)),
        # Dense preconditioners for the (renumbered) vocabulary would cost 170 MB each: sides above
        # 1,024 stay unrotated (SOAP) or diagonal (Kron), as the full 50,257-token one is by default.
        Candidate("SOAP", 8e-3, lambda lr: SOAPConfig(lr, **SHARED, max_precond_dim=1024)),
        Candidate("Kron", 1.6e-2, lambda lr: KronConfig(lr, **SHARED, max_size_triangular=1024)),
        Candidate("ADOPT", 4e-3, lambda lr: AdoptConfig(lr, **SHARED)),
        Candidate("MARS", 1.6e-2, lambda lr: MarsConfig(lr, **SHARED)),
        Candidate("Cautious AdamW", 1.6e-2, lambda lr: AdamConfig(lr, **SHARED, cautious=True)),
        Candidate("Cautious Lion", 4e-3, lambda lr: LionConfig(lr, **SHARED, cautious=True)),
        Candidate("Adam-mini", 4e-3, lambda lr: AdamMiniConfig(lr, **SHARED)),
        Candidate("Sophia", 2e-3, lambda lr: SophiaConfig(lr, **SHARED)),
        Candidate("Schedule-free AdamW", 4e-3, lambda lr: ScheduleFreeAdamConfig(lr, **constant)),
    ]


# -- the data ---------------------------------------------------------------------------------------


def find_sample(explicit: str | None) -> tuple[Path | None, str]:
    """The folder holding ``data/tinystories`` and ``tokenizers/gpt2``, or None and what is missing."""
    needed = ("data/tinystories/train.jsonl", "data/tinystories/validation.jsonl", "tokenizers/gpt2/tokenizer.json")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "marin" / "test-data"
    roots = [Path(explicit)] if explicit else [
        *([Path(os.environ["MARIN_TEST_DATA"])] if os.environ.get("MARIN_TEST_DATA") else []),
        REPO.parent / "shared",
        cache,
    ]
    for root in roots:
        if all((root / name).is_file() for name in needed):
            return root, ""
    return None, f"needs {', '.join(needed)} under one of {', '.join(map(str, roots))}"


@dataclass(frozen=True)
class Tokens:
    train: "np.ndarray"  # noqa: F821
    validation: "np.ndarray"  # noqa: F821
    vocab_size: int
    train_stories: int
    validation_stories: int


def load_tokens(root: Path, *, vocab: str, max_stories: int | None) -> Tokens:
    """Both splits as one GPT-2 token stream each, stories ending in ``<|endoftext|>``."""
    import numpy as np
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(root / "tokenizers/gpt2/tokenizer.json"))

    def split(name: str) -> tuple[np.ndarray, int]:
        with open(root / "data/tinystories" / f"{name}.jsonl") as f:
            stories = [json.loads(line)["text"] for line in f if line.strip()][:max_stories]
        ids = [np.asarray([*e.ids, GPT2_EOS], np.int32) for e in tokenizer.encode_batch(stories)]
        return np.concatenate(ids), len(stories)

    (train, n_train), (validation, n_validation) = split("train"), split("validation")
    vocab_size = GPT2_VOCAB
    if vocab == "sample":
        used = np.unique(np.concatenate([train, validation]))
        dense = np.zeros(GPT2_VOCAB, np.int32)
        dense[used] = np.arange(used.size, dtype=np.int32)
        train, validation, vocab_size = dense[train], dense[validation], int(used.size)
    return Tokens(train, validation, vocab_size, n_train, n_validation)


# -- one run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    model: object  # LlamaConfig
    model_name: str
    tokens: Tokens
    batch_size: int
    seq_len: int
    num_steps: int

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class RunResult:
    learning_rate: float
    validation_loss: float | None  # None: the run diverged (a non-finite training loss)
    train_loss: float | None
    tokens_per_second: float | None
    seconds: float
    error: str | None = None  # the run failed (not diverged): the exception, in one line


def train_once(setup: Setup, optimizer, workdir: str) -> RunResult:
    from levanter.main.train_lm import TrainLmConfig, train_lm
    from levanter.trainer import TrainerConfig
    from levanter.trainer.sources import InMemoryWindows
    from levanter.trainer.step_metrics import NonFiniteLossError
    from levanter.trainer.tracker import read_metrics

    train = InMemoryWindows(setup.tokens.train, seq_len=setup.seq_len, batch_size=setup.batch_size, seed=0)
    held_out = InMemoryWindows(setup.tokens.validation, seq_len=setup.seq_len, batch_size=setup.batch_size)
    config = TrainLmConfig(
        model=setup.model,
        optimizer=optimizer,
        trainer=TrainerConfig(num_train_steps=setup.num_steps, batch_size=setup.batch_size, checkpoint_at_end=False,
                              log_every=setup.num_steps),
        vocab_size=setup.tokens.vocab_size,
        output_path=tempfile.mkdtemp(dir=workdir),
        export_hf=False,
    )
    started = time.monotonic()
    try:
        result = train_lm(config, train, {"validation": held_out.sequential_batches})
    except NonFiniteLossError:
        return RunResult(optimizer.learning_rate, None, None, None, time.monotonic() - started)
    except Exception as error:  # noqa: BLE001 - one optimizer that cannot train must not lose the others' runs
        message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return RunResult(optimizer.learning_rate, None, None, None, time.monotonic() - started, error=message)
    seconds = time.monotonic() - started
    steps = [r for r in read_metrics(result.metrics_path) if r.get("loss") is not None]
    rate = None
    if len(steps) > 1:  # from the end of the first step (compilation) to the end of the last
        rate = (steps[-1]["tokens"] - steps[0]["tokens"]) / (steps[-1]["wall_time"] - steps[0]["wall_time"])
    return RunResult(optimizer.learning_rate, result.eval_losses["validation"], result.final_train_loss, rate, seconds)


def state_bytes(optimizer, setup: Setup) -> int:
    """Bytes of the optimizer state for the setup's model, from shapes only (the weight-decay mask,
    left at the config's default here, changes no state's shape)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    from haliax.module import logical_axes

    model = eqx.filter_eval_shape(lambda k: setup.model.build(setup.tokens.vocab_size, key=k), jax.random.PRNGKey(0))
    params = eqx.filter(model, lambda x: isinstance(x, jax.ShapeDtypeStruct) and jnp.issubdtype(x.dtype, jnp.inexact))
    axes = logical_axes(params)
    tx = optimizer.build(setup.num_steps, param_axes=axes)
    leaves = jax.tree.leaves(jax.eval_shape(tx.init, params))
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves if hasattr(x, "shape"))


def parameter_count(setup: Setup) -> int:
    import equinox as eqx
    import jax
    import numpy as np

    model = eqx.filter_eval_shape(lambda k: setup.model.build(setup.tokens.vocab_size, key=k), jax.random.PRNGKey(0))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(model) if isinstance(x, jax.ShapeDtypeStruct))


# -- the table --------------------------------------------------------------------------------------


def summarise(candidate: Candidate, runs: list[RunResult], state: int, adamw_state: int) -> dict:
    finished = [r for r in runs if r.validation_loss is not None]
    best = min(finished, key=lambda r: r.validation_loss) if finished else None
    rates = [r.tokens_per_second for r in finished if r.tokens_per_second]
    return {
        "optimizer": candidate.name,
        "best_lr": best.learning_rate if best else None,
        "validation_loss": best.validation_loss if best else None,
        # The sweep's best at its lowest or highest rate: the true optimum may lie beyond it.
        "best_at_edge": best is not None and len(runs) > 1
        and best.learning_rate in (runs[0].learning_rate, runs[-1].learning_rate),
        "runs": [dataclasses.asdict(r) for r in runs],
        "tokens_per_second": statistics.median(rates) if rates else None,
        "state_bytes": state,
        "state_vs_adamw": state / adamw_state,
    }


def format_table(rows: list[dict]) -> str:
    def loss(run: dict) -> str:
        if run["validation_loss"] is not None:
            return f"{run['validation_loss']:.3f}"
        return "failed" if run["error"] else "diverged"

    lines = [
        "| optimizer | best lr | val loss | val loss at the other rates | tokens/s | state | x AdamW |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        others = ", ".join(f"{loss(r)} @ {r['learning_rate']:.2g}"
                           for r in row["runs"] if r["learning_rate"] != row["best_lr"])
        best = "-" if row["best_lr"] is None else f"{row['best_lr']:.2g}" + (" (edge)" if row["best_at_edge"] else "")
        if row["validation_loss"] is not None:
            value = f"{row['validation_loss']:.3f}"
        else:
            value = "failed" if any(r["error"] for r in row["runs"]) else "diverged"
        speed = "-" if row["tokens_per_second"] is None else f"{row['tokens_per_second']:,.0f}"
        lines.append(f"| {row['optimizer']} | {best} | {value} | {others} | {speed} | "
                     f"{row['state_bytes'] / 2**20:.2f} MiB | {row['state_vs_adamw']:.2f} |")
    failures = {f"{row['optimizer']} failed: {r['error']}" for row in rows for r in row["runs"] if r["error"]}
    return "\n".join([*lines, *([""] if failures else []), *sorted(failures)])


def machine() -> str:
    import jax

    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpu}, {cores} cores, JAX {jax.__version__} on {jax.devices()[0].platform}"


# -- the command line -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true",
                   help="AdamW and Lion, 2 rates, 3 steps of a tiny model on 24 stories of each split")
    p.add_argument("--model", default="llama_nano", help="llama_nano or a size of experiments/llama.py")
    p.add_argument("--vocab", choices=("sample", "full"), default="sample",
                   help="sample: the GPT-2 ids that occur in the sample, renumbered; full: all 50,257")
    p.add_argument("--tokens", type=int, default=204_800,
                   help="training tokens per run (default: 100 steps of 8 x 256)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--optimizers", default=None, help="comma-separated names from the table (default: all)")
    p.add_argument("--num-rates", type=int, default=3, help="learning rates per optimizer")
    p.add_argument("--lr-step", type=float, default=2.0, help="factor between neighbouring rates")
    p.add_argument("--max-stories", type=int, default=None, help="use only the first N stories of each split")
    p.add_argument("--data", default=None, help="folder holding data/tinystories and tokenizers/gpt2")
    p.add_argument("--out", default=None, help="write one JSON object per optimizer here")
    args = p.parse_args(argv)
    if args.tiny:
        # 8 rows: the batch must split over every device, and the test suite simulates 8 CPU devices.
        args.tokens, args.batch_size, args.seq_len, args.num_rates = 3 * 8 * 16, 8, 16, 2
        args.optimizers = args.optimizers or "AdamW,Lion"
        args.max_stories = args.max_stories or 24
    return args


def model_config(name: str, tiny: bool, seq_len: int):
    from levanter.models.llama import LlamaConfig

    from experiments.llama import LLAMA_SIZES, llama_nano

    if tiny:
        return LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=1, num_heads=2, num_kv_heads=2,
                           max_seq_len=seq_len)
    sizes = {"llama_nano": llama_nano, **{k: config for k, (config, _) in LLAMA_SIZES.items()}}
    if name not in sizes:
        raise SystemExit(f"optimizer_comparison.py: --model {name!r} is not one of {', '.join(sizes)}")
    return dataclasses.replace(sizes[name], max_seq_len=seq_len)


def quiet_training_logs() -> None:
    """Warnings only from the trainer: the per-run lines below say what matters (train_lm keeps a
    logger that already has a handler as it is)."""
    levanter = logging.getLogger("levanter")
    if not levanter.handlers:
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        levanter.addHandler(handler)
    levanter.propagate = False


def choose(names: str | None) -> list[Candidate]:
    everything = candidates()
    if not names:
        return everything
    wanted = [n.strip() for n in names.split(",")]
    unknown = [n for n in wanted if n not in {c.name for c in everything}]
    if unknown:
        raise SystemExit(f"optimizer_comparison.py: --optimizers {', '.join(unknown)} unknown; "
                         f"choose from {', '.join(c.name for c in everything)}")
    return [c for c in everything if c.name in wanted]


def describe(setup: Setup, vocab: str) -> str:
    t = setup.tokens
    renumbered = "GPT-2 ids seen in the sample, renumbered" if vocab == "sample" else "GPT-2"
    return (f"{machine()}\n{setup.model_name}: {parameter_count(setup):,} parameters, vocabulary {t.vocab_size:,} "
            f"({renumbered}); {setup.num_steps} steps x {setup.tokens_per_step:,} tokens = "
            f"{setup.num_steps * setup.tokens_per_step:,} tokens per run; train {t.train.size:,} tokens "
            f"({t.train_stories:,} stories), validation {t.validation.size:,} tokens "
            f"({t.validation_stories:,} stories)")


def sweep(candidate: Candidate, setup: Setup, rates: list[float], workdir: str) -> list[RunResult]:
    """One run per rate, each printed as it ends."""
    runs = []
    for lr in rates:
        run = train_once(setup, candidate.make(lr), workdir)
        runs.append(run)
        if run.error is not None:
            outcome = f"failed: {run.error}"
        elif run.validation_loss is None:
            outcome = "diverged (non-finite training loss)"
        else:
            outcome = (f"val {run.validation_loss:.4f}  train {run.train_loss:.4f}  "
                       f"{run.tokens_per_second or math.nan:,.0f} tokens/s")
        print(f"  {candidate.name:20s} lr {lr:.3g}: {outcome}  ({run.seconds:.1f} s)", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root, missing = find_sample(args.data)
    if root is None:
        print(f"optimizer_comparison.py: skipped: {missing}")
        return 0
    chosen = choose(args.optimizers)
    quiet_training_logs()
    tokens = load_tokens(root, vocab=args.vocab, max_stories=args.max_stories)
    setup = Setup(model_config(args.model, args.tiny, args.seq_len), "tiny" if args.tiny else args.model, tokens,
                  args.batch_size, args.seq_len, num_steps=max(1, args.tokens // (args.batch_size * args.seq_len)))
    print(describe(setup, args.vocab), flush=True)

    adamw_state = state_bytes(candidates()[0].make(1e-3), setup)
    rows = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="optimizer-comparison-") as workdir:
        for candidate in chosen:
            runs = sweep(candidate, setup, candidate.rates(args.num_rates, args.lr_step), workdir)
            state = state_bytes(candidate.make(candidate.centre_lr), setup)
            rows.append(summarise(candidate, runs, state, adamw_state))
    elapsed = time.monotonic() - started
    print(f"\n{format_table(rows)}\n\n{len(chosen)} optimizers x {args.num_rates} rates in {elapsed:.0f} s")
    if args.out:
        context = {"model": setup.model_name, "tokens_per_run": setup.num_steps * setup.tokens_per_step,
                   "vocab_size": tokens.vocab_size, "machine": machine()}
        with open(args.out, "w") as f:
            f.writelines(json.dumps({**row, **context}) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
