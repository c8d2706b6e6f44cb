"""What a benchmark's stages cost in memory and scratch space, sampled from ``/proc`` and the disk.

A thread samples, every ``interval`` seconds, every process below this one: the resident memory
(``VmRSS``) of each *worker* (a local pool's spawn workers, Ray's worker processes, or any process
below a peer program the benchmark started) and of this process (the driver), and the bytes under
the scratch folders the caller names (shuffle files, a dedup step's ``.work/``). Each sample is
charged to the stage the caller says is running (:meth:`TreeSampler.stage`), so per stage it gives:

* ``worker_peak_rss``: the largest resident size any one worker reached while the stage ran;
* ``driver_peak_rss``: the same for this process;
* ``worker_cpu_seconds`` / ``driver_cpu_seconds``: CPU time (user + system) the workers and this
  process spent in the stage. On a shared machine wall time depends on everyone's load, CPU time
  much less: documents per CPU-second is the figure that compares across runs;
* ``scratch_peak``: the most scratch bytes on disk at once;
* ``scratch_written``: the sum over scratch files of the largest size each was seen at (files
  live until their pipeline ends, so sampling sees nearly all of them; one created and removed
  between two samples is missed, which makes this a lower bound).

Sampling is cheap (a few ``/proc`` reads and a directory walk); Linux only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rigging.filesystem import is_temporary_name

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class StageCost:
    worker_peak_rss: int = 0
    driver_peak_rss: int = 0
    scratch_peak: int = 0
    scratch_files: dict[str, int] = field(default_factory=dict)
    workers_seen: set[int] = field(default_factory=set)
    samples: int = 0
    worker_cpu_first: dict[int, float] = field(default_factory=dict)
    worker_cpu_last: dict[int, float] = field(default_factory=dict)
    driver_cpu_first: float | None = None
    driver_cpu_last: float = 0.0

    @property
    def scratch_written(self) -> int:
        return sum(self.scratch_files.values())

    @property
    def worker_cpu_seconds(self) -> float:
        return sum(last - self.worker_cpu_first[pid] for pid, last in self.worker_cpu_last.items())

    @property
    def driver_cpu_seconds(self) -> float:
        return self.driver_cpu_last - (self.driver_cpu_first or 0.0)


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(text[text.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry))
    return children


def _descendants(root: int, children: dict[int, list[int]]) -> list[int]:
    found, stack = [], list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def tree_pids(root: int) -> list[int]:
    """``root`` and its live descendants."""
    return [root, *_descendants(root, _children())]


def _cpu(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (``None`` once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds so far of ``root``'s live descendants (e.g. a warm process pool)."""
    return sum(c for c in map(_cpu, _descendants(root, _children())) if c is not None)


def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_worker(cmdline: str) -> bool:
    """A local pool's spawn worker, or a Ray worker process (its title starts with ``ray::``)."""
    if "multiprocessing.resource_tracker" in cmdline or "multiprocessing.forkserver" in cmdline:
        return False
    return "spawn_main" in cmdline or cmdline.startswith("ray::") or "default_worker.py" in cmdline


def _scratch_files(roots: Iterable[Path]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                try:
                    sizes[path] = os.stat(path).st_size
                except OSError:
                    pass
    return sizes


class TreeSampler:
    """Samples this process's tree; use as a context manager, with :meth:`stage` around each stage.

    ``scratch_roots()`` returns the folders whose bytes count as scratch at that moment.
    ``peers``: pids whose processes below count as workers (a peer program's pool).
    """

    def __init__(self, scratch_roots: Callable[[], Iterable[Path]], interval: float = 0.25):
        self.scratch_roots = scratch_roots
        self.interval = interval
        self.costs: dict[str, StageCost] = {}
        self.peers: set[int] = set()
        self._label: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    @contextmanager
    def stage(self, label: str):
        self.costs.setdefault(label, StageCost())
        self._label = label
        try:
            self.sample()
            yield self.costs[label]
        finally:
            self.sample()
            self._label = None

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        label = self._label
        if label is None:
            return
        cost = self.costs[label]
        me = os.getpid()
        children = _children()
        peer_tree = {pid for peer in self.peers for pid in _descendants(peer, children)}
        for pid in _descendants(me, children):
            if pid in peer_tree or is_worker(_cmdline(pid)):
                cost.worker_peak_rss = max(cost.worker_peak_rss, _rss(pid))
                cost.workers_seen.add(pid)
                cpu = _cpu(pid)
                if cpu is not None:
                    # A worker there at the stage's first sample counts from then; one started
                    # later, from its start.
                    cost.worker_cpu_first.setdefault(pid, cpu if cost.samples == 0 else 0.0)
                    cost.worker_cpu_last[pid] = cpu
        cost.driver_peak_rss = max(cost.driver_peak_rss, _rss(me))
        driver_cpu = _cpu(me) or 0.0
        if cost.driver_cpu_first is None:
            cost.driver_cpu_first = driver_cpu
        cost.driver_cpu_last = driver_cpu
        files = _scratch_files(self.scratch_roots())
        cost.scratch_peak = max(cost.scratch_peak, sum(files.values()))
        for path, size in files.items():
            # A temporary sibling becomes its final name once written: count the final file only.
            if not is_temporary_name(path) and size > cost.scratch_files.get(path, -1):
                cost.scratch_files[path] = size
        cost.samples += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a process or file that vanished mid-sample: the next sample sees the rest
                continue
