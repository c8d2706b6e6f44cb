"""Training steps planned for real TPU pods on this CPU, as `marin plan --json` plans them.

Each experiment is the training tutorial (experiments/tutorials/train_tiny_model.py) with its model,
resources and batch changed, as docs/training.md ("From the tutorial to a pod") tells a reader to.
`marin plan` compiles the trainer's step for every chip of the pod (libtpu describes the chips; no
chip is needed) and reads what XLA says: the bytes each chip holds, or its refusal.

Each plan's memory per chip is pinned against a count from the config (:func:`memory_bounds`):

- the arguments are the state, sharded over the chips: parameters and AdamW's two moments, float32,
  12 bytes a parameter;
- at the step's peak a chip holds at least the state, the sharded float32 gradients (4 bytes a
  parameter) and the activations its remat policy keeps for the backward pass: with "full" each
  layer's input (rows x seq x hidden, bfloat16), with "save_attention" also the attention kernel's
  output (rows x seq x heads x head_dim, bfloat16), with "save_matmuls" every projection's output
  (q, k, v, o, the MLP's gate, up and down);
- and at most that plus a working set the config bounds too, which is the margin: one layer's
  weights gathered whole in bfloat16 with their float32 gradients, for the layer running and the
  next one (fsdp prefetches its gather); the output layer's, whole, the same way; one layer's
  activations rerun for its backward in float32 (a few hidden-wide arrays and four MLP-wide ones a
  position); two float32 blocks of logits for the blocked loss (its block and its gradient); and the
  attention kernel's float32 statistics where "save_attention" keeps them.

Each plan compiles for hundreds of chips, 1.5 to 3 minutes of CPU each here (the 8B's search for a
change that fits is two compiles, the first refused within seconds; the change applied is the second
again, not compiled twice), so they are marked slow, and the test run spreads them over its workers
one test at a time (conftest.py). The plans are made by ``marin plan`` (its ``main``) in a child
process that each worker keeps for its plans: libtpu's compiler spends a fifth of its time in malloc,
and the child runs under jemalloc where scripts/install_jemalloc.sh could install it (20% less CPU
for the same plan); a plan the child does not answer within PLAN_TIMEOUT_S fails its test.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import queue
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from marin import cli

PLAN_TIMEOUT_S = 1500
pytestmark = [
    pytest.mark.slow,
    # A compile for hundreds of chips takes minutes of CPU; on a loaded machine (four test workers on
    # two cores, and more beside them) past the suite's 600 s. A compile ends: the bound is for hangs,
    # past the planner's own (PLAN_TIMEOUT_S, twice for the 8B's two plans).
    pytest.mark.timeout(2 * PLAN_TIMEOUT_S + 120),
    pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                       reason="compiling for a TPU without one needs libtpu (pip install '.[test]' installs it)"),
]

TUTORIAL = Path(__file__).resolve().parents[1] / "experiments" / "tutorials" / "train_tiny_model.py"
LLAMA3_VOCAB = 128_256  # Llama 3's tokenizer, and the Marin tokenizer's
GIB = 2**30


def pod_experiment(tmp_path: Path, *, model: str, imports: str, resources: str, mesh: str | None = None) -> Path:
    """The tutorial with only its model, resources (and mesh) changed, written beside the test."""
    source = TUTORIAL.read_text()
    for old in ("from experiments.llama import llama_nano\n", "model=llama_nano,", "resources=ResourceConfig.with_cpu(),"):
        assert source.count(old) == 1, old
    source = source.replace("from experiments.llama import llama_nano\n", imports + "\n")
    source = source.replace("model=llama_nano,", f"model={model},")
    placement = f"resources={resources}," + (f"\n    mesh={mesh}," if mesh else "")
    source = source.replace("resources=ResourceConfig.with_cpu(),", placement)
    script = tmp_path / f"tutorial_{len(list(tmp_path.glob('tutorial_*.py')))}.py"
    script.write_text(source)
    return script


# The child: runs `marin plan` for each line of arguments it reads, and answers with its exit code
# and what it printed. One process for a worker's plans, so that a plan made again (the 8B's change
# applied) is the one compiled before (marin.experiment.plan._compiled), as it is for a reader.
PLANNER = """
import contextlib, io, json, sys
from marin import cli
for line in sys.stdin:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(json.loads(line))
    sys.__stdout__.write(json.dumps({"code": code, "out": printed.getvalue()}) + "\\n")
    sys.__stdout__.flush()
"""


class Planner:
    def __init__(self, folder: Path):
        env = {key: value for key, value in os.environ.items() if key != "MARIN_PREFIX"}
        env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(folder / "hf"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(TUTORIAL.parents[2]), env.get("PYTHONPATH")])))
        jemalloc = ctypes.util.find_library("jemalloc")
        if jemalloc:
            env["LD_PRELOAD"] = " ".join(filter(None, [jemalloc, env.get("LD_PRELOAD")]))
        self.errors = folder / "planner.err"
        with self.errors.open("wb") as errors:
            self.process = subprocess.Popen([sys.executable, "-c", PLANNER], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=errors, text=True, cwd=folder, env=env)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.answers.put(json.loads(line))
        self.answers.put(None)  # the child ended

    def plan(self, *args: str) -> tuple[int, str]:
        self.process.stdin.write(json.dumps(["plan", *args]) + "\n")
        self.process.stdin.flush()
        try:
            answer = self.answers.get(timeout=PLAN_TIMEOUT_S)
        except queue.Empty:
            self.close()
            pytest.fail(f"marin plan {' '.join(args)} gave no answer in {PLAN_TIMEOUT_S} s; "
                        f"its errors end with:\n{self.errors.read_text()[-3000:]}")
        assert answer is not None, f"the planner ended; its errors end with:\n{self.errors.read_text()[-3000:]}"
        return answer["code"], answer["out"]

    def close(self) -> None:
        self.process.kill()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    child = Planner(tmp_path_factory.mktemp("planner"))
    yield child
    child.close()


def marin_plan(planner: Planner, script: Path, prefix: Path, *args: str) -> tuple[int, list[dict]]:
    code, out = planner.plan(str(script), "--json", "--prefix", str(prefix), *args)
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.delenv("MARIN_PREFIX", raising=False)


@dataclass(frozen=True)
class Shape:
    """What the count needs of a plan: the model's shape, how its weights and rows spread over the chips."""

    config: object  # a LlamaConfig or MoeConfig
    vocab: int
    seq_len: int
    fsdp: int  # chips a dense weight is split over (a slice's chips: data repeats the state per slice)
    experts: int = 1  # chips each expert weight is split over beyond fsdp (MeshConfig.experts)
    batch_rows: int = 1  # rows of the batch per chip
    rows: int = 1  # rows of a (micro)batch per chip: what one forward and backward pass holds

    @property
    def expert_parameters(self) -> int:
        c = self.config
        return c.num_layers * c.num_experts * c.expert_parameters() if hasattr(c, "num_experts") else 0

    @property
    def parameters_per_chip(self) -> float:
        """The experts split over fsdp x experts, everything else over fsdp."""
        everything = self.config.num_parameters(self.vocab)
        return (everything - self.expert_parameters) / self.fsdp + self.expert_parameters / (self.fsdp * self.experts)

    @property
    def layer_weights_at_work(self) -> float:
        """One layer's weights as a chip uses them: gathered whole over fsdp, its share of the experts."""
        c = self.config
        dense = c.num_parameters(self.vocab) - c.embedding_parameters(self.vocab) - c.hidden_dim - self.expert_parameters
        return dense / c.num_layers + self.expert_parameters / c.num_layers / self.experts


def memory_bounds(s: Shape) -> tuple[float, float, float]:
    """(state, least, most) bytes a chip holds: see the module docstring."""
    c = s.config
    state = 12 * s.parameters_per_chip
    gradients = 4 * s.parameters_per_chip
    positions = s.rows * s.seq_len
    assert c.remat != "none", "the count covers the remat policies, not 'none'"
    kept = c.hidden_dim  # each layer's input
    if c.remat == "save_attention":  # and the attention kernel's output
        kept += c.num_heads * c.head_dim
    if c.remat == "save_matmuls":  # and every projection's output: q, k, v, o; the MLP's gate, up, down
        assert not hasattr(c, "num_experts"), "the count of save_matmuls covers dense models"
        kept += 2 * c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim + 2 * c.intermediate_dim + c.hidden_dim
    activations = c.num_layers * positions * kept * 2
    least = state + gradients + activations
    weights_at_work = 2 * s.layer_weights_at_work * (2 + 4) + s.vocab * c.hidden_dim * (2 + 4)
    # An MoE layer's MLP-wide arrays are its tokens' experts': top-k of them, in buffers with room for
    # capacity_factor times the rows.
    mlp = c.intermediate_dim * c.num_experts_per_token * (c.expert_capacity_factor or 1) if hasattr(c, "num_experts") \
        else c.intermediate_dim
    rerun = positions * (10 * c.hidden_dim + 4 * mlp) * 4
    logits = 2 * 2048 * s.vocab * 4
    statistics = c.num_layers * positions * c.num_heads * 128 * 4 if c.remat == "save_attention" else 0
    return state, least, least + weights_at_work + rerun + logits + statistics


def llama_matmul_flops(config, vocab: int, tokens: int) -> float:
    """One step's matmul FLOPs by the config's arithmetic: its 6N a token less attention's products (in
    the splash kernel, counted apart), the output layer once more (the blocked loss reruns it in its
    backward), and under "full" remat each layer's forward again but its last matmul (the MLP's down
    projection, whose output the backward does not need)."""
    per_token = config.flops_per_token(vocab, 4096) - config.attention_flops_per_token(4096) + 2 * vocab * config.hidden_dim
    if config.remat == "full":
        per_token += 2 * config.num_layers * (config.attention_parameters() + 2 * config.hidden_dim * config.intermediate_dim)
    assert config.remat in ("none", "save_matmuls", "full")  # save_matmuls keeps every projection: no rerun
    return per_token * tokens


def check_memory(plan: dict, shape: Shape, record_property) -> None:
    state, least, most = memory_bounds(shape)
    memory = plan["memory"]
    record_property("plan", json.dumps(plan))
    record_property("bounds_gib", [round(least / GIB, 2), round(most / GIB, 2)])
    # The state comes in and goes out in place (donated); beside it only the batch (tokens, loss mask
    # and document ids, 12 bytes a position) and a few scalars.
    assert memory["arguments"] == pytest.approx(state + 12 * shape.batch_rows * shape.seq_len, rel=0.01)
    assert memory["aliased"] >= 0.99 * state
    peak = plan["per_chip_bytes"]
    assert peak == memory["peak"]
    assert least <= peak <= most, (least / GIB, peak / GIB, most / GIB)
    assert peak < plan["hbm_bytes"]


def test_the_tutorial_with_llama_8b_on_a_v5e_256_plans_a_change_that_fits_and_the_change_applied_fits(
        planner, tmp_path, record_property):
    import dataclasses

    from experiments.llama import llama_8b

    prefix = tmp_path / "prefix"
    settings = ["--set", "train.batch_size=256", "--set", "train.seq_len=4096", "--vocab-size", str(LLAMA3_VOCAB)]
    pod = 'ResourceConfig.with_tpu("v5litepod-256")'
    script = pod_experiment(tmp_path, model="llama_8b", imports="from experiments.llama import llama_8b", resources=pod)
    code, (plan,) = marin_plan(planner, script, prefix, *settings)
    assert plan["step"] == "checkpoints/marin-nano-tinystories" and plan["topology"] == "v5e:16x16"
    assert plan["chips"] == 256 and plan["mesh"] == {"data": 1, "fsdp": 256, "experts": 1, "model": 1}
    assert plan["hbm_bytes"] == 16 * GIB
    # FLOPs: what the count leaves out is attention's backward row sums (0.001%). The blocked loss pads
    # nothing: its blocks cut each row's 4,096 positions evenly (two of 2,048 here; position_blocks).
    assert plan["flops_per_step"] == pytest.approx(llama_matmul_flops(llama_8b, LLAMA3_VOCAB, 256 * 4096), rel=2e-5)
    assert plan["kernels_not_counted"] == {"splash_attention": 2 * llama_8b.num_layers}
    if plan["fits"]:
        assert code == 0 and plan["per_chip_bytes"] < plan["hbm_bytes"]
        return
    # llama_8b keeps every activation (remat "none"): XLA refuses, naming the bytes it wanted.
    assert code == 1 and plan["per_chip_bytes"] > plan["available_bytes"]
    suggestion = plan["suggestion"]
    assert suggestion is not None and suggestion["fits"], plan
    assert suggestion["per_chip_bytes"] < plan["available_bytes"]
    assert not prefix.exists()  # nothing ran, nothing was written

    # The change, applied to the script, plans as fitting: the script then declares the very settings the
    # plan compiled (which this process compiles once: marin.experiment.plan._compiled).
    change = suggestion["change"]
    assert set(change) <= {"model.remat", "microbatch_size"}, change
    model = f'dataclasses.replace(llama_8b, remat={change["model.remat"]!r})' if "model.remat" in change else "llama_8b"
    changed = pod_experiment(tmp_path, model=model, imports="import dataclasses\nfrom experiments.llama import llama_8b",
                             resources=pod)
    if "microbatch_size" in change:
        text = changed.read_text().replace("batch_size=train.batch_size,",
                                           f"batch_size=train.batch_size,\n    microbatch_size={change['microbatch_size']},")
        changed.write_text(text)
    code, (fitting,) = marin_plan(planner, changed, prefix, *settings)
    assert code == 0 and fitting["fits"] and fitting["per_chip_bytes"] == suggestion["per_chip_bytes"]
    config = dataclasses.replace(llama_8b, remat=fitting["remat"])
    check_memory(fitting, Shape(config, LLAMA3_VOCAB, 4096, fsdp=256, rows=(fitting["microbatch_size"] or 256) // 256),
                 record_property)
    assert not prefix.exists()


def test_llama_70b_on_a_v5p_512_fits_with_full_remat(planner, tmp_path, record_property):
    import dataclasses

    from experiments.llama import llama_70b

    script = pod_experiment(tmp_path, model='dataclasses.replace(llama_70b, remat="full")',
                            imports="import dataclasses\nfrom experiments.llama import llama_70b",
                            resources='ResourceConfig.with_tpu("v5p-512")')
    code, (plan,) = marin_plan(planner, script, tmp_path / "prefix", "--set", "train.batch_size=512",
                               "--set", "train.seq_len=4096", "--vocab-size", str(LLAMA3_VOCAB))
    assert code == 0 and plan["fits"], plan
    assert plan["topology"] == "v5p:4x8x8" and plan["chips"] == 256 and plan["mesh"]["fsdp"] == 256
    assert plan["hbm_bytes"] == 95 * GIB
    check_memory(plan, Shape(dataclasses.replace(llama_70b, remat="full"), LLAMA3_VOCAB, 4096, fsdp=256, batch_rows=2,
                             rows=2), record_property)
    # fsdp gathers every layer's weights (bfloat16) before each use: its forward, the forward remat reruns,
    # and its backward; each chip receives them whole every time (on v5p XLA may gather by all-reduce).
    layers = llama_70b.num_parameters(LLAMA3_VOCAB) - llama_70b.embedding_parameters(LLAMA3_VOCAB)
    assert sum(entry["bytes"] for entry in plan["collectives"].values()) >= 3 * 2 * layers
    config = dataclasses.replace(llama_70b, remat="full")
    assert plan["flops_per_step"] == pytest.approx(llama_matmul_flops(config, LLAMA3_VOCAB, 512 * 4096), rel=2e-5)


def test_two_slices_of_v5e_256_put_data_parallelism_across_the_slices(planner, tmp_path, record_property):
    import dataclasses

    from experiments.llama import llama_8b

    script = pod_experiment(tmp_path, model='dataclasses.replace(llama_8b, remat="full")',
                            imports="import dataclasses\nfrom experiments.llama import llama_8b",
                            resources='ResourceConfig.with_tpu("v5litepod-256", slice_count=2)')
    code, (plan,) = marin_plan(planner, script, tmp_path / "prefix", "--set", "train.batch_size=512",
                               "--set", "train.seq_len=4096", "--vocab-size", str(LLAMA3_VOCAB))
    assert code == 0 and plan["fits"], plan
    assert plan["topology"] == "v5e:16x16" and plan["slices"] == 2 and plan["chips"] == 512
    assert plan["mesh"] == {"data": 2, "fsdp": 256, "experts": 1, "model": 1}
    # Each slice holds the whole state, sharded over its own 256 chips: the count is one slice's.
    config = dataclasses.replace(llama_8b, remat="full")
    check_memory(plan, Shape(config, LLAMA3_VOCAB, 4096, fsdp=256), record_property)
    assert plan["flops_per_step"] == pytest.approx(llama_matmul_flops(config, LLAMA3_VOCAB, 512 * 4096), rel=2e-5)
    # The gradients are summed across the slices once a step, over the data-centre network.
    assert plan["collectives"]["all-reduce"]["count"] >= 1


def test_a_step_on_the_cpu_is_not_compiled_ahead_and_says_so(offline, tmp_path, capsys):
    code = cli.main(["plan", str(TUTORIAL), "--prefix", str(tmp_path / "prefix"), "--vocab-size", "4063"])
    out = capsys.readouterr().out
    assert code == 0
    assert "checkpoints/marin-nano-tinystories: with_cpu(): compiling ahead is for TPUs" in out
    assert not (tmp_path / "prefix").exists()


def test_plan_names_the_training_steps_when_asked_for_another(offline, tmp_path, capsys):
    code = cli.main(["plan", str(TUTORIAL), "tokenized/tinystories", "--prefix", str(tmp_path / "prefix")])
    assert code == 2
    assert "declares no training step 'tokenized/tinystories'; its training steps are: checkpoints/marin-nano-tinystories" \
        in capsys.readouterr().err


def test_without_a_vocabulary_the_plan_says_where_to_get_one(offline, tmp_path, capsys):
    script = pod_experiment(tmp_path, model="llama_nano", imports="from experiments.llama import llama_nano",
                            resources='ResourceConfig.with_tpu("v5litepod-4")')
    code = cli.main(["plan", str(script), "--prefix", str(tmp_path / "prefix")])
    assert code == 2
    err = capsys.readouterr().err
    assert "trains with the vocabulary of tokenized/tinystories's tokenizer" in err and "--vocab-size" in err


def test_the_moe_family_with_expert_parallelism_on_a_v5e_64(planner, tmp_path, record_property):
    import dataclasses

    from experiments.moe import OLMOE_VOCAB_SIZE, olmoe_1b_7b

    # OLMoE-1B-7B's 64 experts split 8 ways (each chip holds 8 of every layer's), the rest on fsdp=8.
    script = pod_experiment(tmp_path, model='dataclasses.replace(olmoe_1b_7b, remat="full")',
                            imports="import dataclasses\nfrom experiments.moe import olmoe_1b_7b\n"
                                    "from levanter.trainer import MeshConfig",
                            resources='ResourceConfig.with_tpu("v5litepod-64")', mesh="MeshConfig(fsdp=8, experts=8)")
    code, (plan,) = marin_plan(planner, script, tmp_path / "prefix", "--set", "train.batch_size=128",
                               "--set", "train.seq_len=4096", "--vocab-size", str(OLMOE_VOCAB_SIZE))
    assert code == 0 and plan["fits"], plan
    assert plan["topology"] == "v5e:8x8" and plan["mesh"] == {"data": 1, "fsdp": 8, "experts": 8, "model": 1}
    config = dataclasses.replace(olmoe_1b_7b, remat="full")
    check_memory(plan, Shape(config, OLMOE_VOCAB_SIZE, 4096, fsdp=8, experts=8, batch_rows=2, rows=2), record_property)
    # Tokens travel to their experts' chips and back by all-to-all: in every layer.
    assert plan["collectives"]["all-to-all"]["count"] >= config.num_layers
