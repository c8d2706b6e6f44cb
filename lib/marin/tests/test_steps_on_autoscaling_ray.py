"""Steps through iris on a Ray cluster whose worker group scales from zero, with Ray's own autoscaler.

The head (``LocalRayCluster.start_head(autoscaler=...)``) runs Ray's autoscaler over its fake
multi-node provider: a real ``monitor.py`` reading a cluster config like the one ``infra/`` writes,
starting and removing Ray nodes of this machine instead of cloud VMs. Its one worker group, ``gpu``,
declares ``gpu_like: 1`` and scales between zero and one node; idle nodes go after 9 s.

Drivers are processes run as a user would (``StepRunner(cluster="iris:ray:autoscaling")``), each
watching the group's nodes through ``ray.nodes()`` while it runs:

* a step asking for ``gpu_like`` while the group is at zero nodes is not refused: the runner says
  which node it waits for, the autoscaler adds one, the step runs there, and the group returns to
  zero once it is idle;
* a step asking for a resource no node type declares is refused before anything runs, naming it;
* the node under a running step is taken away (its raylet and every process below it killed, as a
  reclaimed spot VM): iris counts a preemption, and the retry waits for the autoscaler's new node
  instead of being refused because no live node holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray engine needs `pip install 'marin[ray]'`")

from fray.cluster.ray_nodes import FakeAutoscaler, LocalRayCluster  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LocalRayCluster finds its processes in /proc"),
]

GROUP = FakeAutoscaler(
    {"gpu": {"resources": {"CPU": 1, "gpu_like": 1, "memory": 1 << 30}, "min_workers": 0, "max_workers": 1}},
    idle_timeout_minutes=0.15,  # long enough for a new node to take its step on a busy machine
)
DRIVER_TIMEOUT_S = 300

DRIVER = textwrap.dedent(
    '''
    import json, os, signal, sys, threading, time
    from pathlib import Path

    import ray
    from fray.cluster import ResourceConfig
    from marin.execution.step_runner import StepRunner
    from marin.execution.step_spec import StepSpec

    mode, prefix, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    ray.init(address="auto", log_to_driver=False)

    def group_nodes():
        return sum(1 for node in ray.nodes() if node["Alive"] and "gpu_like" in node["Resources"])

    def wait_for(count, timeout):
        deadline = time.monotonic() + timeout
        while group_nodes() != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gpu group did not reach {count} node(s) in {timeout} s")
            time.sleep(0.25)
        return time.time()

    timeline = []  # (time, live nodes of the group) at every change

    def watch():
        last = None
        while True:
            count = group_nodes()
            if count != last:
                timeline.append((time.time(), count))
                last = count
            time.sleep(0.25)

    def on_the_group(output_path):
        facts = {"node_type": os.environ.get("RAY_NODE_TYPE_NAME"), "instance": os.environ.get("RAY_CLOUD_INSTANCE_ID"),
                 "attempt": os.environ.get("IRIS_ATTEMPT"), "at": time.time()}
        (out / f"attempt-{facts['attempt']}.json").write_text(json.dumps(facts))
        if vanish_on_first_attempt and facts["attempt"] == "1":
            take_the_node_away()
        return facts

    def take_the_node_away():
        # A reclaimed VM: its raylet and everything below it die at once (this process included).
        pid = os.getpid()
        while pid > 1:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if os.path.basename(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")[0].decode()) == "raylet":
                break
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        else:
            raise RuntimeError("no raylet above this process")
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                children.setdefault(parent, []).append(int(entry))
        tree, stack = [], [pid]
        while stack:
            current = stack.pop()
            tree.append(current)
            stack.extend(children.get(current, ()))
        for victim in sorted(tree, key=lambda p: p == os.getpid()):
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass

    started = time.time()
    wait_for(0, 120)  # a node left by an earlier driver goes first
    threading.Thread(target=watch, daemon=True).start()
    vanish_on_first_attempt = mode == "preempt"
    custom = {"tpu_like": 1} if mode == "refuse" else {"gpu_like": 1}
    step = StepSpec(f"autoscaled/{mode}", fn=on_the_group,
                    resources=ResourceConfig.with_cpu(cpu=1, ram="256m", custom=custom, max_retries_preemption=1))
    result = {"mode": mode, "started": time.time()}
    try:
        report = StepRunner(prefix=prefix, cluster="iris:ray:autoscaling").run([step], raise_on_failure=False)
        result.update(ok=report.ok, value=report.outcome_of(step.name).result)
    except Exception as error:
        result.update(ok=False, error=f"{type(error).__name__}: {error}")
    result["finished"] = time.time()
    result["zero_again"] = wait_for(0, 120)
    time.sleep(1)  # the watching thread sees it too
    result["timeline"] = timeline
    print("RESULT " + json.dumps(result), flush=True)
    '''
)


@pytest.fixture(scope="module")
def cluster():
    with LocalRayCluster() as nodes:
        nodes.start_head("head", cpus=1, autoscaler=GROUP)
        yield nodes


def _drive(cluster: LocalRayCluster, tmp_path: Path, mode: str) -> tuple[dict, str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    out = tmp_path / "records"
    out.mkdir()
    env = {**os.environ, **cluster.driver_env}
    env.pop("MARIN_CLUSTER", None)
    done = subprocess.run([sys.executable, str(script), mode, str(tmp_path / "prefix"), str(out)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    output = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, output[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT ")), output


def _counts(timeline: list) -> list[int]:
    return [count for _, count in timeline]


def test_a_step_for_a_group_at_zero_scales_it_up_runs_there_and_the_group_scales_down(cluster, tmp_path):
    result, output = _drive(cluster, tmp_path, "scale")
    assert result["ok"], output[-6000:]
    assert "waiting for the autoscaler to add a node with gpu_like:1 (worker group 'gpu'), up to 15 min" in output
    assert result["value"]["node_type"] == "gpu"  # the node the autoscaler started, not the head
    assert _counts(result["timeline"]) == [0, 1, 0]
    node_up = result["timeline"][1][0]
    print(f"scale-up {node_up - result['started']:.1f} s, step finished {result['finished'] - node_up:.1f} s later, "
          f"scale-down {result['zero_again'] - result['finished']:.1f} s after the run")


def test_a_resource_no_node_type_declares_is_refused_before_anything_runs(cluster, tmp_path):
    result, output = _drive(cluster, tmp_path, "refuse")
    assert not result["ok"]
    assert "ClusterConfigError" in result["error"] and "has the resource 'tpu_like'" in result["error"]
    assert "gpu" in result["error"] and "\n" not in result["error"]
    assert _counts(result["timeline"]) == [0]  # nothing was started for it
    assert not list((tmp_path / "records").iterdir())


def test_a_step_whose_node_is_taken_away_is_retried_on_the_autoscalers_next_node(cluster, tmp_path):
    result, output = _drive(cluster, tmp_path, "preempt")
    assert result["ok"], output[-6000:]
    first = json.loads((tmp_path / "records" / "attempt-1.json").read_text())
    second = json.loads((tmp_path / "records" / "attempt-2.json").read_text())
    assert first["node_type"] == second["node_type"] == "gpu"
    assert first["instance"] != second["instance"]  # a new node, added after the first was taken away
    assert "attempt 1 PREEMPTED" in output and "attempt 2 SUCCEEDED" in output
    assert _counts(result["timeline"])[:4] == [0, 1, 0, 1] and _counts(result["timeline"])[-1] == 0
    print(f"preempted at {first['at'] - result['started']:.1f} s, rerun at {second['at'] - result['started']:.1f} s, "
          f"done at {result['finished'] - result['started']:.1f} s")
