"""Reinforcement learning throughput on this CPU: our rollouts beside transformers' ``generate``, and our
GRPO training step beside TRL's ``GRPOTrainer``, on the same model and batch, in one run.

    python bench/rl_throughput.py                          # 4 layers, hidden 256, 8 prompts x 8 rollouts
    python bench/rl_throughput.py --prompts 16 --rollouts 8 --new-tokens 16

One random Llama is exported to the Hugging Face format; transformers (float32, torch on CPU)
loads that folder, and both sides start from the same weights.

- **Rollouts**: ``--prompts`` arithmetic prompts, ``--rollouts`` completions each, sampled at
  temperature 1 for up to ``--new-tokens`` tokens, each with the log-probability of every sampled
  token, decoded and scored. Ours: a rollout worker (the generation engine, continuous batching over
  a paged cache), timed after one untimed batch that compiles its programs. Theirs: one
  ``generate(num_return_sequences=...)`` call on the left-padded prompts, with the log-probabilities
  from its logits, also after an untimed call. tokens/s counts the tokens each side sampled (up to
  and including end-of-text) over the wall time of the batch, median of ``--repeats``; the two
  sides' timed batches alternate, so that on a shared machine both meet the same load.
- **Training**: whole GRPO steps (forward, backward, clipping, AdamW) on the same batch of
  ``prompts x rollouts`` rows of prompt + completion (fixed lengths, so both sides compute the same
  tokens), the grpo loss without a reference model. Ours goes through the real Trainer (data
  prefetch, metrics every step); theirs is TRL's ``training_step`` plus the optimizer's step, on the
  inputs its own ``_generate_and_score_completions`` prepared. tokens/s counts the rows' tokens.

The last line is one JSON object with every rate, the two ratios (ours / theirs) and the machine's
load average at the start and the end: on a shared machine other work slows both sides, torch's
more (its threads wait spinning), so a figure means little without it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import configure_threads  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="timed rollout batches per side (the median is reported)")
    p.add_argument("--steps", type=int, default=10, help="timed training steps per side")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    return p.parse_args()


def build(args, folder: str):
    """The model folder (weights and tokenizer), the environment and the prompts' problem ids."""
    import jax
    from levanter.compat.hf_checkpoints import export_llama_to_hf
    from levanter.models.llama import LlamaConfig
    from levanter.tokenization import save_tokenizer, train_bpe_tokenizer
    from marin.rl import ArithmeticEnvironment
    from storygen import generate_stories

    environment = ArithmeticEnvironment(max_operand=99, num_train=args.prompts, num_eval=0)
    texts = generate_stories(200, seed=0) + [p.prompt + p.answer for p in environment.problems("train")]
    tokenizer = train_bpe_tokenizer(texts, args.vocab)
    save_tokenizer(tokenizer, os.path.join(folder, "tokenizer"), bos_token="<|endoftext|>")
    config = LlamaConfig(hidden_dim=args.hidden, intermediate_dim=args.intermediate, num_layers=args.layers,
                         num_heads=args.heads, num_kv_heads=args.heads, max_seq_len=256)
    model = config.build(tokenizer.get_vocab_size(), key=jax.random.PRNGKey(0))
    hf = export_llama_to_hf(model, os.path.join(folder, "hf"), tokenizer_dir_or_obj=os.path.join(folder, "tokenizer"))
    return hf, config, tokenizer.get_vocab_size(), environment


# -- rollouts ------------------------------------------------------------------------------------------


def our_sampler(args, hf: str, config, vocab: int, environment):
    """``sample(index) -> tokens/s`` of one rollout batch by a rollout worker, and the prompts' tokens."""
    from levanter.compat.hf_checkpoints import import_from_hf
    from marin.rl.policy_weights import host_weights
    from marin.rl.rollout_worker import RolloutWorker, RolloutWorkerConfig
    from marin.rl.rollouts import RolloutSampling

    worker = RolloutWorker(RolloutWorkerConfig(
        model=config, vocab_size=vocab, tokenizer=hf, environment=environment,
        sampling=RolloutSampling(temperature=1.0, max_tokens=args.new_tokens), group_size=args.rollouts,
        compute_dtype="float32", max_batch=args.prompts * args.rollouts,
    ))
    worker.set_weights(0, host_weights(import_from_hf(hf)))
    problems = list(range(args.prompts))

    def sample(index: int) -> float:
        batch = worker.rollout(index, problems)
        return batch.generated_tokens / batch.seconds

    prompts = [group.prompt_tokens for group in worker.rollout(0, problems).groups]  # also compiles the engine's programs
    return sample, prompts, worker.close


def their_sampler(args, hf: str, environment, prompts: list[list[int]]):
    """``sample(seed) -> tokens/s`` of one ``generate`` call on the same batch."""
    import torch
    import transformers
    from levanter.tokenization import load_tokenizer

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(hf)
    eos = tokenizer.eos_id
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[eos] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    problems = environment.problems("train")

    @torch.no_grad()
    def sample(seed: int) -> float:
        torch.manual_seed(seed)
        started = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=args.new_tokens, max_length=None, num_return_sequences=args.rollouts,
                             eos_token_id=eos, pad_token_id=eos, output_logits=True, return_dict_in_generate=True)
        new = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).log_softmax(-1).gather(-1, new[..., None])[..., 0]  # noqa: F841
        tokens = 0
        for row, sequence in enumerate(new.tolist()):
            length = sequence.index(eos) + 1 if eos in sequence else len(sequence)
            tokens += length
            text = tokenizer.tokenizer.decode(sequence[:length], skip_special_tokens=True)
            environment.reward(problems[row // args.rollouts], text)
        return tokens / (time.perf_counter() - started)

    sample(0)  # warm-up
    return sample


def rollout_rates(args, hf: str, config, vocab: int, environment) -> tuple[float, float, list[list[int]]]:
    """Median tokens/s of each side; their timed batches alternate, so both meet the same load on a shared machine."""
    ours, prompts, close = our_sampler(args, hf, config, vocab, environment)
    theirs = their_sampler(args, hf, environment, prompts)
    ours_rates, theirs_rates = [], []
    for repeat in range(1, args.repeats + 1):
        ours_rates.append(ours(repeat))
        theirs_rates.append(theirs(repeat))
    close()
    return statistics.median(ours_rates), statistics.median(theirs_rates), prompts


# -- training ------------------------------------------------------------------------------------------


def training_batch(args, prompts: list[list[int]], vocab: int):
    """Fixed-length completions (no end-of-text inside) with sampler log-probabilities and rewards."""
    import numpy as np

    rng = np.random.default_rng(0)
    rows = args.prompts * args.rollouts
    completions = [rng.integers(1, vocab, size=args.new_tokens).tolist() for _ in range(rows)]
    sampler = [(-rng.uniform(5, 9, size=args.new_tokens)).tolist() for _ in range(rows)]
    rewards = rng.integers(0, 2, size=rows).astype(float).tolist()
    return completions, sampler, rewards


def training_ours(args, config, vocab: int, prompts, completions, sampler, rewards) -> float:
    import logging

    import numpy as np
    from levanter.data.batch import Batch
    from levanter.optim import AdamConfig
    from levanter.trainer import MeshConfig, Trainer, TrainerConfig
    from levanter.trainer.grpo import ADVANTAGES, SAMPLER_LOGPROBS, GrpoLoss, GrpoObjective, group_advantages

    logging.getLogger("absl").setLevel(logging.WARNING)
    prompt_len = len(prompts[0])
    seq_len = prompt_len + args.new_tokens
    rows = len(completions)
    tokens = np.zeros((rows, seq_len), np.int32)
    mask = np.zeros((rows, seq_len), np.float32)
    old = np.zeros((rows, seq_len), np.float32)
    for row, completion in enumerate(completions):
        tokens[row] = prompts[row // args.rollouts] + completion
        mask[row, prompt_len - 1:seq_len - 1] = 1
        old[row, prompt_len - 1:seq_len - 1] = sampler[row]
    advantages = np.repeat(group_advantages(np.asarray(rewards), args.rollouts)[:, None], seq_len, axis=1)
    batch = Batch(tokens=tokens, loss_mask=mask, extras={SAMPLER_LOGPROBS: old, ADVANTAGES: advantages})

    class Repeat:
        def iter_from(self, start):
            while True:
                yield batch

    total = args.steps + args.warmup_steps
    trainer_config = TrainerConfig(num_train_steps=total, batch_size=rows, log_every=total, mesh=MeshConfig(data=1),
                                   checkpoint_at_end=False, compute_dtype="float32")
    objective = GrpoObjective(GrpoLoss(measure_kl=False), temperature=1.0, max_completion_length=args.new_tokens)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(trainer_config, AdamConfig(1e-5, 0.0, lr_schedule="constant"), output_dir=out, objective=objective)
        result = trainer.train(lambda key: config.build(vocab, key=key), Repeat())
    history = [r for r in result.history if "loss" in r]
    t0, t1 = history[args.warmup_steps - 1]["wall_time"], history[-1]["wall_time"]
    return args.steps * rows * seq_len / (t1 - t0)


def training_theirs(args, hf: str, prompts, completions, sampler, rewards) -> float:
    import datasets
    import torch
    import transformers

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    rows = len(completions)
    texts = [str(i) for i in range(args.prompts) for _ in range(args.rollouts)]
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, per_device_train_batch_size=rows, num_generations=args.rollouts,
                            max_completion_length=args.new_tokens, beta=0.0, loss_type="grpo", learning_rate=1e-5,
                            weight_decay=0.0, max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.95, report_to=[],
                            use_cpu=True, bf16=False)
        trainer = GRPOTrainer(
            model=transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32), args=config,
            reward_funcs=lambda prompts, completions, **kwargs: rewards,
            processing_class=transformers.PreTrainedTokenizerFast(tokenizer_file=f"{hf}/tokenizer.json",
                                                                  eos_token="<|endoftext|>", pad_token="<|endoftext|>"),
            train_dataset=datasets.Dataset.from_dict({"prompt": texts}),
            rollout_func=lambda batch, trainer: {"prompt_ids": [prompts[int(p)] for p in batch],
                                                 "completion_ids": completions, "logprobs": sampler},
        )
        trainer.model.train()
        inputs = trainer._generate_and_score_completions([{"prompt": p} for p in texts])
        inputs["old_per_token_logps"] = torch.tensor(sampler)
        trainer.current_gradient_accumulation_steps = 1
        trainer.create_optimizer()
        optimizer = trainer.optimizer

        def step() -> float:
            # training_step without its _prepare_inputs, which would sample the batch anew.
            loss = trainer.compute_loss(trainer.model, inputs)
            trainer.accelerator.backward(loss)
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return float(loss)  # one host sync per step, as our metrics fetch does

        for _ in range(args.warmup_steps):
            step()
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        elapsed = time.perf_counter() - started
    return args.steps * rows * (len(prompts[0]) + args.new_tokens) / elapsed


def main() -> None:
    args = parse_args()
    configure_threads(args.threads)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        hf, config, vocab, environment = build(args, folder)
        ours_rollout, theirs_rollout, prompts = rollout_rates(args, hf, config, vocab, environment)
        # Training rows need prompts of one length on both sides: the first prompt's, for every group.
        same_length = [prompts[0]] * args.prompts
        completions, sampler, rewards = training_batch(args, same_length, vocab)
        ours_train = training_ours(args, config, vocab, same_length, completions, sampler, rewards)
        theirs_train = training_theirs(args, hf, same_length, completions, sampler, rewards)
    shape = (f"{args.layers}L h{args.hidden} heads{args.heads} ffn{args.intermediate} V{vocab}, {args.prompts} prompts x "
             f"{args.rollouts} rollouts, {args.new_tokens} new tokens")
    load = (round(load_before, 1), round(os.getloadavg()[0], 1))
    # Other work on the machine slows both sides, and torch's more (its threads wait spinning): say how busy it was.
    print(f"{shape}; {args.threads} threads; load average {load[0]} at the start, {load[1]} at the end")
    print(f"rollout tokens/s:  ours {ours_rollout:,.0f}   transformers generate {theirs_rollout:,.0f}   "
          f"ratio {ours_rollout / theirs_rollout:.2f}")
    print(f"training tokens/s: ours {ours_train:,.0f}   TRL GRPOTrainer {theirs_train:,.0f}   ratio {ours_train / theirs_train:.2f}")
    print(json.dumps({
        "rollout_ours_tokens_per_s": round(ours_rollout, 1), "rollout_transformers_tokens_per_s": round(theirs_rollout, 1),
        "rollout_ratio": round(ours_rollout / theirs_rollout, 3),
        "train_ours_tokens_per_s": round(ours_train, 1), "train_trl_tokens_per_s": round(theirs_train, 1),
        "train_ratio": round(ours_train / theirs_train, 3), "shape": shape, "threads": args.threads, "load_average": load,
    }))


if __name__ == "__main__":
    main()
