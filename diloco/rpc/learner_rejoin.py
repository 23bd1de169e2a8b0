"""A restarted learner process drives the crash-and-rejoin machine (recovery/crash_machine.py).

A process does not see its own crash: it is a restart when an earlier start of its learner is on
record (WORKDIR/starts.jsonl), and it learns the rest from its first Join's answer
(`link.Joined`):

- the crash: the steps the earlier process last reported and how long it had been silent, so
  its steps lost are those reported steps less the restored checkpoint's (a lower bound: it may
  have trained on after its last heartbeat), and it went down about that long ago (later by up
  to one long-poll's wait: a poll of the dead process still open counts as a sign of life);
- where it resumes: the other live learners' steps as they last reported them (as of a step of
  theirs; a heartbeat goes every `deploy.absent_after_s / 4` at most, so up to about twice that
  old). It moves its step counter before its first step to where the machine says, the leading
  peer's phase, or that peer's last merge point where lockstep rounds wait. A multi-process
  learner tells its followers (`SpmdLearner.resume_at`) and moves by whole sync intervals only
  (its processes agree at sync points), so its phase is then up to `sync_interval() - 1` steps
  short. A process that trained before it could join (the synchronizer away for `first_join_s`)
  keeps its counter;
- its rejoin is complete once it holds the versions the Join was answered with (the newest
  Join's, after a resync).

A restart with no earlier report at the synchronizer (it restarted too, or the earlier process
never reported) has an unknown crash time and steps lost (None); a restart after a stop
(SIGTERM, which saves at the step it stopped at) is recorded the same way, with none lost. The
records go to WORKDIR/rejoins.jsonl ({event: recover | rejoin, ...}, times in seconds since the
epoch) as they happen and to the summary (`rejoin`: the machine's crash record; None for a first
start, or a restart no Join answered).
"""

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from diloco import jsonl, paths
from diloco.outer import policies
from diloco.recovery import crash_machine
from diloco.runtime.link import Joined

LOG_FILE = "rejoins.jsonl"


class LearnerRejoin:
  """One learner process's side of the machine: its restart, its resume, its rejoin."""

  def __init__(
      self,
      learner,
      learners: int,
      lockstep: bool,
      restart: bool,
      restored_step: int | None,
      last_step: int,
      write: Callable[[dict], None],
      clock: Callable[[], float] = time.time,
  ):
    self.learner, self.restored_step, self.write, self.clock = learner, restored_step, write, clock
    self.last_step = last_step  # (it never resumes past the run's end)
    self.machine = crash_machine.CrashMachine(learners, lockstep)
    self.pending = restart  # a restart not yet answered by a Join
    self.started, self.step0 = clock(), learner.steps
    self.start_step = learner.steps  # where this process's training starts (after a resume)
    self.answered: tuple[int, ...] | None = None

  @property
  def record(self) -> dict[str, Any] | None:
    """This process's crash record (None: a first start)."""
    return self.machine.crashes[-1] if self.machine.crashes else None

  def joined(self, answer: Joined | None) -> None:
    """After each Join: a restart's first answer says where it resumes; every answer what it
    must hold to have rejoined."""
    if answer is None:  # (a link that cannot tell: a shard did not answer)
      return
    if self.pending:
      self.pending = False
      self._recover(answer)
    self.answered = answer.versions or None  # (none from an older synchronizer: unknown)
    self.received()

  def _recover(self, answer: Joined) -> None:
    m, lrn, now = self.learner.index, self.learner, self.clock()
    previous = answer.previous
    record = self.machine.crash(
        m, now - answer.silent_s if previous is not None else None, back=self.started
    )
    peers = answer.peers if lrn.steps == self.step0 else ()  # (it trained before it joined)
    at_crash = None  # (its last report may predate a save at a stop: never below the restored)
    if previous is not None:
      at_crash = max(previous.steps, self.restored_step or 0)
    steps = self.machine.recover(
        m, self.restored_step, lrn.steps, lrn.schedule.inner_steps, peers, at_crash
    )
    steps = max(lrn.steps, min(steps, self.last_step))
    if steps != lrn.steps:
      lrn.resume_at(steps)  # (a multi-process learner's: at a sync point, see the module doc)
      self.start_step = lrn.steps
    record.update(resumes_at_step=lrn.steps, peers=[dataclasses.asdict(p) for p in peers])
    self.write({"event": "recover", **record})

  def received(self) -> None:
    """After fragments were applied: whether the rejoin is now complete."""
    m = self.learner.index
    if not self.machine.is_rejoining(m):
      return
    if crash_machine.rejoin_complete(self.learner.versions, self.answered):
      now = self.clock()
      record = self.machine.rejoined(m, now, to_rejoin_s=now - self.started)
      self.write({"event": "rejoin", **record})


def for_process(config, learner, workdir: str, restored_step: int | None) -> LearnerRejoin:
  """Learner process `learner`'s, before its start is written (an earlier one: a restart)."""
  starts = paths.join(workdir, "starts.jsonl")

  def write(record: dict) -> None:
    with jsonl.open_append(paths.join(workdir, LOG_FILE)) as f:
      f.write(json.dumps(record) + "\n")

  o = config.outer
  return LearnerRejoin(
      learner,
      o.learners,
      lockstep=bool(o.blocking and policies.quorum_of(o).of_members),
      restart=paths.exists(starts) and bool(jsonl.read(starts)),
      restored_step=restored_step,
      last_step=config.steps,
      write=write,
  )
