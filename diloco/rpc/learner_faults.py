"""The `chaos` schedule's faults of one learner, applied in its own gRPC learner process.

They act as in the threads runtime (diloco/runtime/threads_chaos.py, faulty_link.py), on the
schedule's clock: schedule time 0 is this learner's first step (after compilation), kept in
WORKDIR/chaos_clock.json so that a restarted process keeps the same clock; a fault at t acts
`deploy.chaos_time_scale · t` wall seconds after it.

- straggle: the learner runs at 1/factor of its own speed: each step lasts `factor` times its
  mean step time before the fault (an exponential average of the time between steps, over about
  the last 20; the process sleeps, or with `deploy.straggle_busy` spins on one core, to the end of
  that). A learner that straggles from its first steps first measures that mean, unstretched,
  over MEASURE_STEPS steps after WARMUP_STEPS. Sleeping is a slow accelerator seen from outside;
  on a machine whose learners share too few CPU cores it also frees a core for the others, which
  spinning does not;
- delay, partition (drop or hold), corrupt and poison: on the learner's link to the synchronizer,
  exactly as `faulty_link.FaultyLink` does them;
- crash: at its time the process exits at once with code CRASH_EXIT (75): its memory and the step
  in progress are lost, as with a killed process. A supervisor (scripts/launch_local.py, or
  `local.LocalCluster.wait(restart_crashed=True)`) starts it again; a process that starts inside
  a crash's window waits for its end, then resumes from its newest checkpoint and rejoins.

sync_crash faults are not the learner's: they are refused here (the synchronizer process is
killed and restarted from outside, see scripts/chaos_local.py). Every fault this process applies
is appended to WORKDIR/chaos.jsonl, and the first unstretched step after a straggle as
"straggle_end".
"""

import json
import os
import time
from collections.abc import Callable


from diloco import jsonl, paths
from diloco.chaos import schedule as chaos
from diloco.runtime import link as link_lib
from diloco.runtime.faulty_link import FaultClock, FaultyLink, Shared

CRASH_EXIT = 75  # EX_TEMPFAIL: "try again", what a supervisor restarts
CLOCK_FILE = "chaos_clock.json"
LOG_FILE = "chaos.jsonl"
WARMUP_STEPS = 3  # steps between which a learner's mean step time is not yet measured
MEAN_WEIGHT = 0.05  # of the newest step in the mean step time (a memory of about 20 steps)
MEASURE_STEPS = 10  # steps in the mean before a straggle can stretch one


class ProcessLink(FaultyLink):
  """`FaultyLink` over one gRPC link (no in-process host to look at, none that restarts here)."""

  def __init__(self, inner, learner: int, clock: FaultClock, shared: Shared):
    super().__init__(None, learner, clock, shared, make_inner=None)
    self.inner = inner

  def _link(self):
    return self.inner

  def _joined(self, link) -> None:
    pass

  def _gone(self, link) -> bool:
    return False

  def take_refused(self) -> list[int]:
    """What the inner link hands back as unanswered (a sharded link's down shards)."""
    take = getattr(self.inner, "take_refused", None)
    return take() if take is not None else []

  def close(self) -> None:
    super().close()
    self.inner.close()


class ProcessFaults:
  """Learner m's faults in this process (see the module doc)."""

  def __init__(
      self,
      faults: list[chaos.Fault],
      m: int,
      workdir: str,
      scale: float = 1.0,
      busy: bool = False,
      clock: Callable[[], float] = time.time,
      monotonic: Callable[[], float] = time.monotonic,
      sleep: Callable[[float], None] = time.sleep,
  ):
    """`clock` (the schedule's, shared by the processes of a run through CLOCK_FILE),
    `monotonic` (step gaps and stretches) and `sleep`: the real ones, or a test's fake time."""
    bad = [f.describe() for f in faults if f.kind == "sync_crash"]
    if bad:
      raise ValueError(
          f"a learner process cannot apply synchronizer faults ({'; '.join(bad)}): kill and "
          "restart the synchronizer process instead (scripts/chaos_local.py)"
      )
    self.m, self.workdir, self.busy = m, workdir, busy
    self._monotonic, self._sleep = monotonic, sleep
    mine = [f for f in faults if f.learner == m]
    self.clock = FaultClock(mine, scale, clock=clock)
    self.shared = Shared(1, seed=m)
    path = paths.join(workdir, CLOCK_FILE)
    if paths.exists(path):
      self.clock.t0 = float(json.loads(paths.read_text(path))["t0"])
    self._born = self.clock.now()  # -inf before the first step of the first process
    self._last: float | None = None  # when the previous step (and its stretch) ended
    self._mean: float | None = None  # mean time between steps, not straggling
    self._steps_seen = 0
    self._measured = 0  # steps in the mean
    self._straggling = False

  @property
  def active(self) -> bool:
    return bool(self.clock.faults)

  def _log(self, record: dict) -> None:
    with jsonl.open_append(paths.join(self.workdir, LOG_FILE)) as f:
      f.write(json.dumps({"time": self.clock.now(), "pid": os.getpid(), **record}) + "\n")

  def wait_if_down(self) -> float:
    """At process start: sleeps to the end of a crash window it started in; returns the wait."""
    until = self.clock.layer.down_until(self.m, self.clock.now())
    if until is None:
      return 0.0
    wait = self.clock.wall(until) - self.clock.clock()
    self._log({"event": "down", "until": until, "wait_s": wait})
    self._sleep(max(wait, 0.0))
    self._born = self.clock.now()
    return wait

  def link(self, inner) -> link_lib.Link:
    """The learner's link with its delay, partition, corrupt and poison faults."""
    return ProcessLink(inner, self.m, self.clock, self.shared) if self.active else inner

  def after_step(self, step: int) -> None:
    """Called after every step: starts the clock at the first, stretches straggling steps,
    exits at a crash."""
    now = self._monotonic()
    if self.clock.t0 is None:
      self.clock.start()
      self._born = 0.0
      paths.write_text(paths.join(self.workdir, CLOCK_FILE), json.dumps({"t0": self.clock.t0}))
    crash = self.clock.layer.crash(self.m, self.clock.now(), since=self._born)
    if crash is not None:
      self._log({"event": "crash", "step": step, "fault": crash.describe()})
      os._exit(CRASH_EXIT)
    factor = self.clock.layer.stretch(self.m, self.clock.now())
    if factor > 1 and not self._straggling:
      self._log({"event": "straggle", "step": step, "factor": factor, "busy": self.busy})
    elif factor == 1 and self._straggling:
      self._log({"event": "straggle_end", "step": step})
    if self._last is not None and factor > 1 and self._measured >= MEASURE_STEPS:
      self._until(self._last + factor * self._mean)
    elif self._last is not None:  # not straggling, or its speed not measured yet
      self._steps_seen += 1
      if self._steps_seen > WARMUP_STEPS:  # compilation is not its speed
        self._measured += 1
        gap = now - self._last
        weight = max(MEAN_WEIGHT, 1.0 / self._measured)  # the plain mean of the first steps
        self._mean = gap if self._mean is None else self._mean + weight * (gap - self._mean)
    self._straggling = factor > 1
    self._last = self._monotonic()

  def _until(self, end: float) -> None:
    """Sleeps (or spins) to monotonic time `end`."""
    if not self.busy:
      self._sleep(max(end - self._monotonic(), 0.0))
      return
    while self._monotonic() < end:
      pass
