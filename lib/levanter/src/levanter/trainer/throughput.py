"""Training throughput: tokens per second, seconds per step and model-FLOPs utilisation (MFU).

Two clocks, for two questions. Each step's rate, written to ``metrics.jsonl``, runs from the
previous read of a step's scalars to this one; the loop restarts it after an evaluation or a save,
which are not training. The console's window runs from one log line to the next and averages over
its steps; it leaves out the run's first step, whose time is mostly compilation, so that the rate
and the ETA printed after it describe training (the first step's own log line, if it has one, still
includes it). Times are passed in, read from one monotonic clock by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from levanter.trainer.hardware import model_flops_utilization


@dataclass(frozen=True)
class StepThroughput:
    tokens: int  # trained on since step 0, counting the steps before a resume
    tokens_per_second: float  # NaN when no time passed
    mfu: float | None  # None where the peak or the model's FLOPs are unknown (any CPU)
    wall_time: float  # seconds since the loop started


@dataclass(frozen=True)
class WindowThroughput:
    tokens_per_second: float
    seconds_per_step: float


class ThroughputMeter:
    """Counts the tokens of each step read and the time they took."""

    def __init__(self, started: float, *, num_devices: int, peak_flops_per_device: float | None):
        self.started = started
        self.num_devices = num_devices
        self.peak_flops_per_device = peak_flops_per_device
        self.tokens_per_step: int | None = None  # known once the first batch gives the sequence length
        self.flops_per_token: float | None = None
        self._tokens = 0
        self._clock = started  # where the next step's time starts
        self._window_start, self._window_steps = started, 0
        self._steps_read = 0
        self._first_step_end = started
        self._last_read = started

    def set_batch(self, tokens_per_step: int, *, completed_steps: int, flops_per_token: float | None) -> None:
        """Tokens in each step's batch; ``completed_steps`` were trained before this loop (a resume)."""
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self._tokens = completed_steps * tokens_per_step

    def step(self, now: float) -> StepThroughput:
        """A step's scalars were read at ``now``."""
        if self._steps_read == 1:
            # The previous step was the first, compilation included: the window starts after it.
            self._window_start, self._window_steps = self._first_step_end, 0
        elapsed = now - self._clock
        self._clock = self._last_read = now
        self._tokens += self.tokens_per_step
        self._window_steps += 1
        self._steps_read += 1
        if self._steps_read == 1:
            self._first_step_end = now
        rate = self.tokens_per_step / elapsed if elapsed > 0 else float("nan")
        mfu = model_flops_utilization(self.flops_per_token, rate, self.num_devices, self.peak_flops_per_device)
        return StepThroughput(tokens=self._tokens, tokens_per_second=rate, mfu=mfu, wall_time=now - self.started)

    def restart_clock(self, now: float) -> None:
        """Time up to ``now`` (an evaluation, a save) does not count towards the next step."""
        self._clock = now

    def window(self) -> WindowThroughput:
        """The steps read since the previous window, up to the latest read; the next window starts there."""
        span = self._last_read - self._window_start
        rate = self._window_steps * self.tokens_per_step / span if span > 0 else float("nan")
        seconds_per_step = span / max(self._window_steps, 1)
        self._window_start, self._window_steps = self._last_read, 0
        return WindowThroughput(tokens_per_second=rate, seconds_per_step=seconds_per_step)
