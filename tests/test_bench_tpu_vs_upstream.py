"""bench/tpu_vs_upstream.py's decisions, without an accelerator or upstream's packages: which folders
upstream's processes see, how a shape is read, when a ratio is withheld, and how upstream's steps are timed."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "vs_upstream_sides"))
import tpu_vs_upstream  # noqa: E402
from tpu_vs_upstream import Runner, Shape, Work, compare, our_argv, upstream_env  # noqa: E402
from upstream_loop import steady_tokens_per_second, timed_steps  # noqa: E402


def test_upstream_sees_the_machines_folders_then_its_own_and_none_of_ours():
    ours = [str(ROOT / "lib" / "levanter" / "src"), str(ROOT)]
    base = {"PYTHONPATH": ":".join(["/opt/machine", "/tmp/site", *ours]), "TPU_NAME": "kept"}
    env = upstream_env(base, "/tmp/upstream-site", ["/tmp/site"])
    assert env["PYTHONPATH"] == "/opt/machine:/tmp/upstream-site" and env["TPU_NAME"] == "kept"
    with pytest.raises(SystemExit, match="our own folders"):
        upstream_env(base, str(ROOT / "lib" / "haliax" / "src"), ["/tmp/site"])


def test_a_shape_names_the_model_the_batch_and_our_remat_and_microbatch():
    assert Shape.parse("llama_600m:16::4") == Shape("llama_600m:16::4", "llama_600m", 16, None, 4)
    assert Shape.parse("llama_150m:8:save_matmuls") == Shape("llama_150m:8:save_matmuls", "llama_150m", 8, "save_matmuls", None)
    for bad in ("llama_600m", "llama_600m:x", "llama_600m:8:full:two", "a:1:b:2:c"):
        with pytest.raises(SystemExit, match="--shapes"):
            Shape.parse(bad)


def test_a_shape_may_end_with_our_memory_levers_which_reach_our_side_only():
    shape = Shape.parse("llama_1_4b:8:save_attention:offload:bf16")
    assert (shape.remat, shape.microbatch, shape.offload, shape.moment_dtype) == ("save_attention", None, True, "bfloat16")
    assert Shape.parse("llama_600m:8:offload") == Shape("llama_600m:8:offload", "llama_600m", 8, None, None, offload=True)
    args = SimpleNamespace(ours_python="python", seq_len=2048, steps=8, warmup_steps=2, doc_len=[100, 600],
                           matmul=False, ours_args="")
    argv = our_argv(args, shape)
    assert argv[argv.index("--moment-dtype") + 1] == "bfloat16" and "--offload" in argv
    plain = our_argv(args, Shape.parse("llama_1_4b:8:save_attention"))
    assert "--offload" not in plain and "--moment-dtype" not in plain
    for bad in ("llama_1_4b:8:offload:full", "llama_1_4b:8:bf16:offload:full:2"):
        with pytest.raises(SystemExit, match="--shapes"):
            Shape.parse(bad)


def test_the_work_shape_is_read_from_our_llama_config():
    shape = Shape.parse("llama_150m:16")
    work = tpu_vs_upstream.work_of(shape, 2048)
    from experiments.llama import LLAMA_SIZES

    config, vocab = LLAMA_SIZES["llama_150m"]
    assert work.upstream_shape == {"layers": 6, "hidden": 512, "intermediate": 1792, "heads": 8, "kv_heads": 8,
                                   "vocab": vocab, "seq_len": 2048, "tied": False}
    assert (work.parameters, work.flops_per_token) == (config.num_parameters(vocab), config.flops_per_token(vocab, 2048))


ARGS = SimpleNamespace(seq_len=2048, peak_tflops=200.0)
WORK = Work({}, parameters=1000, flops_per_token=1e9)


def side(**changes) -> dict:
    return {"tokens_per_s": 50_000.0, "parameters": 1000, "batch": 4, "seq_len": 2048, "device_kind": "TPU v5 lite",
            **changes}


def test_both_sides_mfu_comes_from_one_flop_count_and_the_ratio_is_ours_over_upstream():
    line = compare(Shape.parse("m:4"), WORK, side(tokens_per_s=60_000.0), side(), ARGS, matmul_tflops=160.0)
    assert line["ratio"] == 1.2 and "refused" not in line
    assert line["ours"]["mfu"] == 0.3 and line["upstream"]["mfu"] == 0.25  # 1e9 FLOPs x tokens/s over 200 TFLOP/s
    assert line["upstream"]["mfu_of_matmul"] == round(5e13 / 1.6e14, 4)


@pytest.mark.parametrize("upstream, reason", [
    (side(parameters=1001), "parameters differ: ours 1000, upstream 1001"),
    (side(device_kind="cpu"), "device_kind differ"),
    (side(batch=8), "batch 8 is not 4"),
])
def test_unequal_work_withholds_the_ratio(upstream, reason):
    line = compare(Shape.parse("m:4"), WORK, side(), upstream, ARGS, matmul_tflops=None)
    assert line["ratio"] is None and reason in line["refused"]


def test_a_failed_side_is_reported_beside_the_other_sides_figures():
    line = compare(Shape.parse("m:4"), WORK, side(), {"error": "exited 1: boom"}, ARGS, matmul_tflops=None)
    assert line["ratio"] is None and line["upstream"] == {"error": "exited 1: boom"}
    assert line["ours"]["tokens_per_s"] == 50_000.0


def test_a_run_that_the_budget_cannot_fit_is_skipped_without_starting():
    record = Runner(budget_s=5, side_timeout_s=60).run("x", ["/nonexistent/python"], {})
    assert record["error"].startswith("skipped")


def steps(*seen):
    return iter(SimpleNamespace(step=step) for step in seen)


def test_upstream_steps_are_timed_around_the_loop_every_one_of_them():
    marks, last = timed_steps(steps(0, 1, 2, 3), total=4)
    assert len(marks) == 5 and last.step == 3 and marks == sorted(marks)
    # 3 steps after one of warm-up, 100 tokens each, over the time from the end of step 0 to the end
    assert steady_tokens_per_second([0.0, 10.0, 11.0, 12.0, 14.0], 1, 100) == 300 / 4.0


@pytest.mark.parametrize("seen", [(2, 3), (0, 1, 2), (0, 2, 1, 3)])
def test_a_loop_that_skips_or_reorders_steps_is_refused(seen):
    with pytest.raises(SystemExit, match="once each, in order"):
        timed_steps(steps(*seen), total=4)


def test_a_failed_sides_headline_is_its_error_not_a_warning_printed_first():
    output = ("UserWarning: You are using a Python version (3.11.7) which Google will stop supporting\n"
              "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
              "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM\n--------------------\n")
    assert tpu_vs_upstream.headline(output).startswith("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED")
    assert tpu_vs_upstream.headline("ran past its 22 s timeout and was killed") == "ran past its 22 s timeout and was killed"
