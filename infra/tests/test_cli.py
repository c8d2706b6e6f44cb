"""``python -m infra.cli``: what a user types, as a user types it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLE = Path(__file__).resolve().parent.parent / "stacks" / "example.yaml"
ROOT = EXAMPLE.parents[2]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_cluster_file_writes_what_ray_up_reads(tmp_path):
    done = cli("cluster-file", str(EXAMPLE), "-o", "cluster.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((tmp_path / "cluster.yaml").read_text())
    assert set(config["available_node_types"]) == {"head", "cpu", "h100", "v5e"}
    assert config["provider"] == {"type": "gcp", "region": "us-central1", "availability_zone": "us-central1-a",
                                  "project_id": "mylab-marin", "cache_stopped_nodes": False}


def test_a_bad_setting_is_one_line_naming_the_field_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("name: mylab-marin-prefix", "name: Mylab_Prefix"))
    done = cli("check", str(bad), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: Stack setting bucket.name: bucket name 'Mylab_Prefix' may hold only lowercase")


def test_plan_lists_every_grant_offline(tmp_path):
    done = cli("plan", str(EXAMPLE), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 20  # 7 APIs, bucket, 3 accounts, role, repository, service, 6 grants
    assert sum("member=" in line for line in lines) == 6
    assert not any("allUsers" in line or "roles/owner" in line or "roles/editor" in line for line in lines)


def test_plan_without_the_infra_extra_is_one_line_saying_what_to_install(tmp_path):
    # A Python where Pulumi's SDK cannot be imported, as after a plain `pip install -e .`.
    without_pulumi = ("import sys; sys.modules['pulumi'] = None; from infra.cli import main; "
                      f"sys.exit(main(['plan', {str(EXAMPLE)!r}]))")
    done = subprocess.run([sys.executable, "-c", without_pulumi], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr == ("error: plan runs the stack's Pulumi program, which needs Pulumi's SDK, and 'pulumi' is not "
                           "installed here; install the infra extra: pip install -e '.[infra]'\n")
