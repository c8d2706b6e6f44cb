"""Suite-wide pytest settings, and the two kinds of test data.

Most tests run on text they make themselves (``synthetic_stories``). The few that compare against
the real thing (exact GPT-2 ids of the TinyStories sample) take it from ``real_data``: the folder
named by ``MARIN_TEST_DATA``, else ``shared/`` beside the checkout, else the user's cache, else a
download into that cache when ``MARIN_TEST_FETCH=1`` asks for one; without any of these they skip,
all with one reason saying how to provide the data.
"""

import gc
import hashlib
import json
import os
import socket
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
# Read before the suite's own offline default below: only a user's explicit setting forbids a fetch.
_USER_HF_HUB_OFFLINE = os.environ.get("HF_HUB_OFFLINE", "")

# Tests run on the CPU with a few simulated devices available to sharding tests; JAX reads these
# at import, so they are set before any test module imports it. The tests' programs are tiny and
# each runs for milliseconds, so compiling them costs far more than running them, and the compile
# flags trade speed of the compiled code for speed of compiling: without LLVM's optimisation passes
# and with XLA's older CPU fusion code generator (the newer one compiles programs this small more
# slowly), six small training steps trace and compile in 8.0 CPU-s instead of 18.9 with XLA's defaults
# (13.0 without LLVM's passes alone), and a 400-step training run ends at the same loss either way.
# Subprocess tests that set their own device count keep these flags (they read them from here).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                                   "--xla_cpu_use_fusion_emitters=false")
# Tests that compile for TPU topologies (libtpu, no chip) may run in several workers at once; libtpu
# otherwise takes a machine-wide lock meant for processes sharing a real chip.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# NumPy's OpenBLAS starts a thread per core at import, and they spin while the process imports the
# rest (0.1 to 0.2 CPU-s a process); the suite's arrays are tiny and it starts hundreds of processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Many tests build trainers that jit fresh closures over the same tiny models; with JAX's
# persistent compilation cache, identical programs are compiled once per machine instead of once per
# test (child processes inherit the variables, so subprocess tests share it too).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"marin-test-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def pytest_sessionfinish(session, exitstatus):
    # A selection that matches nothing (`-k` on a typo, an empty test folder) is not a failure
    # of the code under test; only real failures should turn CI red.
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


# -- the collector -------------------------------------------------------------------------------


def pytest_collection_finish(session):
    """After collection, the objects every test module imported (JAX, PyTorch, transformers: millions)
    are moved out of reach of Python's cyclic collector, and it runs less often.

    A worker otherwise spends a tenth of its CPU in the collector, mostly in full collections that
    walk those modules' objects again and again: 4.1 CPU-s of 38 over test_hf_gemma, test_remat and
    test_trainer, 1.2 with this. Objects freed by reference counting (nearly all) are freed as before.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 100)


# -- how make test spreads the suite over workers (pytest-xdist) -------------------------------------

# Test files that must run on the same worker because they share one thing for the whole run.
SHARED_WORKER = {
    "slurm": (  # one Slurm cluster for the run (the session fixture slurm_cluster)
        "lib/fray/tests/test_clients_slurm.py",
        "lib/marin/tests/test_steps_through_iris.py",
        "lib/marin/tests/test_steps_through_iris_failures.py",
        "lib/marin/tests/test_fencing_on_slurm.py",
        "lib/marin/tests/test_chaos_kills.py",
    ),
    "ray": (  # local Ray clusters, one at a time: a node starting on a busy machine can miss Ray's 30 s limit
        "lib/fray/tests/test_clients_ray.py",
        "lib/fray/tests/test_jobs.py",
        "lib/iris/tests/test_iris_jobs.py",
        "lib/marin/tests/test_curation_on_ray.py",
        "lib/marin/tests/test_ray_two_nodes.py",
        "lib/marin/tests/test_runner_on_ray.py",
        "lib/zephyr/tests/test_zephyr_ray.py",
    ),
}
_GROUP_OF_FILE = {path: group for group, paths in SHARED_WORKER.items() for path in paths}
# Test files spread over the workers test by test: each test is long (a docs page runs its commands;
# a pod's plan compiles for hundreds of chips) and what they share is built once for the whole run,
# not per module (see the file).
SPREAD_BY_TEST = ("tests/test_docs.py", "tests/test_pod_plans.py")
# Test files that spend their time waiting more than computing (on processes they kill, on leases that
# run out, on stalls they provoke): they start with the long files, so that their waits overlap the
# other workers' computing, instead of ending the run alone on one worker with the cores idle.
WAITING_FILES = (
    "tests/test_isolated_tests.py",
    "lib/rigging/tests/test_lease_object_store.py",
    "lib/marin/tests/test_iris_steps_local.py",
    "lib/marin/tests/test_step_fencing_kills.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Each test file runs whole on one worker (``--dist loadfile``), files in SHARED_WORKER together,
    the tests of SPREAD_BY_TEST files each on its own.

    A file's module fixtures (a trained model, a server) are then built once, not once per worker.
    (xdist's own ``loadgroup`` marks are not used: they ride on rewritten node ids, which newer
    pytest releases no longer carry to the scheduler.)
    """
    from xdist.scheduler import LoadFileScheduling

    if config.getvalue("dist") != "loadfile":
        return None

    class FilesAndSharedGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path in SPREAD_BY_TEST:
                return nodeid
            return _GROUP_OF_FILE.get(path, path)

    return FilesAndSharedGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """The shared groups first, then files holding ``slow`` tests and WAITING_FILES, so that no long
    unit of work starts last and runs alone at the end.

    Workers hand the scheduler their items in this order; ``--no-loadscope-reorder`` keeps it.
    """
    slow_files = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow")}

    def start_order(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return 0 if path in _GROUP_OF_FILE else 1 if path in slow_files or path in WAITING_FILES else 2

    items.sort(key=start_order)  # stable: the order within each part is kept
    if not os.environ.get(ISOLATED_CHILD):
        for item in items:
            if item.get_closest_marker("isolated") is not None:  # past its children's limits (below)
                item.add_marker(pytest.mark.timeout(ISOLATED_ATTEMPTS * _isolated_option(item, "timeout_s") + 120))


# -- tests that can stall where pytest's timeout cannot reach: a child process, killed hard ---------

# Tests on the 8 simulated CPU devices have stalled for good under load with every thread waiting in
# XLA:CPU's collectives, where pytest-timeout's signal never runs and its thread method would take
# the whole worker (and its other tests) down. Such tests are marked ``isolated``: the isolated tests
# of a file run together in one child pytest process (so module fixtures are built once), which is
# killed with its process group (SIGKILL) when it stalls; each test's reports come back to this
# process as pytest-xdist sends them (pytest's own report serialization). The stall is XLA's, rare, and
# does not repeat in a fresh process, so the tests a kill cut short run once more in a new child; a
# test cut short twice fails saying so (a hang of our own would hang both times). ``make test`` then
# goes on with the next test instead of hanging to CI's limit. pytest-timeout's own limit for an
# isolated test, in this process, is set past both children's, so that it never fires first (its
# exception inside this hook would end the whole worker, not fail one test).
#
# A stalled child waits without using the CPU, where a working one (compiling, running its steps)
# gets a share of it however loaded the machine: the child is killed once its processes have used
# less than ISOLATED_IDLE_SHARE of one core over the last ``idle_s`` seconds, and
# in any case after ``timeout_s`` in all. With the time limit alone, a stall held its worker for the
# rest of the 300 s (once, about 220 s) while the machine's cores stood partly idle.
ISOLATED_CHILD = "MARIN_TEST_ISOLATED_REPORTS"  # set in the child: where it appends its reports
ISOLATED_TIMEOUT_S = 300.0  # a file's isolated tests take about a minute on a loaded machine
ISOLATED_IDLE_S = 45.0
ISOLATED_IDLE_SHARE = 0.01
ISOLATED_ATTEMPTS = 2
_isolated_reports: dict[str, list[dict]] = {}  # nodeid -> its serialized reports, per child run
_config = None


def pytest_configure(config):
    global _config
    _config = config


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    marker = item.get_closest_marker("isolated")
    if marker is None or os.environ.get(ISOLATED_CHILD):
        return None
    if item.nodeid not in _isolated_reports:
        _run_isolated(item)
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for data in _isolated_reports.pop(item.nodeid):
        report = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        item.ihook.pytest_runtest_logreport(report=report)
    # What the tests before set up here (a module's fixtures) is torn down as the usual protocol would.
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def _isolated_option(item, name: str) -> float:
    """The ``isolated`` marker's ``timeout_s`` or ``idle_s`` for ``item``, or the suite's default."""
    defaults = {"timeout_s": ISOLATED_TIMEOUT_S, "idle_s": ISOLATED_IDLE_S}
    return float(item.get_closest_marker("isolated").kwargs.get(name, defaults[name]))


def _finished(nodeid: str) -> bool:
    return any(data.get("when") == "teardown" for data in _isolated_reports.get(nodeid, []))


def _run_isolated(item) -> None:
    """Run the isolated tests of ``item``'s file still to come in a child pytest, those a stall cut
    short once more in a second child; keep their reports."""
    import time

    from _pytest.reports import TestReport

    path = item.nodeid.split("::", 1)[0]
    nodeids = [other.nodeid for other in item.session.items if other.nodeid.split("::", 1)[0] == path
               and other.get_closest_marker("isolated") is not None and other.nodeid not in _isolated_reports]
    started = time.monotonic()
    for attempt in range(1, ISOLATED_ATTEMPTS + 1):
        cut_short = [nodeid for nodeid in nodeids if not _finished(nodeid)]
        if not cut_short:
            break  # killed after its last test ended (at exit): nothing to run again (an empty list would run everything)
        for nodeid in cut_short:  # what a killed child said of a test it did not finish is dropped
            _isolated_reports.pop(nodeid, None)
        killed, returncode, output = _isolated_child(item, cut_short)
        if killed is None:
            break  # a child that ended by itself is not run again: its failures are the tests'
    tail = output.decode("utf-8", "replace")[-4000:]
    for nodeid in nodeids:
        if _finished(nodeid):
            continue
        # Cut short: the kill, or a child that died (a crash in XLA) before the test ended.
        why = (f"{killed}, {attempt} time(s)" if killed else
               f"its child process exited {returncode} before the test ended")
        failed = TestReport(nodeid, item.location if nodeid == item.nodeid else (path, None, nodeid), {}, "failed",
                            f"{nodeid}: {why}; the child's output ends with:\n{tail}", "call",
                            duration=time.monotonic() - started)
        _isolated_reports[nodeid] = [
            *_isolated_reports.get(nodeid, [])[:1],
            item.config.hook.pytest_report_to_serializable(config=item.config, report=failed),
        ]


def _isolated_child(item, nodeids: list[str]) -> tuple[str | None, int, bytes]:
    """Run ``nodeids`` in one child pytest killed when it stalls (see above): (why it was killed or
    None, its exit code, its output); the reports it sent are added to ``_isolated_reports``."""
    import signal
    import subprocess
    import sys

    with tempfile.TemporaryDirectory(prefix="isolated-") as folder:
        reports, log = Path(folder) / "reports.jsonl", Path(folder) / "output.log"
        command = [sys.executable, "-m", "pytest", *nodeids, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
        with open(log, "wb") as output:
            child = subprocess.Popen(command, cwd=item.config.rootpath, env={**os.environ, ISOLATED_CHILD: str(reports)},
                                     stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        killed = _watch_for_a_stall(child, _isolated_option(item, "timeout_s"), _isolated_option(item, "idle_s"))
        if killed is not None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        for line in reports.read_text().splitlines() if reports.exists() else []:
            data = json.loads(line)
            _isolated_reports.setdefault(data["nodeid"], []).append(data)
        return killed, child.returncode, log.read_bytes()


def _watch_for_a_stall(child, timeout_s: float, idle_s: float) -> str | None:
    """Wait for ``child`` (the leader of its own session) to end: None when it did, or why it has to be
    killed: past ``timeout_s``, or it and the processes under it idle for ``idle_s``."""
    import subprocess
    import time

    started = time.monotonic()
    samples: list[tuple[float, float]] = []  # (time, CPU seconds the child's tree had used), oldest first
    while True:
        try:
            child.wait(timeout=min(5.0, idle_s / 4))
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if now - started > timeout_s:
            return f"killed (SIGKILL) after {timeout_s:g} s in the child process that ran it (stalled?)"
        used = _cpu_seconds_of_tree(child.pid)
        if used is None:
            continue  # it has just ended: the next wait says so
        samples.append((now, used))
        while len(samples) > 1 and samples[1][0] <= now - idle_s:
            samples.pop(0)
        since, then = samples[0]
        if now - since >= idle_s and used - then < ISOLATED_IDLE_SHARE * (now - since):
            return (f"killed (SIGKILL): the child process that ran it used {used - then:.2f} CPU-s in "
                    f"{now - since:.0f} s (stalled)")


def _cpu_seconds_of_tree(root: int) -> float | None:
    """CPU seconds ``root`` and the processes under it have used, with their children that ended;
    None once ``root`` has ended."""
    import psutil  # Orbax's dependency, so always installed with the project

    try:
        top = psutil.Process(root)
        processes = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # ended meanwhile
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def pytest_runtest_logreport(report):
    target = os.environ.get(ISOLATED_CHILD)
    if target and _config is not None:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(_config.hook.pytest_report_to_serializable(config=_config, report=report)) + "\n")


# -- text the tests make themselves ---------------------------------------------------------------


@pytest.fixture(scope="session")
def synthetic_stories() -> tuple[str, ...]:
    """400 TinyStories-style stories (about 860 characters each) from the project's own generator.

    Deterministic and offline. Tests that need a train and a validation split take disjoint slices.
    """
    from storygen import generate_stories

    return tuple(generate_stories(400, seed=0))


# -- the real sample ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealData:
    """A folder laid out like the project's shared test data (see ``shared/data/README.md``)."""

    root: Path

    @property
    def train(self) -> Path:
        """The TinyStories sample's 1,800 training stories, ``{"text": ...}`` per line."""
        return self.root / "data" / "tinystories" / "train.jsonl"

    @property
    def validation(self) -> Path:
        """The sample's 200 validation stories."""
        return self.root / "data" / "tinystories" / "validation.jsonl"

    @property
    def gpt2(self) -> Path:
        """The folder of the GPT-2 tokenizer (``tokenizer.json``, vocabulary 50,257)."""
        return self.root / "tokenizers" / "gpt2"

    def missing(self) -> list[str]:
        needed = (self.train, self.validation, self.gpt2 / "tokenizer.json")
        return [str(path.relative_to(self.root)) for path in needed if not path.is_file()]


def _user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "marin" / "test-data"


HOW_TO_PROVIDE_REAL_DATA = (
    "needs the real TinyStories sample and GPT-2 tokenizer, in none of MARIN_TEST_DATA (unset), "
    f"{REPO.parent / 'shared'}, {_user_cache()}: set MARIN_TEST_DATA to a folder holding "
    "data/tinystories/{train,validation}.jsonl and tokenizers/gpt2/tokenizer.json, or run once with "
    "MARIN_TEST_FETCH=1 to download them into that cache"
)


@pytest.fixture(scope="session")
def real_data() -> RealData:
    """The real test data, found once per session; skips the test (with how to get it) when absent."""
    explicit = os.environ.get("MARIN_TEST_DATA")
    if explicit:
        data = RealData(Path(explicit).expanduser())
        if data.missing():
            # Set on purpose but wrong: a failure, not a skip that would hide it.
            pytest.fail(f"MARIN_TEST_DATA={explicit} lacks {', '.join(data.missing())}", pytrace=False)
        return data
    for root in (REPO.parent / "shared", _user_cache()):
        if not RealData(root).missing():
            return RealData(root)
    if os.environ.get("MARIN_TEST_FETCH") == "1":
        return _fetch_real_data(_user_cache())
    pytest.skip(HOW_TO_PROVIDE_REAL_DATA)


# The download rebuilds the shared sample from its source and keeps it only if it is byte-identical,
# since tests pin exact counts (1,800 stories, 368,877 GPT-2 tokens).
SAMPLE_URL_PATH = "datasets/roneneldan/TinyStories/resolve/main/TinyStories-train.txt"
SAMPLE_BYTES = 2 * 2**20
SAMPLE_SPLITS = {"train.jsonl": 1800, "validation.jsonl": 200}
SAMPLE_SHA256 = {
    "train.jsonl": "caa2df05cf5cd462fc9e7957b620792236b75ae5ed80de317aaf5a325489796c",
    "validation.jsonl": "ab2be2704dc85a9fce72c2900703133e9133913b133770c4822c2a080517798b",
}
GPT2_URL_PATH = "openai-community/gpt2/resolve/main"
GPT2_FILES = ("tokenizer.json", "vocab.json", "merges.txt")


def _fetch_real_data(cache: Path) -> RealData:
    """Download the sample and tokenizer into ``cache``; skip, naming the cause, when that fails."""
    if _USER_HF_HUB_OFFLINE.lower() not in ("", "0", "false", "no"):
        pytest.skip(f"MARIN_TEST_FETCH=1 but HF_HUB_OFFLINE={_USER_HF_HUB_OFFLINE} forbids the download; "
                    + HOW_TO_PROVIDE_REAL_DATA)
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        url = urllib.parse.urlsplit(endpoint)
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=3).close()
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache.parent) as staging:
            staged = RealData(Path(staging))
            _build_sample(_download(f"{endpoint}/{SAMPLE_URL_PATH}", limit=SAMPLE_BYTES), staged.train.parent)
            _save_gpt2(endpoint, staged.gpt2)
            for path in sorted(Path(staging).rglob("*")):
                if path.is_file():
                    target = cache / path.relative_to(staging)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, target)
    except (OSError, ValueError) as error:
        pytest.skip(f"MARIN_TEST_FETCH=1 but the download from {endpoint} failed ({error}); " + HOW_TO_PROVIDE_REAL_DATA)
    return RealData(cache)


def _download(url: str, *, limit: int | None = None) -> bytes:
    headers = {"Range": f"bytes=0-{limit - 1}"} if limit else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
        return response.read(limit) if limit else response.read()


def _build_sample(head: bytes, folder: Path) -> None:
    """Stories of the first bytes of TinyStories' train split, cut at ``<|endoftext|>``; the last,
    truncated one is dropped. The first 1,800 are the train split, the next 200 validation."""
    stories = [s.strip() for s in head.decode("utf-8", errors="ignore").split("<|endoftext|>")[:-1]]
    stories = [s for s in stories if s]
    folder.mkdir(parents=True)
    start = 0
    for name, count in SAMPLE_SPLITS.items():
        lines = "".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in stories[start : start + count])
        start += count
        if hashlib.sha256(lines.encode("utf-8")).hexdigest() != SAMPLE_SHA256[name]:
            raise ValueError(f"the downloaded {name} differs from the sample the tests expect")
        (folder / name).write_text(lines, encoding="utf-8")


def _save_gpt2(endpoint: str, folder: Path) -> None:
    import tokenizers

    folder.mkdir(parents=True)
    for name in GPT2_FILES:
        (folder / name).write_bytes(_download(f"{endpoint}/{GPT2_URL_PATH}/{name}"))
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    if tok.get_vocab_size() != 50257 or tok.encode("Hello world").ids != [15496, 995]:
        raise ValueError("the downloaded tokenizer.json is not GPT-2's")
    if tok.truncation is not None or tok.padding is not None:  # as in the shared copy: whole documents
        tok.no_truncation()
        tok.no_padding()
        tok.save(str(folder / "tokenizer.json"))


# -- object stores: S3 and GCS servers on 127.0.0.1 ------------------------------------------------


def _serve_store(kind: str, tmp_path_factory):
    from rigging.local_stores import LocalStoreUnavailableError, local_gcs_server, local_s3_server

    start = {"S3": local_s3_server, "GCS": local_gcs_server}[kind]
    log = tmp_path_factory.mktemp(f"{kind.lower()}-server") / "server.log"
    try:
        with start(str(log)) as store:
            yield store
    except LocalStoreUnavailableError as exc:
        pytest.skip(f"the {kind} test server is not available: {exc}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """moto's S3 server for the session (see rigging.local_stores); ``.env`` reaches it, ``.new_bucket`` makes one."""
    yield from _serve_store("S3", tmp_path_factory)


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """fake-gcs-server for the session (see rigging.local_stores)."""
    yield from _serve_store("GCS", tmp_path_factory)


def _fresh_bucket(store, monkeypatch, request) -> str:
    import fsspec

    for name, value in store.env.items():
        monkeypatch.setenv(name, value)
    fsspec.AbstractFileSystem.clear_instance_cache()  # clients made before these variables
    bucket = "t" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]
    return store.new_bucket(bucket) + "/marin"


@pytest.fixture
def s3_prefix(s3_server, monkeypatch, request) -> str:
    """A fresh, empty bucket as an ``s3://`` prefix, with this process set up to reach it."""
    return _fresh_bucket(s3_server, monkeypatch, request)


@pytest.fixture
def gcs_prefix(gcs_server, monkeypatch, request) -> str:
    """A fresh, empty bucket as a ``gs://`` prefix, with this process set up to reach it."""
    import fsspec
    import gcsfs.core
    from fsspec.registry import _registry

    # What the variables do for a new process, done for this one, where fsspec and gcsfs have read them already.
    monkeypatch.setitem(fsspec.config.conf, "gs", {"token": "anon"})
    for protocol in ("gs", "gcs"):
        monkeypatch.setitem(_registry, protocol, gcsfs.core.GCSFileSystem)
    return _fresh_bucket(gcs_server, monkeypatch, request)


# -- a single-node Slurm on this machine -------------------------------------------------------------


@pytest.fixture(scope="session")
def slurm_cluster():
    """A private Slurm (munged, slurmctld, slurmd) for the whole run, reached through ``SLURM_CONF``,
    started as ``marin slurm start`` starts one (fray.cluster.slurm_local.start_local_slurm); skips when
    Slurm is not installed or this is not root."""
    from fray.cluster.slurm_local import missing_slurm, start_local_slurm

    reason = missing_slurm()
    if reason is not None:
        pytest.skip(reason)
    # Directly under the system's temporary folder: the daemons' unix socket paths must stay short.
    cluster, _ = start_local_slurm(tempfile.mkdtemp(prefix="slurm-"))
    try:
        yield cluster
    finally:
        cluster.stop()


# -- a headless Chromium driven by selenium -------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium, driven through chromedriver by selenium (installed by
    scripts/install_browser.sh, which ``make test`` runs); skips where either is missing. Pages load
    within 30 s or fail."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver", reason="the browser tests need `pip install selenium` (test extra)")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        pytest.skip("no chromium/chromedriver on this machine: run scripts/install_browser.sh (make test does)")
    options = Options()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
