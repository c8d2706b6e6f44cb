"""Every code block of README.md and docs/*.md that can run on this machine runs as written.

A page's Python blocks are saved as one script, in order, and run with ``python``, twice, as a
reader who saves the page's code (or pastes it twice) would: the pages start in a scratch folder
and prefix of their own, so the second time starts afresh (no assertion about what ran fails, no
FAILED step stays in the reader's prefix, nothing is written beside them). The script keeps each
block at its line of the page (everything else is blank), so a traceback's line numbers are the
page's; and since it runs as ``__main__``, a block that starts worker processes needs the
``if __name__ == "__main__":`` guard a saved script needs. Shell blocks (```bash, ```sh) of one page
run in order, each in its own ``bash -euo pipefail``. Both run in a scratch folder holding links to
the checkout's ``.venv``, ``experiments/`` and ``lib/`` (so ``source .venv/bin/activate``, ``marin run
experiments/...`` and paths into ``lib/`` work as in the repository root, while what a block writes lands in the scratch
folder), with MARIN_PREFIX and IRIS_HOME pointing at scratch folders and this Python's environment
first on PATH. A page's shell blocks start on a prefix that holds the tutorial's outputs, as the
pages say they do after ``make tutorial``: the tutorial runs once per test run, from nothing, with
``--set train.num_train_steps=2``, and each page gets a copy.

A block opts out with ``no-run`` in its fence (```python no-run, ```bash no-run); the page says why
next to it (a cloud account, a real cluster, the network). A long shell block may carry
``test-set=NAME.KEY=VALUE`` words: the test adds ``--set NAME.KEY=VALUE`` after the script (or
step) of each of its ``marin run`` and ``marin reproduce`` lines, and the page says so. A shell
block fenced ``serves=PORT`` starts a server that runs until stopped (``marin serve-model ...
--port PORT``): the test starts it in the background, waits (a bounded time) until it answers on
its port, runs the page's later shell blocks while it serves, and stops it at the end; the page's
blocks use a free port the test picks in place of PORT, so two runs never collide. A Python block
fenced ``save-as=FILE`` is a file the page asks the reader to save (a client for that server): the
test writes it into the scratch folder before the shell blocks run, which run it as the page says
(``python FILE``); it is not part of the page's script. A shell block that needs what not every
machine has says so with ``needs=NAME`` (``needs=slurm``: Slurm's daemons and root, see
scripts/install_slurm.sh); where it is missing, the page's other blocks run and the test then
skips, naming the blocks left out and why. Its private Slurm lives in a scratch state folder
(``FRAY_SLURM_LOCAL_DIR``) and is stopped at the end even when a block fails. Every fence names its
language, so a command cannot hide in an unlabelled block.
"""

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
SHELLS = ("bash", "sh")
OPTIONS = re.compile(r"no-run|test-set=\S+|needs=slurm|serves=\d+|save-as=[\w.-]+")
SERVER_START_TIMEOUT_S = 240
SCRIPT_TIMEOUT_S = 600
# The settings go right after the script (or step) a `marin run` (`marin reproduce`) line names, so
# a redirection, a trailing `&` or a comment after it stays where it was.
SETTABLE = re.compile(r"^(\s*marin (?:run|reproduce) \S+)", re.MULTILINE)


def fences(page: Path) -> list[tuple[int, str, list[str], str]]:
    """(line number, language, options, body) for each fenced block of ``page``."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        language, *options = match.group(1).strip().split() or [""]
        found.append((text.count("\n", 0, match.start()) + 1, language, options, match.group(2)))
    return found


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, code) for each runnable python block of ``page`` that is part of its script."""
    return [(line, body) for line, language, options, body in fences(page)
            if language == "python" and "no-run" not in options and not _option(options, "save-as")]


def page_script(page: Path) -> str:
    """The page's Python blocks as one script, each block on its own lines of the page (the rest blank)."""
    lines = [""] * page.read_text().count("\n")
    for line, code in python_blocks(page):
        for offset, text in enumerate(code.splitlines()):
            lines[line + offset] = text  # the block's first line is the one after its fence
    return "\n".join(lines).rstrip() + "\n"


def saved_files(page: Path) -> list[tuple[str, str]]:
    """(file name, content) of each ``save-as=FILE`` block of ``page``."""
    return [(_option(options, "save-as"), body) for _, language, options, body in fences(page)
            if language == "python" and _option(options, "save-as") and "no-run" not in options]


def _option(options: list[str], name: str) -> str | None:
    return next((option.removeprefix(f"{name}=") for option in options if option.startswith(f"{name}=")), None)


def shell_blocks(page: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line number, script, needs) for each runnable shell block of ``page``, its test-set words
    applied; a block that serves has ``serves=PORT`` among its needs."""
    blocks = []
    for line, language, options, body in fences(page):
        if language not in SHELLS or "no-run" in options:
            continue
        sets = "".join(f" --set {option.removeprefix('test-set=')}" for option in options
                       if option.startswith("test-set="))
        needs = tuple(option for option in options if option.startswith("serves="))
        needs += tuple(option.removeprefix("needs=") for option in options if option.startswith("needs="))
        script = SETTABLE.sub(lambda m: m.group(1) + sets, body) if sets else body
        blocks.append((line, script, needs))
    return blocks


def missing(need: str) -> str | None:
    """Why this machine cannot run a block with ``needs=NAME``, or ``None`` when it can."""
    from fray.cluster.slurm_local import missing_slurm

    if need.startswith("serves="):
        return None
    return {"slurm": missing_slurm}[need]()


PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
PYTHON_PAGES = [page for page in PAGES if python_blocks(page)]
SHELL_PAGES = [page for page in PAGES if shell_blocks(page)]


def scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working folder that reads like the repository root, and the environment to run in it."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    for linked in ("experiments", "lib"):
        (workdir / linked).symlink_to(ROOT / linked)
    # The suite's simulated devices (conftest's XLA_FLAGS) are left out: commands see one CPU device,
    # as on a reader's machine, where the tutorial's batch of 4 splits evenly. They keep the suite's
    # compile flags (see conftest.py).
    compile_flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                     if not flag.startswith("--xla_force_host_platform_device_count")]
    # iris's folder is not named "iris": beside a page saved as a script it would be found as the
    # package of that name when the script runs again.
    env = {**os.environ, "XLA_FLAGS": " ".join(compile_flags), "MARIN_PREFIX": str(tmp_path / "prefix"), "IRIS_HOME": str(tmp_path / "iris-home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")]))}
    return workdir, env


TUTORIAL = "marin run experiments/tutorials/train_tiny_model.py --set train.num_train_steps=2"


@pytest.fixture(scope="session")
def tutorial_prefix(tmp_path_factory) -> Path:
    """A prefix where the tutorial has run (two training steps), shared read-only by the pages.

    Built once for the whole run: the pages' tests are spread over the pytest-xdist workers one by
    one (see conftest.py), so the first worker to need it builds it in the run's common temporary
    folder while the others wait on a lock; a failed build is recorded, so it fails each page at once.
    """
    common = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        common = common.parent  # the folder all workers' own temporary folders are in
    base, built, failed = common / "docs-tutorial", common / "docs-tutorial.built", common / "docs-tutorial.failed"
    with _exclusive(common / "docs-tutorial.lock", timeout_s=600):
        if failed.exists():
            pytest.fail(failed.read_text())
        if not built.exists():
            shutil.rmtree(base, ignore_errors=True)
            base.mkdir()
            workdir, env = scratch(base)
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", TUTORIAL], cwd=workdir, env=env,
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                failed.write_text(f"{TUTORIAL} failed:\n{done.stdout}\n{done.stderr}")
                pytest.fail(failed.read_text())
            built.touch()
    return base / "prefix"


@contextmanager
def _exclusive(lock_path: Path, timeout_s: float):
    """Hold an exclusive lock on ``lock_path`` (waiting at most ``timeout_s``) for the block."""
    with open(lock_path, "w") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"gave up waiting {timeout_s:.0f} s for {lock_path}")
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def test_fence_parser_skips_no_run_blocks_and_applies_test_settings(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\nx = 1\n```\n\n```python no-run\nraise SystemExit\n```\n\n```bash\nls\n```\n\n"
                    "```bash no-run\nray up\n```\n\n```bash test-set=train.steps=2 test-set=a.b=c\n"
                    "marin status\nmarin run t.py   # train\n  marin run t.py > w.log 2>&1 &\n```\n")
    assert [code for _, code in python_blocks(page)] == ["x = 1\n"]
    assert [code for _, code, _ in shell_blocks(page)] == [
        "ls\n", "marin status\nmarin run t.py --set train.steps=2 --set a.b=c   # train\n"
                 "  marin run t.py --set train.steps=2 --set a.b=c > w.log 2>&1 &\n"]
    page.write_text("```bash needs=slurm\nmarin slurm start\n```\n")
    assert shell_blocks(page) == [(1, "marin slurm start\n", ("slurm",))]


def test_a_pages_script_keeps_each_block_on_its_page_line_and_leaves_out_saved_files(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("Text.\n\n```python\nx = 1\ny = 2\n```\n\nMore.\n\n```python save-as=client.py\nprint(x)\n```\n\n"
                    "```bash serves=8000\nmarin serve-model m --port 8000\n```\n\n```python\nassert x + y == 3\n```\n")
    script = page_script(page).splitlines()
    assert script[3:5] == ["x = 1", "y = 2"] and script[18] == "assert x + y == 3"  # page lines 4, 5 and 19
    assert "print(x)" not in page_script(page)
    assert saved_files(page) == [("client.py", "print(x)\n")]
    assert shell_blocks(page) == [(14, "marin serve-model m --port 8000\n", ("serves=8000",))]
    assert _with_ports("curl localhost:8000/v1 --port 8000; echo 18000 8000.5", {"8000": "41234"}) == (
        "curl localhost:41234/v1 --port 41234; echo 18000 8000.5")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_fence_names_its_language_and_known_options(page):
    for line, language, options, _ in fences(page):
        assert language, f"{page.name}, block at line {line}: name its language (```bash, ```python, ```text)"
        unknown = [option for option in options if not OPTIONS.fullmatch(option)]
        assert not unknown, f"{page.name}, block at line {line}: unknown fence options {unknown}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[p.name for p in PYTHON_PAGES])
def test_docs_examples_run(page, tmp_path):
    workdir, env = scratch(tmp_path)
    script = tmp_path / f"{page.stem}.py"   # saved beside the scratch folder: the page says nothing of it
    script.write_text(page_script(page))
    env["TMPDIR"] = str(tmp_path)           # the pages' scratch folders land here
    for run in ("first", "second"):
        done = subprocess.run([sys.executable, str(script)], cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT_S)
        assert done.returncode == 0, (f"{page.name}'s Python blocks, saved as a script, failed when run the {run} time "
                                      f"(line numbers are the page's):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    left = sorted(path.name for path in workdir.iterdir())
    assert left == [".venv", "experiments", "lib"], f"{page.name} wrote {left} outside its scratch folder"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _with_ports(text: str, ports: dict[str, str]) -> str:
    """``text`` with each port a page serves on replaced by the free one the test chose for it."""
    for page_port, free in ports.items():
        text = re.sub(rf"(?<![\d.]){page_port}(?!\d|\.\d)", free, text)
    return text


@contextmanager
def _serving(script: str, port: str, workdir: Path, env: dict[str, str], log: Path):
    """Run ``script`` in the background until the block ends; wait until something answers on ``port``."""
    with open(log, "w") as output:
        server = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env, stdout=output,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", int(port))) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the server block did not answer on port {port} "
                            f"({'it exited ' + str(server.returncode) if server.poll() is not None else 'timed out'}):\n"
                            f"{log.read_text(errors='replace')[-4000:]}")
            time.sleep(0.5)
        yield
    finally:
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("page", SHELL_PAGES, ids=[p.name for p in SHELL_PAGES])
def test_docs_shell_blocks_run(page, tmp_path, request):
    from fray.cluster.slurm_local import STATE_DIR_ENV, stop_local_slurm

    left_out, runnable = [], []
    for line, script, needs in shell_blocks(page):
        reasons = [reason for reason in map(missing, needs) if reason is not None]
        if reasons:
            left_out.append(f"block at line {line} ({'; '.join(reasons)})")
        else:
            runnable.append((line, script, _option(list(needs), "serves")))
    if not runnable:
        pytest.skip(f"{page.name}: left out {', '.join(left_out)}")
    workdir, env = scratch(tmp_path)
    ports = {port: str(_free_port()) for _, _, port in runnable if port}
    for name, content in saved_files(page):
        (workdir / name).write_text(_with_ports(content, ports))
    # Asked for only here: a page none of whose blocks can run here needs no tutorial.
    shutil.copytree(request.getfixturevalue("tutorial_prefix"), env["MARIN_PREFIX"], symlinks=True)
    # A private Slurm of the page's own: short, directly under the system's temporary folder (the
    # daemons' unix socket paths must stay short), never the reader's ~/.cache/fray/slurm-local.
    slurm_state = tempfile.mkdtemp(prefix="slurm-docs-")
    env.update({STATE_DIR_ENV: slurm_state, "FRAY_SLURM_DIR": str(tmp_path / "slurm-jobs")})
    env.pop("SLURM_CONF", None)
    try:
        with ExitStack() as servers:
            for line, script, port in runnable:
                script = _with_ports(script, ports)
                if port:
                    servers.enter_context(_serving(script, ports[port], workdir, env, tmp_path / f"server-{line}.log"))
                    continue
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workdir, env=env,
                                      capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, f"{page.name}, block at line {line} failed:\n{done.stdout}\n{done.stderr}"
    finally:
        stop_local_slurm(slurm_state, grace=5)
        shutil.rmtree(slurm_state, ignore_errors=True)
    if left_out:
        pytest.skip(f"{page.name}: left out {', '.join(left_out)}")
