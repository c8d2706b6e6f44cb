"""tokenize -> train -> evaluate on tiny shapes, run as a user runs a script:

    MARIN_PREFIX=... [MARIN_CLUSTER=iris:slurm] python tiny_graph.py INPUTS STEPS CHECKPOINT_EVERY

INPUTS holds train.jsonl, validation.jsonl and a tokenizer folder. The last line printed is
``REPORT {json}`` with the steps that ran and their output folders.
"""

import json
import sys

from fray.cluster import ResourceConfig
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from marin.execution.step_runner import StepRunner
from marin.experiment.data import tokenized
from marin.experiment.eval import evaluate_lm
from marin.experiment.train import train_lm

MODEL = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=64)

if __name__ == "__main__":
    inputs, steps, checkpoint_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    data = tokenized("tokenized/stories", f"{inputs}/train.jsonl", f"{inputs}/tokenizer",
                     validation=f"{inputs}/validation.jsonl")
    model = train_lm(
        name="checkpoints/tiny",
        model=MODEL,
        optimizer=AdamConfig(learning_rate=3e-3),
        datasets={data: 1.0},
        batch_size=8,
        seq_len=64,
        num_train_steps=steps,
        steps_per_checkpoint=checkpoint_every,
        minutes_per_checkpoint=None,
        num_samples=0,
        # Placement only: the same hashes with or without it. Two preemptions are planned.
        resources=ResourceConfig.with_cpu(ram="1g", max_retries_preemption=2),
    )
    evaluation = evaluate_lm("evaluation/tiny", model=model, datasets=[data], batch_size=8)
    runner = StepRunner(heartbeat_s=0.5)
    report = runner.run([evaluation])
    outputs = {outcome.name: outcome.output_path for outcome in report.outcomes}
    print("REPORT " + json.dumps({"ran": report.ran, "cached": report.cached, "outputs": outputs}), flush=True)
