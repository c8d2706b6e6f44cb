"""Fine-tune the tutorial's model to answer questions in a chat format, then ask it one.

The graph continues the tutorial's: the chat set is written by a step of its own (offline, see
experiments/tiny_chats.py), rendered with the tokenizer's chat template (the built-in tokenizer has
none, so ChatML) into a token cache whose loss mask covers the assistant's replies only, and the
fine-tuning step starts from the tutorial's trained weights: a dependency, so the tutorial's
tokenize and training steps are reused from the cache, not run again.

    source .venv/bin/activate   # once per shell, from the repository root
    marin run experiments/tutorials/sft_tiny_model.py
    marin generate checkpoints/marin-nano-tinystories-chat --chat --prompt "What colour is the kite?"

The fine-tuning settings (``sft``) are read with ``script_config``, so ``marin run --set
sft.KEY=VALUE`` changes them (``train.KEY=VALUE`` changes the tutorial's model it starts from); the
defaults are the tutorial's.
"""

from dataclasses import dataclass, field

from levanter.inference import SamplingConfig
from levanter.optim import AdamConfig
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.config import script_config
from marin.experiment.sft import chat_dataset, sft
from marin.generate import generate
from rigging import filesystem as fsx

from experiments.marin_tokenizer import marin_tokenizer
from experiments.tiny_chats import as_jsonl
from experiments.tutorials.train_tiny_model import nano_tinystories_model

CHAT_SET = {"train": (400, 0), "validation": (40, 1)}  # split: (conversations, seed)


@dataclass(frozen=True)
class SftSettings:
    optimizer: AdamConfig = field(default_factory=lambda: AdamConfig(learning_rate=3e-3, weight_decay=0.0))
    batch_size: int = 8
    seq_len: int = 256
    num_train_steps: int = 400


settings = script_config(SftSettings, "sft")


def write_chat_set(ctx) -> dict:
    """The chat set as jsonl files in the step's folder, one per split."""
    for split, (count, seed) in CHAT_SET.items():
        fsx.atomic_write(fsx.join(ctx.output_path, f"{split}.jsonl"), as_jsonl(count, seed))
    return {"path": ctx.output_path, "splits": {split: f"{split}.jsonl" for split in CHAT_SET}}


tiny_chats = lazy_step("datasets/tiny-chats", write_chat_set, hash_attrs={"splits": CHAT_SET, "format": "messages/1"})

tiny_chats_tokenized = chat_dataset(name="chat/tiny-chats", source=tiny_chats, tokenizer=marin_tokenizer)

nano_chat_model = sft(
    name="checkpoints/marin-nano-tinystories-chat",
    initialize_from=nano_tinystories_model,  # the tutorial's final weights; its model config comes with them
    datasets={tiny_chats_tokenized: 1.0},
    optimizer=settings.optimizer,
    batch_size=settings.batch_size,
    seq_len=settings.seq_len,
    num_train_steps=settings.num_train_steps,
)

QUESTIONS = ["What colour is the kite?", "What does Mia's pet say?"]

if __name__ == "__main__":
    runner = StepRunner()
    runner.run([nano_chat_model])
    greedy = SamplingConfig(max_new_tokens=40, temperature=0.0, top_k=None, top_p=None)
    replies = generate(runner.output_path_for(nano_chat_model), QUESTIONS, greedy, chat=True)
    for question, reply in zip(QUESTIONS, replies):
        print(f"user:      {question}\nassistant: {reply}")
