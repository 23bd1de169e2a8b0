"""A restart loop with backoff: runs a command again when it exits abnormally.

A run that exits 0 is finished and ends the loop; any other exit (an error, a signal) is restarted
after a delay that starts at `backoff_s`, doubles with every consecutive failure up to
`max_backoff_s`, and starts over after a run that lasted `reset_after_s`. After `max_restarts`
restarts (-1: no limit) the loop gives up with the last exit code. SIGTERM or SIGINT to the
supervisor goes to the child and ends the loop once the child exits, with the child's code.
Every start and exit is appended to a JSON-lines log.

Exit code 75 (EX_TEMPFAIL, EXIT_PREEMPTED of diloco/runtime/preemption.py) means "stopped early,
restart me": experiments.train exits with it when SIGTERM or SIGINT stopped the run at a step
boundary with a checkpoint, and the chaos crash fault of a learner process exits with it too. It
is restarted like any other exit and counts toward `max_restarts` (a crash fault shares the code,
and the limit is what keeps a loop from going on for ever). A preemption notice that reaches the
supervisor itself ends the loop with 75 once the child has saved, for whoever restarts the
supervisor (a recreated VM, Ray, XPK) to run the same command again: it resumes.
"""

import dataclasses
import json
import os
import signal
import subprocess
import threading
import time

from diloco import jsonl


@dataclasses.dataclass(frozen=True)
class Policy:
  max_restarts: int = 20  # -1: restart for ever
  backoff_s: float = 5.0
  max_backoff_s: float = 300.0
  reset_after_s: float = 600.0  # a run this long was healthy: the next delay is backoff_s again

  def __post_init__(self):
    if self.max_restarts < -1:
      raise ValueError(f"max_restarts must be >= -1, got {self.max_restarts}")
    if not 0 <= self.backoff_s <= self.max_backoff_s:
      raise ValueError(
          f"need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}"
      )


class Supervisor:
  """Runs `argv` under `policy`; `run()` returns the exit code it ends with."""

  def __init__(self, argv: list[str], policy: Policy, log_path: str = ""):
    if not argv:
      raise ValueError("nothing to supervise: the command is empty")
    self.argv, self.policy, self.log_path = list(argv), policy, log_path
    self.restarts = 0
    self.child: subprocess.Popen | None = None
    self._stop = threading.Event()

  def stop(self, signum: int = signal.SIGTERM) -> None:
    """Ends the loop: the child gets `signum` and is not restarted."""
    self._stop.set()
    if self.child is not None and self.child.poll() is None:
      self.child.send_signal(signum)

  def _log(self, **record) -> None:
    if not self.log_path:
      return
    os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
    with jsonl.open_append(self.log_path) as f:
      f.write(json.dumps({"time": time.time(), **record}) + "\n")

  def run(self) -> int:
    delay = self.policy.backoff_s
    while True:
      started = time.monotonic()
      self.child = subprocess.Popen(self.argv)
      self._log(event="start", pid=self.child.pid, restarts=self.restarts)
      rc = self.child.wait()
      lasted = time.monotonic() - started
      self._log(event="exit", pid=self.child.pid, rc=rc, lasted_s=round(lasted, 3))
      if rc == 0 or self._stop.is_set():
        return rc
      limit = self.policy.max_restarts
      if 0 <= limit <= self.restarts:
        self._log(event="gave_up", rc=rc, restarts=self.restarts)
        return rc
      if lasted >= self.policy.reset_after_s:
        delay = self.policy.backoff_s
      if self._stop.wait(delay):
        return rc
      delay = min(2 * delay, self.policy.max_backoff_s)
      self.restarts += 1


def main(argv: list[str], policy: Policy, log_path: str) -> int:
  """Supervises `argv` in this process, with SIGTERM and SIGINT passed to the child."""
  sup = Supervisor(argv, policy, log_path)
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda s, _: sup.stop(s))
  rc = sup.run()
  return rc if rc >= 0 else 128 - rc  # a child killed by signal N: the shell's 128+N
