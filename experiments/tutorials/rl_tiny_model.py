"""Reinforcement learning from verifiable rewards on a tiny model: SFT on arithmetic, then GRPO.

The graph, all offline: arithmetic problems are drawn from a seed (``ArithmeticEnvironment``); a
step writes their worked answers (``"23+58=81"``) as text, another trains a character-level
tokenizer on them, a tiny Llama learns the format by ordinary next-token training (the SFT model),
and ``rl_train`` then improves it with GRPO: it samples completions of training problems with the
inference engine, rewards exact answers, and trains on the group-relative advantages. The held-out
pass rate (greedy, problems never trained on) is measured on the SFT model and logged through the
RL run; the script prints both.

    source .venv/bin/activate   # once per shell, from the repository root
    marin run experiments/tutorials/rl_tiny_model.py

The settings are read with ``script_config`` as ``sft`` and ``rl``, so ``marin run --set
rl.num_train_steps=50`` changes one without editing the script.
"""

from dataclasses import dataclass, field

from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.config import script_config
from marin.experiment.data import tokenized
from marin.experiment.train import TrainedModel, train_lm
from marin.rl import ArithmeticEnvironment, RlTrainedModel, RolloutSampling, grpo, heldout_pass_rate, rl_train
from rigging import filesystem as fsx

ARITHMETIC = ArithmeticEnvironment(operations="+", max_operand=49, num_train=2000, num_eval=200, seed=0)
END_OF_TEXT = "<|endoftext|>"
# A byte-level tokenizer with no merges: one token per character, so digits are digits.
CHARACTER_VOCAB = 256 + 1
TINY_LLAMA = LlamaConfig(hidden_dim=96, intermediate_dim=256, num_layers=3, num_heads=4, num_kv_heads=4, max_seq_len=32)


@dataclass(frozen=True)
class SftSettings:
    optimizer: AdamConfig = field(default_factory=lambda: AdamConfig(learning_rate=3e-3, weight_decay=0.0, warmup=0.05))
    batch_size: int = 32
    seq_len: int = 32
    num_train_steps: int = 600


@dataclass(frozen=True)
class RlSettings:
    optimizer: AdamConfig = field(default_factory=lambda: AdamConfig(learning_rate=3e-4, weight_decay=0.0, lr_schedule="constant"))
    num_train_steps: int = 100
    prompts_per_step: int = 16
    rollouts_per_prompt: int = 8
    temperature: float = 1.0
    eval_every: int = 25


sft_settings = script_config(SftSettings, "sft")
rl_settings = script_config(RlSettings, "rl")


def write_worked_problems(ctx) -> dict:
    """The training problems with their answers, one document each, as the SFT set."""
    import json

    text = "".join(json.dumps({"text": p.prompt + p.answer}) + "\n" for p in ARITHMETIC.problems("train"))
    fsx.atomic_write(fsx.join(ctx.output_path, "train.jsonl"), text)
    return {"path": ctx.output_path, "splits": {"train": "train.jsonl"}}


def train_character_tokenizer(ctx) -> dict:
    texts = [p.prompt + p.answer for p in ARITHMETIC.problems("train")]
    tokenizer = train_bpe_tokenizer(texts, CHARACTER_VOCAB, special_tokens=[END_OF_TEXT])
    # The end-of-text token also opens each prompt, as it precedes each problem in the packed SFT text.
    save_tokenizer(tokenizer, ctx.output_path, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT)
    return {"path": ctx.output_path, "vocab_size": tokenizer.get_vocab_size()}


worked_problems = lazy_step("datasets/arithmetic-worked", write_worked_problems,
                            hash_attrs={"environment": ARITHMETIC, "format": "text/1"})
character_tokenizer = lazy_step("tokenizers/arithmetic-characters", train_character_tokenizer,
                                hash_attrs={"environment": ARITHMETIC, "vocab_size": CHARACTER_VOCAB})
arithmetic_tokenized = tokenized("tokenized/arithmetic-worked", source=worked_problems, tokenizer=character_tokenizer)

sft_model = train_lm(
    name="checkpoints/arithmetic-sft",
    model=TINY_LLAMA,
    datasets={arithmetic_tokenized: 1.0},
    optimizer=sft_settings.optimizer,
    batch_size=sft_settings.batch_size,
    seq_len=sft_settings.seq_len,
    num_train_steps=sft_settings.num_train_steps,
    num_samples=0,
)

rl_model = rl_train(
    name="checkpoints/arithmetic-rl",
    model=sft_model,
    environment=ARITHMETIC,
    loss=grpo(),
    optimizer=rl_settings.optimizer,
    num_train_steps=rl_settings.num_train_steps,
    prompts_per_step=rl_settings.prompts_per_step,
    rollouts_per_prompt=rl_settings.rollouts_per_prompt,
    sampling=RolloutSampling(temperature=rl_settings.temperature, max_tokens=4),
    # On-policy: each batch is sampled by the weights that train on it, so the run is the same every time.
    max_staleness=0,
    eval_every=rl_settings.eval_every,
)

if __name__ == "__main__":
    runner = StepRunner()
    runner.run([rl_model])
    sft = load_artifact(runner.output_path_for(sft_model), TrainedModel).result
    rl = load_artifact(runner.output_path_for(rl_model), RlTrainedModel).result
    print(f"held-out pass rate, {len(ARITHMETIC.problems('eval'))} problems, greedy:")
    print(f"  SFT model: {heldout_pass_rate(sft.hf_path, ARITHMETIC):.3f}")
    print(f"  RL model:  {rl.heldout_pass_rate_final:.3f} after {rl.final_step} GRPO steps "
          f"({rl.heldout_pass_rate_start:.3f} at the start of the RL run)")
