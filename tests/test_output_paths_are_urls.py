"""Library code treats every output location as a URL: no local-path calls outside an allowlist.

Step outputs live under a prefix that may be ``s3://``, ``gs://`` or ``memory://`` (DESIGN §6), so
library code reads and writes them through ``rigging.filesystem`` / fsspec. This test parses every
module under ``lib/*/src`` and reports each call of an API that only understands local paths:
``os.path.exists`` says False for every URL, ``os.path.abspath`` turns ``s3://b/x`` into
``<cwd>/s3:/b/x``, ``open`` writes a local file under a folder named ``s3:``. Imports are followed
(``from os.path import join``, ``import numpy as np``); a ``pathlib.Path`` is reported where it is made.

Some local-only code is legitimate: the local branch of ``rigging.filesystem`` itself, temporary
staging folders, ``/proc``, the user's Hugging Face cache, source files read for code fingerprints.
Each such use is an entry of :data:`ALLOWED`: the module, the function (``Class.method``, or
``outer.inner`` for a nested function, ``<module>`` for top-level code) and why it is safe. An entry
covers every listed call in that one function, never a whole module; an entry that no longer matches
anything fails the test too, so the list stays exactly as long as it needs to be.
"""

from __future__ import annotations

import ast
import builtins
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Qualified names of calls that only work on local paths.
LOCAL_ONLY_CALLS = frozenset({
    "os.path.abspath", "os.path.realpath", "os.path.normpath", "os.path.relpath",
    "os.path.join", "os.path.exists", "os.path.isdir", "os.path.isfile", "os.path.getsize",
    "os.makedirs", "os.mkdir", "os.listdir", "os.scandir", "os.walk",
    "os.remove", "os.unlink", "os.rename", "os.replace", "os.rmdir",
    "glob.glob", "glob.iglob",
    "pathlib.Path", "pathlib.PurePath", "pathlib.PosixPath",
    "open", "io.open",
    "numpy.load", "numpy.save", "numpy.memmap", "numpy.fromfile",
    "safetensors.numpy.load_file", "safetensors.numpy.save_file", "safetensors.safe_open",
})
LOCAL_ONLY_MODULES = ("shutil",)  # every function of these

# Packages whose modules are checked. levanter is left out while its outputs (checkpoints, exports,
# metrics) are being moved onto rigging.filesystem; its allowlist entries are below, ready for when
# it joins.
CHECKED_PACKAGES = ("rigging", "haliax", "fray", "iris", "zephyr", "levanter", "marin")


@dataclass(frozen=True)
class Allowed:
    module: str
    function: str
    reason: str


_HF_CACHE = "a snapshot folder of the user's local Hugging Face cache, never a step output"
_LOG_FILE = ("a replica's log is kept open and appended to on this machine: on a local prefix it is the log "
             "itself (the path fsspec's local filesystem gives), on an object store its local spool copy")
_SPOOL = "a temporary folder of this machine that holds a remote attempt's logs between uploads"
_IRIS_HOME = "iris's job database and logs live in its local home (IRIS_HOME; a remote prefix is refused)"
_PACKAGE_DATA = "files shipped inside the installed package, read where Python installed them"
_SLURM_FOLDER = "a Slurm job's folder on storage shared with the nodes, read and written by path"

ALLOWED: tuple[Allowed, ...] = (
    # rigging: the one place that does local file operations, each in its local branch.
    Allowed("rigging.filesystem", "absolute", "makes only protocol-less and file:// paths absolute; URLs pass unchanged"),
    Allowed("rigging.filesystem", "atomic_open", "the LocalFileSystem branch: temporary sibling, fsync, os.replace"),
    Allowed("rigging.filesystem", "remove_empty_folder", "the LocalFileSystem branch: os.rmdir of an emptied folder"),
    Allowed("rigging.filesystem", "_local_files", "the LocalFileSystem branch of find_files: a local folder's listings, no status call per file"),
    Allowed("rigging.filesystem", "create_local_file", "a descriptor of a new local file, for the LocalFileSystem branches of small records"),
    Allowed("rigging.filesystem", "write_local_atomically", "the LocalFileSystem branch of atomic_write: temporary sibling, fsync, os.replace"),
    Allowed("rigging.conditional_writes", "_LocalDisk.create", "conditional writes on LocalFileSystem: hard link of a private temporary file"),
    Allowed("rigging.conditional_writes", "_LocalDisk._overwrite_in_place", "conditional writes on LocalFileSystem: a full disk's in-place rewrite"),
    Allowed("marin.execution.ownership.step_ownership", "_move_entries", "the local-disk branch (fsx.is_local) of a commit's move: one listing, renames"),
    Allowed("marin.execution.ownership.step_ownership", "_rename_over", "a rename on local disk, called from _move_entries' local branch only"),
    Allowed("marin.execution.ownership.step_ownership", "Execution._commit_result", "inside Fence.held, which holds only a local record (elsewhere CannotHoldError before anything is written): the step folder is local"),
    Allowed("marin.execution.ownership.step_ownership", "_staged_anything", "the local-disk branch (fsx.is_local) of whether a staging folder holds anything"),
    Allowed("marin.execution.ownership.step_ownership", "_entry_names", "the local-disk branch (fsx.is_local) of a folder's names; fsspec's ls elsewhere"),
    Allowed("marin.execution.running.iris_steps", "IrisStepExecutor.live_job", "an iris database (IRIS_HOME) is a local folder, never an output URL"),
    Allowed("marin.execution.running.iris_steps", "IrisStepExecutor._store_of", "an iris database (IRIS_HOME) is a local folder, never an output URL"),
    Allowed("rigging.conditional_writes", "_LocalDisk.remove", "conditional writes on LocalFileSystem: an atomic rename aside, then a check"),
    Allowed("rigging.config.discovery", "_resolve_prefix", "runs after URLs are returned unchanged; resolves local prefixes only"),
    Allowed("rigging.config.discovery", "discover_config", "the working directory where marin.yaml is searched for, upwards"),
    Allowed("rigging.config.discovery", "_find_upwards", "walks up the local working directory's folders to marin.yaml / pyproject.toml"),
    Allowed("rigging.lease", "_proc_stat", "reads /proc/<pid>/stat to tell whether a local holder is alive"),
    Allowed("rigging.lease", "_pid_namespace", "reads /proc for the boot id and pid namespace of this machine"),
    Allowed("rigging.local_stores", "_serving", "the local server process writes its log to a local file"),
    Allowed("rigging.secrets", "_credentials_file_values", "GOOGLE_APPLICATION_CREDENTIALS names a key file of this machine"),
    # fray and iris: processes on this machine, their payloads and logs.
    Allowed("fray.cluster.job_worker", "main", "the payload file ProcessJob wrote into its local temporary folder"),
    Allowed("fray.cluster.worker_pool", "load_shipped", "a worker reads the pickled function its parent wrote to a local temporary file"),
    Allowed("fray.cluster.worker_pool", "shipped_function", "removes the local temporary file it wrote for the workers on this machine"),
    Allowed("fray.cluster.process_job", "ProcessJob.__init__", "payload and log file in a tempfile.mkdtemp folder of this job"),
    Allowed("fray.cluster.process_job", "ProcessJob.start", "the job's local log file, and its working directory on this machine"),
    Allowed("fray.cluster.process_job", "ProcessJob.read_log", "the log file in this job's local temporary folder"),
    Allowed("fray.cluster.process_job", "ProcessJob.release", "removes this job's own local temporary folder"),
    Allowed("fray.cluster.ray_nodes", "LocalRayCluster.__init__", "the cluster's own tempfile.mkdtemp folder on this machine"),
    Allowed("fray.cluster.ray_nodes", "LocalRayCluster._start_once", "a node's log file in the cluster's local temporary folder"),
    Allowed("fray.cluster.ray_nodes", "LocalRayCluster._claim_worker_ports", "lock files in this machine's temporary folder"),
    Allowed("fray.cluster.ray_nodes", "LocalRayCluster.stop", "removes the cluster's own local temporary folder"),
    Allowed("fray.cluster.ray_nodes", "_ray_cli", "the ray executable beside this Python interpreter, or on PATH"),
    Allowed("fray.cluster.ray_nodes", "_stat_fields", "reads /proc/<pid>/stat of a local process"),
    Allowed("fray.cluster.ray_nodes", "_process_tree", "lists /proc to find a local node's processes"),
    # fray on Slurm: a job's folder is a POSIX path that sbatch, slurmd and the node's worker open
    # themselves, on storage the submitting machine and the nodes mount (never an output URL).
    Allowed("fray.cluster.job_worker", "_write_result", "the result file in a Slurm job's shared job folder"),
    Allowed("fray.cluster.slurm_client", "<module>", "the node worker's source file, run by path on the nodes"),
    Allowed("fray.cluster.slurm_client", "SlurmClient.submit", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_client", "SlurmClient._command", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_client", "SlurmClient.map", "the pickled function every task's job reads from the shared job root"),
    Allowed("fray.cluster.slurm_client", "_collect", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_commands", "run_slurm", "looks up Slurm's commands on this machine's PATH"),
    Allowed("fray.cluster.slurm_commands", "_configuration_problem", "SLURM_CONF names a file of this machine"),
    Allowed("fray.cluster.slurm_job", "SlurmJob._path", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_job", "SlurmJob._recorded_exit_code", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_job", "SlurmJob.read_log", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_job", "SlurmJob.free_address", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_job", "SlurmJob.terminate", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_job", "SlurmJob.release", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_worker", "write_atomically", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_worker", "wait_for_start", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_worker", "run", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_worker", "take_secrets", _SLURM_FOLDER),
    Allowed("fray.cluster.slurm_local", "_which", "finds the Slurm and munge programs installed on this machine"),
    Allowed("fray.cluster.slurm_local", "_memory_mib", "reads /proc/meminfo of this machine"),
    Allowed("fray.cluster.slurm_local", "state_dir_or_default", "the local cluster's state folder on this machine"),
    Allowed("fray.cluster.slurm_local", "_is_daemon_of", "reads /proc/<pid> of a local daemon"),
    Allowed("fray.cluster.slurm_local", "LocalSlurmCluster.__init__", "the local cluster's own tempfile.mkdtemp folder"),
    Allowed("fray.cluster.slurm_local", "LocalSlurmCluster._spawn", "a daemon's output file in the cluster's local folder"),
    Allowed("fray.cluster.slurm_local", "LocalSlurmCluster.stop", "removes the cluster's own local folder (temporary, or its state folder)"),
    Allowed("iris.placement", "start_supervisor", _IRIS_HOME + "; the job's working directory is a local folder"),
    Allowed("iris.jobs", "follow_logs", _IRIS_HOME),
    Allowed("fray.cluster.ray_autoscaler", "_read_config", "the autoscaler's config file on the Ray head's own disk"),
    Allowed("fray.cluster.ray_autoscaler", "_monitor_arguments", "reads /proc of the Ray head to find its autoscaler's config"),
    Allowed("iris.store", "default_home", _IRIS_HOME),
    Allowed("iris.store", "JobStore.__init__", _IRIS_HOME),
    Allowed("iris.supervisor", "Replica._write", _IRIS_HOME),
    Allowed("iris.attempt_log", "AttemptLog._write", _LOG_FILE),
    Allowed("iris.attempt_log", "AttemptLog._file_of", _LOG_FILE),
    Allowed("iris.attempt_log", "_spool_read", _SPOOL),
    Allowed("iris.attempt_log", "_spool_remove", _SPOOL),
    Allowed("iris.attempt_log", "_make_local_folder", "called only when the attempt's folder is local (AttemptLog._local): its deferred folder, made by path"),
    # zephyr
    Allowed("zephyr.execute", "execute", "removes the shuffle scratch folder it made with tempfile.mkdtemp"),
    Allowed("zephyr.readers", "_splits_in", _HF_CACHE),
    Allowed("zephyr.readers", "resolve_hub_dataset", _HF_CACHE),
    Allowed("zephyr.token_cache.reader", "_Shard._map", "memory-maps shards of local caches only; remote ones are read by range"),
    # marin
    Allowed("marin.datasets.hub", "HuggingFaceHub.cached_revision", _HF_CACHE),
    Allowed("marin.evaluation.harness", "include_path_identity", "lm-eval reads task files from local disk; URLs are refused first"),
    Allowed("marin.evaluation.tasks", "<module>", _PACKAGE_DATA),
    Allowed("marin.evaluation.tasks.object_colours.colours", "<module>", _PACKAGE_DATA),
    Allowed("marin.evaluation.tasks.object_colours.colours", "write_test_items", _PACKAGE_DATA),
    Allowed("marin.evaluation.tasks.object_colours.colours", "load_dataset", _PACKAGE_DATA),
    Allowed("marin.execution.hashing.code_fingerprint", "_fingerprint_code", "the Python source file a step function was loaded from"),
    Allowed("marin.execution.hashing.code_fingerprint", "_parse", "the Python source file a step function was loaded from"),
    Allowed("marin.execution.command_line.commands", "run_command", "the user's script on this machine, run with runpy"),
    Allowed("marin.execution.command_line.reproduce_command", "reproduce_command", "the user's script on this machine, run with runpy"),
    Allowed("marin.experiment.plan_command", "plan_command", "the user's script on this machine, run with runpy"),
    Allowed("marin.execution.reproducibility.reproduce", "_resolved", "follows the symbolic links of a path fsx.is_local says is on this machine"),
    Allowed("marin.execution.reproducibility.tensor_diff", "npz_difference", "np.load reads bytes fetched with fsx.open_url, not a path"),
    Allowed("marin.execution.planning.prefix_check", "check_prefix", "returns early unless fsx.is_local(prefix): probes local prefixes only"),
    Allowed("rigging.regular_files", "_real", "called only with paths of LocalFileSystem URLs: where a local link leads"),
    Allowed("rigging.regular_files", "refused_entries.walk",
            "walks only the local path of a LocalFileSystem URL (_local_path): object stores hold no special files or links"),
    Allowed("marin.curation.language_models", "_sha256", "a language model file a pip install put in site-packages"),
    Allowed("marin.curation.language_models", "_installed_file", "a language model file a pip install put in site-packages"),
    Allowed("marin.curation.reference_tasks", "builtin_tasks", _PACKAGE_DATA),
    Allowed("marin.curation.classifier", "load_scorer", "np.load reads a file object opened with fsx.open_url, not a path"),
    # levanter: local branches, staging folders, the hub cache.
    Allowed("levanter.compat.hf_format", "save_safetensors", "inside `if fsx.is_local(url)`: safetensors streams to disk"),
    Allowed("levanter.compat.hf_format", "load_safetensors", "inside `if fsx.is_local(file_path)`: memory-maps the file"),
    Allowed("levanter.main.train_lm", "train_lm", "inside `if fsx.is_local(out)`: creates the local output folder"),
    Allowed("levanter.tokenization.loading", "_looks_like_path", "reached only for specs without '://': a local path test"),
    Allowed("levanter.tokenization.loading", "_read_tokenizer_files_from_hub", _HF_CACHE),
    Allowed("levanter.trainer.checkpoint", "Checkpointer._disk_full_message", "disk usage of a local checkpoint or staging folder"),
    Allowed("levanter.trainer.checkpoint", "Checkpointer._size_note", "inside `if fsx.is_local(...)`; object stores use fs.du"),
    Allowed("levanter.trainer.checkpoint_staging", "CheckpointStaging.local_path_of", "the local tempfile.mkdtemp staging folder Orbax writes"),
    Allowed("levanter.trainer.checkpoint_staging", "CheckpointStaging._copy_up", "walks the local staging folder to upload it"),
    Allowed("levanter.trainer.checkpoint_staging", "CheckpointStaging.download", "creates folders in the local staging folder"),
    Allowed("levanter.trainer.checkpoint_staging", "CheckpointStaging.discard_local", "removes a step from the local staging folder"),
    Allowed("levanter.trainer.compilation_cache", "compilation_cache_dir", "JAX's compilation cache lives in the user's local cache folder"),
    Allowed("levanter.trainer.profiler", "StepProfiler.stop", "removes the local tempfile.mkdtemp folder jax.profiler wrote"),
    Allowed("levanter.trainer.tracker.jsonl", "JsonlTracker.__init__", "inside `if local`: appends to a local metrics file"),
    Allowed("levanter.trainer.tracker.tensorboard", "TensorBoardTracker.close", "removes its local staging folder"),
)

HOW_TO_FIX = """\
Outputs can live on object storage, so library code must not treat them as local paths:
  - join with rigging.filesystem.join (fsx.join), never os.path.join;
  - open with fsx.open_url / fsx.atomic_open / fsx.read_text, never open();
  - test with fsx.exists / fsx.filesystem(url)[0].isdir, list with fsx.ls / fsx.find_files;
  - keep URLs as they are: fsx.absolute makes a local path absolute and leaves a URL alone, where
    os.path.abspath / realpath / normpath would turn s3://b/x into a local path.
If a call really only ever touches the local machine (a temporary staging folder, /proc, the user's
Hugging Face cache, a source file), add an entry to ALLOWED in tests/test_output_paths_are_urls.py:
  Allowed("<module>", "<function>", "<why this path is always local>"),
naming the one function (Class.method, outer.inner, or <module>) it applies to."""


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    module: str
    function: str
    call: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.call}(...) in {self.module}.{self.function}"


class _CallFinder(ast.NodeVisitor):
    """Collects local-only calls of one module, each with the function it appears in."""

    def __init__(self, names: dict[str, str]):
        self.names = names  # local name -> the qualified name it was imported as
        self.scope: list[str] = []
        self.found: list[tuple[int, str, str]] = []

    def _scoped(self, node: ast.AST) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        name = self._qualified(node.func)
        if name is not None and (name in LOCAL_ONLY_CALLS or name.split(".")[0] in LOCAL_ONLY_MODULES):
            self.found.append((node.lineno, ".".join(self.scope) or "<module>", name))
        self.generic_visit(node)

    def _qualified(self, func: ast.expr) -> str | None:
        attributes: list[str] = []
        while isinstance(func, ast.Attribute):
            attributes.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None  # a call on a computed value: Path(x).open() is reported at Path(x)
        base = self.names.get(func.id)
        if base is None:
            if attributes or not hasattr(builtins, func.id):
                return None
            base = func.id  # an unshadowed builtin, such as open
        return ".".join([base, *reversed(attributes)])


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Every name bound by an import anywhere in the module, or by a def/class (which shadows builtins)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and hasattr(builtins, node.name):
            names[node.name] = f"<local>.{node.name}"
    return names


def local_path_calls(source: str, *, module: str, file: str) -> list[Finding]:
    """The local-only calls in ``source`` (the text of ``module``, read from ``file``)."""
    tree = ast.parse(source, filename=file)
    finder = _CallFinder(_imported_names(tree))
    finder.visit(tree)
    return [Finding(file, line, module, function, call) for line, function, call in finder.found]


def library_modules(packages: tuple[str, ...] = CHECKED_PACKAGES) -> Iterator[tuple[str, Path]]:
    for package in packages:
        src = REPO / "lib" / package / "src"
        for path in sorted(src.rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def scan(packages: tuple[str, ...] = CHECKED_PACKAGES) -> list[Finding]:
    findings = []
    for module, path in library_modules(packages):
        findings += local_path_calls(path.read_text(encoding="utf-8"), module=module, file=str(path.relative_to(REPO)))
    return findings


def unallowed(findings: list[Finding], allowed: tuple[Allowed, ...] = ALLOWED) -> list[Finding]:
    keys = {(entry.module, entry.function) for entry in allowed}
    return [f for f in findings if (f.module, f.function) not in keys]


def report(offending: list[Finding]) -> str:
    return (f"{len(offending)} local-path call(s) in library code:\n  " + "\n  ".join(str(f) for f in offending)
            + "\n\n" + HOW_TO_FIX)


def test_library_code_uses_no_local_path_calls_outside_the_allowlist():
    offending = unallowed(scan())
    if offending:
        pytest.fail(report(offending), pytrace=False)


def test_every_allowlist_entry_is_used_explained_and_listed_once():
    used = {(f.module, f.function) for f in scan()}
    checked = {module for module, _ in library_modules()}
    stale = [e for e in ALLOWED if e.module.split(".")[0] in CHECKED_PACKAGES and (e.module, e.function) not in used]
    if stale:
        pytest.fail("allowlist entries that match no local-path call any more (remove them):\n  " + "\n  ".join(
            f"{e.module}.{e.function}" + ("" if e.module in checked else " (no such module)") for e in stale), pytrace=False)
    unexplained = [f"{e.module}.{e.function}" for e in ALLOWED if len(e.reason.split()) < 4]
    assert not unexplained, f"allowlist entries must say why the path is always local: {unexplained}"
    keys = [(e.module, e.function) for e in ALLOWED]
    assert len(keys) == len(set(keys)), f"allowlist entries listed twice: {sorted(k for k in keys if keys.count(k) > 1)}"


PLANTED = textwrap.dedent('''
    import os
    import os.path as osp
    from pathlib import Path
    from shutil import copytree
    from rigging import filesystem as fsx

    def write_summary(output_path, text):
        folder = os.path.abspath(output_path)
        with open(osp.join(folder, "summary.txt"), "w") as f:
            f.write(text)

    class Exporter:
        def copy(self, source, output_path):
            copytree(source, Path(output_path) / "copy")

    def fine(output_path, text):
        fsx.atomic_write(fsx.join(output_path, "summary.txt"), text)
        return os.path.basename(output_path)
''')


def test_the_checker_reports_a_planted_local_path_call_with_file_and_line():
    findings = local_path_calls(PLANTED, module="marin.planted", file="lib/marin/src/marin/planted.py")
    reported = [str(f) for f in unallowed(findings)]
    assert reported == [
        "lib/marin/src/marin/planted.py:9: os.path.abspath(...) in marin.planted.write_summary",
        "lib/marin/src/marin/planted.py:10: open(...) in marin.planted.write_summary",
        "lib/marin/src/marin/planted.py:10: os.path.join(...) in marin.planted.write_summary",
        "lib/marin/src/marin/planted.py:15: shutil.copytree(...) in marin.planted.Exporter.copy",
        "lib/marin/src/marin/planted.py:15: pathlib.Path(...) in marin.planted.Exporter.copy",
    ]
    # An allowlist entry covers its one function, not the rest of the module.
    entry = Allowed("marin.planted", "Exporter.copy", "a planted example of a justified local copy")
    assert [f.function for f in unallowed(findings, (entry,))] == ["write_summary"] * 3
    # And the suite's failure message names the file, the line and what to do.
    message = report(unallowed(findings))
    assert "planted.py:9: os.path.abspath(...) in marin.planted.write_summary" in message
    assert "add an entry to ALLOWED" in message and "fsx.join" in message
