"""The training clock: wall time with the pauses (evaluation, the stage-1 boundary check) left out."""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator


class TrainClock:
  """Training seconds of a run and of the runs it resumes: one clock, stopped only by :meth:`paused`.

  Every rate the loop logs is measured on it (a window's tokens/s is the difference of two readings), so a job
  that runs inside ``paused()`` is left out of all of them at once and none can forget to.
  """

  def __init__(self, seconds_before: float = 0.0, now: Callable[[], float] = time.time):
    """``seconds_before``: the training seconds of the runs this one resumes; ``now``: the wall clock (tests)."""
    self._now = now
    self._counted = seconds_before  # training seconds up to the start of the running interval
    self.started = self._running_since = now()

  def seconds(self) -> float:
    """Training seconds so far (while paused: up to the pause)."""
    if self._running_since is None:
      return self._counted
    return self._counted + self._now() - self._running_since

  def wall_seconds(self) -> float:
    """Wall seconds since this run's clock was made, pauses included."""
    return self._now() - self.started

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """Stops the clock for the body (not reentrant: a pause inside a pause is a bug in the caller)."""
    assert self._running_since is not None, "the training clock is paused already"
    self._counted += self._now() - self._running_since
    self._running_since = None
    try:
      yield
    finally:
      self._running_since = self._now()
