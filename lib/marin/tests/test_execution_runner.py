"""Runner behaviour: order, caching, concurrency, failures, cycles, dry run, conflicts, contexts."""

import json
import os
import threading
import time
from dataclasses import dataclass

import pytest

from marin.execution.artifact import load_artifact
from marin.execution.records.executor_files import read_status
from marin.execution.lazy import StepGraphError, lazy_step, lower
from marin.execution.running.step_context import StepContext
from marin.execution.step_runner import Outcome, OutputPathConflict, StepRunFailed, StepRunner
from marin.execution.step_spec import StepSpec


def _runner(tmp_path, **kwargs):
    return StepRunner(prefix=str(tmp_path / "prefix"), poll_s=0.05, **kwargs)


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_steps_run_in_topological_order_and_once(tmp_path):
    order = []
    a = StepSpec("a", lambda: order.append("a"))
    b = StepSpec("b", lambda: order.append("b"), deps=[a])
    c = StepSpec("c", lambda: order.append("c"), deps=[a])
    d = StepSpec("d", lambda: order.append("d"), deps=[b, c])
    # Listing the sink only, twice, still runs every dependency exactly once.
    report = _runner(tmp_path).run([d, d], max_concurrent=1)
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order[0] == "a" and order[-1] == "d"
    assert sorted(report.ran) == ["a", "b", "c", "d"]


def test_second_run_is_cached_and_does_not_call_fn(tmp_path):
    calls = []
    step = StepSpec("counted", lambda: calls.append(1) or {"n": 1}, hash_attrs={"x": 1})
    _runner(tmp_path).run([step])
    report = _runner(tmp_path).run([step])
    assert calls == [1]
    assert report.cached == ["counted"]


def test_changed_hash_attrs_never_reuse_stale_output(tmp_path):
    calls = []

    def make(x):
        return StepSpec("tok", lambda out: calls.append(out), hash_attrs={"x": x})

    first, second = make(1), make(2)
    _runner(tmp_path).run([first])
    _runner(tmp_path).run([second])
    assert len(calls) == 2 and calls[0] != calls[1]
    assert first.identity != second.identity


def test_max_concurrent_two_runs_two_at_once_never_three(tmp_path):
    active, peak, lock = [0], [0], threading.Lock()

    def slow():
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.25)
        with lock:
            active[0] -= 1

    steps = [StepSpec(f"slow{i}", slow) for i in range(4)]
    _runner(tmp_path).run(steps, max_concurrent=2)
    assert peak[0] == 2


def test_failure_marks_dependents_and_independent_branch_completes(tmp_path):
    ran = []

    def boom():
        raise RuntimeError("kaput")

    bad = StepSpec("bad", boom)
    child = StepSpec("child", lambda: ran.append("child"), deps=[bad])
    grandchild = StepSpec("grandchild", lambda: ran.append("grandchild"), deps=[child])
    other = StepSpec("other", lambda: ran.append("other"))
    runner = _runner(tmp_path)
    with pytest.raises(StepRunFailed, match="bad") as info:
        runner.run([grandchild, other])
    report = info.value.report
    assert ran == ["other"]
    assert report.failed == ["bad"] and "kaput" in report.outcome_of("bad").error
    assert sorted(report.dep_failed) == ["child", "grandchild"]
    assert report.outcome_of("child").outcome is Outcome.DEP_FAILED and report.outcome_of("other").outcome == "ran"
    assert report.ran == ["other"]
    assert read_status(runner.output_path_for(bad)).status == "FAILED"
    assert read_status(runner.output_path_for(child)).status == "DEP_FAILED"
    # raise_on_failure=False returns the report instead; FAILED steps are rerun by default.
    report = runner.run([grandchild], raise_on_failure=False)
    assert report.failed == ["bad"]


def test_failed_step_is_rerun_by_default_and_refused_when_asked(tmp_path):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("first try fails")

    step = StepSpec("flaky", flaky)
    runner = _runner(tmp_path)
    runner.run([step], raise_on_failure=False)
    report = runner.run([step], force_run_failed=False, raise_on_failure=False)
    assert len(attempts) == 1 and report.failed == ["flaky"]
    assert "force_run_failed" in report.outcome_of("flaky").error
    report = runner.run([step])
    assert len(attempts) == 2 and report.ran == ["flaky"]


def test_cycle_is_refused_naming_it(tmp_path):
    a = StepSpec("alpha", lambda: None)
    b = StepSpec("beta", lambda: None, deps=[a])
    # Frozen specs cannot form a cycle by construction; a mutated graph (or a buggy helper) can.
    object.__setattr__(a, "deps", (b,))
    with pytest.raises(StepGraphError, match=r"(alpha -> beta -> alpha|beta -> alpha -> beta)"):
        _runner(tmp_path).run([b])


def test_dry_run_writes_nothing_and_reports_the_plan(tmp_path, capsys):
    calls = []
    done = StepSpec("done", lambda: calls.append("done"))
    runner = _runner(tmp_path)
    runner.run([done])
    before = _files(tmp_path)
    todo = StepSpec("todo", lambda: calls.append("todo"), deps=[done])
    report = runner.run([todo], dry_run=True)
    assert _files(tmp_path) == before
    assert calls == ["done"]
    assert report.cached == ["done"] and report.would_run == ["todo"]
    out = capsys.readouterr().out
    assert todo.short_hash in out and runner.output_path_for(todo) in out and "to run" in out


def test_explicit_output_path_with_other_identity_is_refused(tmp_path):
    first = StepSpec("pre", lambda: None, output_path="outputs/pre", hash_attrs={"param": 1})
    runner = _runner(tmp_path)
    runner.run([first])
    calls = []
    second = StepSpec("pre", lambda: calls.append(1), output_path="outputs/pre", hash_attrs={"param": 2})
    with pytest.raises(OutputPathConflict) as info:
        runner.run([second])
    message = str(info.value)
    assert first.identity in message and second.identity in message and "Delete" in message
    assert calls == []
    assert runner.output_path_for(second) == str(tmp_path / "prefix" / "outputs" / "pre")


def test_two_identities_on_one_output_path_are_refused(tmp_path):
    a = StepSpec("a", lambda: None, output_path="same")
    b = StepSpec("b", lambda: None, output_path="same")
    with pytest.raises(StepGraphError, match="both write to"):
        _runner(tmp_path).run([a, b])


def test_functions_are_called_by_signature(tmp_path):
    seen = {}

    def no_args():
        seen["none"] = True

    def with_path(path):
        seen["path"] = path

    def with_ctx(ctx):
        seen["ctx"] = ctx.output_path

    def annotated(c: StepContext):
        seen["annotated"] = c.step.name

    runner = _runner(tmp_path)
    steps = [StepSpec("n", no_args), StepSpec("p", with_path), StepSpec("c", with_ctx), StepSpec("an", annotated)]
    runner.run(steps)
    # A function writes into its execution's staging folder, moved into the step's folder on success.
    assert seen["none"] and seen["path"] == runner.output_path_for(steps[1]) + "/.staging-g1"
    assert seen["ctx"] == runner.output_path_for(steps[2]) + "/.staging-g1" and seen["annotated"] == "an"


def test_a_step_that_writes_no_file_commits_its_result_alone(tmp_path, monkeypatch):
    from rigging.fencing import Fence

    made, updates = {}, []
    real_update = Fence.update
    monkeypatch.setattr(Fence, "update", lambda self, changes, **kw: updates.append(changes) or real_update(self, changes, **kw))

    def no_args():
        made["none"] = os.path.exists(runner.output_path_for(steps[0]) + "/.staging-g1")
        return {"answer": 42}

    def given_a_folder(ctx):
        made["ctx"] = os.path.isdir(ctx.output_path)
        return {"here": ctx.output_path}  # a path into its folder, though it wrote nothing there

    runner = _runner(tmp_path)
    steps = [StepSpec("quiet/none", no_args), StepSpec("quiet/ctx", given_a_folder)]
    report = runner.run(steps)
    # A function given no folder gets none made; one given a folder finds it made.
    assert made == {"none": False, "ctx": True}
    # Nothing to move, so no commit point: SUCCESS is written while the record is held.
    assert not any(changes.get("committing") for changes in updates)
    for step in steps:
        folder = runner.output_path_for(step)
        # No staging folder left, and no manifest: there is no output file to record.
        assert sorted(os.listdir(folder)) == [".artifact.json", ".attempts", ".executor_info", ".executor_status"]
        assert read_status(folder).status == "SUCCESS" and read_status(folder).staging is None
    assert load_artifact(runner.output_path_for(steps[0])).result == {"answer": 42}
    here = runner.output_path_for(steps[1])
    assert report.outcome_of("quiet/ctx").result == {"here": here}  # the path moved with the output
    record = json.loads(open(os.path.join(here, ".artifact.json")).read())
    assert record["result"] == {"here": "."} and load_artifact(here).result == {"here": here}


@dataclass(frozen=True)
class Shard:
    path: str
    count: int


@dataclass(frozen=True)
class Tokenized:
    shards: tuple[Shard, ...]
    vocab: int


def test_lazy_handles_lower_and_pass_artifacts_downstream(tmp_path):
    def tokenize(ctx):
        with open(os.path.join(ctx.output_path, "data.txt"), "w") as handle:
            handle.write("tokens")
        return Tokenized(shards=(Shard("data.txt", 3),), vocab=50257)

    tokens = lazy_step("tokenized/demo", tokenize, hash_attrs={"tokenizer": "gpt2"})

    def train(c):
        upstream = c.load_artifact(tokens, Tokenized)
        assert isinstance(upstream.result.shards[0], Shard)
        assert c.dep_output_path("tokenized/demo") == upstream.output_path
        return {"vocab": upstream.result.vocab, "read": open(os.path.join(upstream.output_path, "data.txt")).read()}

    model = lazy_step("checkpoints/demo", train, deps=[tokens], version="v1")
    specs = lower(model, model)
    assert [s.name for s in specs] == ["tokenized/demo", "checkpoints/demo"]
    assert specs[-1].identity == model.identity
    assert {model: 1.0}[model] == 1.0  # handles are usable as dictionary keys

    runner = _runner(tmp_path)
    report = runner.run([lower(model)])  # the tutorial's form: a list holding lower()'s list
    assert report.ran == ["tokenized/demo", "checkpoints/demo"]
    artifact = load_artifact(runner.output_path_for(specs[-1]))
    assert artifact.result == {"vocab": 50257, "read": "tokens"}
    assert artifact.provenance.identity == model.identity and artifact.provenance.step == "checkpoints/demo"
    again = StepRunner(prefix=str(tmp_path / "prefix")).run([model])
    # The model is done, so nothing needs its data: the data step is not even read.
    assert again.cached == ["checkpoints/demo"] and again.not_needed == ["tokenized/demo"]


def test_runner_on_memory_filesystem():
    prefix = f"memory://runner-test-{os.getpid()}"
    calls = []
    up = StepSpec("up", lambda ctx: calls.append("up") or [1, 2, 3])
    down = StepSpec("down", lambda ctx: calls.append("down") or sum(ctx.load_artifact(up).result), deps=[up])
    runner = StepRunner(prefix=prefix)
    runner.run([down])
    again = StepRunner(prefix=prefix).run([down])
    assert again.cached == ["down"] and again.not_needed == ["up"]
    assert calls == ["up", "down"]
    out = runner.output_path_for(down)
    assert out.startswith("memory://") and load_artifact(out).result == 6
    assert read_status(out).status == "SUCCESS"


def test_lost_lease_never_writes_success(tmp_path):
    def hijacked(ctx):
        step_folder = os.path.dirname(ctx.output_path)  # the function writes into <step>/.staging-gN
        lock = os.path.join(step_folder, ".executor_lock")
        deadline = time.time() + 10
        # Keep rewriting the lock as another holder would: a heartbeat already in flight may
        # overwrite one write, but the next heartbeat must notice.
        while not ctx.lost_lease and time.time() < deadline:
            with open(lock, "w") as handle:
                json.dump({"holder": "intruder", "host": "elsewhere", "pid": 1, "acquired_at": time.time(), "heartbeat_at": time.time()}, handle)
            time.sleep(0.01)
        ctx.check_lease()

    runner = _runner(tmp_path, heartbeat_s=0.02)
    step = StepSpec("hijacked", hijacked)
    report = runner.run([step], raise_on_failure=False)
    assert report.failed == ["hijacked"] and "lost the lease" in report.outcome_of("hijacked").error
    assert read_status(runner.output_path_for(step)).status == "RUNNING"  # neither SUCCESS nor overwritten as FAILED


def test_run_only_selects_matching_steps_and_their_deps(tmp_path):
    ran = []
    base = StepSpec("data/base", lambda: ran.append("base"))
    train = StepSpec("train/model", lambda: ran.append("train"), deps=[base])
    evaluate = StepSpec("eval/model", lambda: ran.append("eval"), deps=[train])
    report = _runner(tmp_path).run([evaluate], run_only=r"^train/")
    assert ran == ["base", "train"] and report.ran == ["data/base", "train/model"]
    with pytest.raises(ValueError, match="matches no step"):
        _runner(tmp_path).run([evaluate], run_only="nothing-like-this")


def test_non_json_result_fails_the_step_clearly(tmp_path):
    step = StepSpec("weird", lambda: object())
    report = _runner(tmp_path).run([step], raise_on_failure=False)
    assert report.failed == ["weird"] and "JSON-like" in report.outcome_of("weird").error


def test_ready_steps_start_in_plan_order_and_a_failure_blocks_a_deep_chain_without_recursion(tmp_path):
    # One worker: the start order is the plan order among the steps whose dependencies are done.
    order = []
    root = StepSpec("root", lambda: order.append("root"))
    leaves = [StepSpec(f"leaf{i}", (lambda i=i: order.append(f"leaf{i}")), deps=[root]) for i in range(5)]
    report = _runner(tmp_path).run(leaves, max_concurrent=1)
    assert order == ["root", *(f"leaf{i}" for i in range(5))] and len(report.ran) == 6

    def boom():
        raise RuntimeError("kaput")

    # A chain deeper than Python's recursion limit below a failed step: every link is DEP_FAILED,
    # each naming the link above it, and a step beside the chain still runs.
    chain = [StepSpec("chain/bad", boom)]
    for index in range(1500):
        chain.append(StepSpec(f"chain/{index:04d}", lambda: None, deps=[chain[-1]]))
    beside = StepSpec("chain/beside", lambda: order.append("beside"))
    report = _runner(tmp_path).run([chain[-1], beside], raise_on_failure=False)
    assert report.failed == ["chain/bad"] and len(report.dep_failed) == 1500 and report.ran == ["chain/beside"]
    assert report.outcome_of("chain/0000").error == "dependency failed: chain/bad"
    assert report.outcome_of("chain/1499").error == "dependency failed: chain/1498"


def test_a_rerun_names_the_first_cached_steps_and_counts_the_rest(tmp_path, caplog):
    import logging

    def nothing():
        return None

    steps = [StepSpec(f"many/s{i:02d}", nothing, hash_attrs={"i": i}) for i in range(25)]
    StepRunner(prefix=str(tmp_path)).run(steps)
    with caplog.at_level(logging.INFO, logger="marin.execution.step_runner"):
        report = StepRunner(prefix=str(tmp_path)).run(steps)
    assert len(report.cached) == 25
    named = [r for r in caplog.records if r.getMessage().startswith("Step many/") and " cached: " in r.getMessage()]
    assert len(named) == 20
    assert any("and 5 more cached step(s)" in r.getMessage() for r in caplog.records)
