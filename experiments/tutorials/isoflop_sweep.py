"""An IsoFLOP sweep: for each compute budget, Llama models of several widths, each trained on the
tokens that spend the budget; then ``marin scaling`` fits how loss scales with size and data.

    source .venv/bin/activate   # once per shell, from the repository root
    marin run experiments/tutorials/isoflop_sweep.py --dry-run    # the grid: steps, sizes, total FLOPs
    marin run experiments/tutorials/isoflop_sweep.py              # run it; start more workers on the same prefix to share it
    marin scaling --steps 'sweeps/isoflop-tinystories/*' --png scaling.png

The defaults are 16 runs over three budgets (1e11 to 1e12 FLOPs, 7.3e12 in all): about six and
a half minutes on two CPU cores (docs/scaling.md has the fit). The settings are read with
``script_config`` (``--set sweep.KEY=VALUE``). The tokenizer is the
project's own byte-level BPE of ``vocab_size`` tokens, trained by a cached step on the built-in
corpus, so each run's FLOPs are known when the sweep is declared; a small vocabulary keeps the
embeddings from dwarfing models this small. ``source`` is any ``tokenized`` source (a Hugging Face
id, a jsonl file or folder; offline, TinyStories resolves to the built-in corpus). ``max_tokens``
leaves out the points that would repeat data of that size. docs/scaling.md walks through the
whole path.
"""

from dataclasses import dataclass

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from marin.datasets import builtin_tokenizer
from marin.execution.step_runner import StepRunner
from marin.experiment.config import script_config
from marin.experiment.data import tokenized
from marin.experiment.sweep import isoflop_sweep

SWEEP_NAME = "sweeps/isoflop-tinystories"


@dataclass(frozen=True)
class SweepSettings:
    budgets: tuple[float, ...] = (1e11, 3e11, 1e12)
    widths: tuple[int, ...] = (8, 12, 16, 24, 32, 48, 64, 96)
    vocab_size: int = 1024
    num_layers: int = 4
    head_dim: int = 16
    batch_size: int = 4
    seq_len: int = 128
    # At these sizes the number of steps matters as much as the tokens: a model that gets fewer than
    # this many is left out rather than judged on an unfinished warm-up.
    min_steps: int = 150
    max_tokens: int | None = 2_000_000  # about four passes over the TinyStories sample
    learning_rate: float = 3e-3
    warmup: float = 0.1
    source: str = "roneneldan/TinyStories"
    validation: str | None = None  # validation files for a file source (a Hugging Face source has its own split)
    sample_count: int | None = None


def width_ladder(widths: tuple[int, ...], *, num_layers: int, head_dim: int, seq_len: int) -> dict[str, LlamaConfig]:
    """Llama models that differ in width only: MLP 4x wide, heads of ``head_dim``, untied output head."""
    return {
        f"w{width}": LlamaConfig(hidden_dim=width, intermediate_dim=4 * width, num_layers=num_layers,
                                 num_heads=max(1, width // head_dim), num_kv_heads=max(1, width // head_dim),
                                 max_seq_len=seq_len, tie_word_embeddings=False)
        for width in widths
    }


settings = script_config(SweepSettings, "sweep")

tokenizer = builtin_tokenizer(vocab_size=settings.vocab_size)
stories = tokenized(name="tokenized/isoflop-stories", source=settings.source, validation=settings.validation,
                    tokenizer=tokenizer, sample_count=settings.sample_count)

runs = isoflop_sweep(
    SWEEP_NAME,
    budgets=settings.budgets,
    models=width_ladder(settings.widths, num_layers=settings.num_layers, head_dim=settings.head_dim, seq_len=settings.seq_len),
    vocab_size=settings.vocab_size,
    batch_size=settings.batch_size,
    seq_len=settings.seq_len,
    min_steps=settings.min_steps,
    max_tokens=settings.max_tokens,
    datasets={stories: 1.0},
    optimizer=AdamConfig(learning_rate=settings.learning_rate, weight_decay=0.1, warmup=settings.warmup),
    minutes_per_checkpoint=None,
    num_samples=0,
)

if __name__ == "__main__":
    StepRunner().run(runs)
