"""Upstream's training loop timed from outside it: one mark before the loop and one after each step it yields.

Upstream's ``Trainer`` runs hooks only from its third step (``info.step > 1``, steps counted from 0), so a
clock read in a hook starts two steps late, and dividing every timed step's tokens by the intervals
between such marks overstates tokens/s by steps/(steps - 2). Here nothing depends on the hooks: the
marks are taken around ``Trainer.training_steps``, which ends each step with ``loss.item()`` (the step
has finished on the device), and every step must be seen, in order, or the run is refused.

Imports nothing but the standard library, so both upstream sides (the CPU and the TPU bench) share it.
"""

import time


def timed_steps(steps, total: int) -> tuple[list[float], object]:
    """Run the iterator ``steps`` of ``Trainer.training_steps`` to its end.

    Returns ``total + 1`` clock marks (``marks[i + 1] - marks[i]`` is step ``i``, the first including
    its compilation) and the last ``StepInfo``.
    """
    marks, seen, info = [time.perf_counter()], [], None
    for info in steps:
        marks.append(time.perf_counter())
        seen.append(int(info.step))
    if seen != list(range(total)):
        raise SystemExit(f"expected upstream's trainer to run steps 0..{total - 1} once each, in order; it ran {seen}")
    return marks, info


def steady_tokens_per_second(marks: list[float], warmup_steps: int, tokens_per_step: int) -> float:
    """Tokens/s over the steps after the first ``warmup_steps``, each step timed."""
    timed = len(marks) - 1 - warmup_steps
    return timed * tokens_per_step / (marks[-1] - marks[warmup_steps])
