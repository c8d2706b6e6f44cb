"""A ``jax.profiler`` trace of chosen training steps, in ``<run>/profile/``.

``TrainerConfig(profile=ProfileConfig(start_step, num_steps))`` starts the trace just before step
``start_step`` is dispatched and stops it once step ``start_step + num_steps - 1`` has finished on
the device (or when the loop ends first); each traced step is annotated for XProf's step view. The
folder then holds, per host, ``plugins/profile/<time>/<host>.xplane.pb`` (TensorBoard's profile
plugin and XProf: ``--logdir <run>/profile``) and ``<host>.trace.json.gz`` with
``perfetto_trace.json.gz`` (chrome://tracing, https://ui.perfetto.dev).

``jax.profiler`` writes local files only: for a run folder that is a URL (``s3://``,
``memory://``, ...) the trace is written to a local temporary folder and uploaded through
``rigging.filesystem`` when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import jax

from levanter.trainer.config import ProfileConfig
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)


class StepProfiler:
    """Traces the steps ``config`` asks for (none when ``config`` is None) into ``<output_dir>/profile``."""

    def __init__(self, config: ProfileConfig | None, output_dir: str):
        self.config = config
        self.url = fsx.join(output_dir, "profile")
        self._local_dir: str | None = None  # where jax.profiler writes while a trace runs

    @property
    def active(self) -> bool:
        return self._local_dir is not None

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Around the dispatch of step ``step`` (numbered as in metrics.jsonl)."""
        if self.config is not None and step == self.config.start_step and not self.active:
            self._start()
        if not self.active:
            yield
            return
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            yield

    def step_dispatched(self, step: int, state: Any) -> None:
        """After step ``step`` was dispatched: at the window's last step, wait for it and stop."""
        if self.active and step >= self.config.last_step:
            jax.block_until_ready(state)
            self.stop()

    def stop(self) -> None:
        """Stop a running trace and put its files in ``<run>/profile`` (nothing when none runs)."""
        if not self.active:
            return
        local = self._local_dir
        self._local_dir = None
        jax.profiler.stop_trace()
        if local != self.url:
            try:
                fsx.upload_files(local, fsx.find_files(local), self.url)
            finally:
                shutil.rmtree(local, ignore_errors=True)
        logger.info("Profile written to %s (open it with TensorBoard/XProf --logdir, or Perfetto).", self.url)

    def _start(self) -> None:
        local = self.url if fsx.is_local(self.url) else tempfile.mkdtemp(prefix="levanter-profile-")
        logger.info("Profiling steps %d-%d into %s.", self.config.start_step, self.config.last_step, self.url)
        jax.profiler.start_trace(local, create_perfetto_trace=True)
        self._local_dir = local
