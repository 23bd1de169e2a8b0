"""A learner's connection to the synchronizer (in-process, faulty or gRPC) and its two errors.

A link raises `Refused` when the synchronizer host turns a call down (the call never reached the
state machine, so its state is unchanged) and `Unreachable` when the host could not be reached (the
learner keeps training and retries). A join returns what its answer says besides the sends that
follow (`Joined`), where the link can tell.
"""

import dataclasses
from typing import Protocol

from diloco.outer import outcomes, protocol
from diloco.recovery.crash_machine import Peer


class Refused(Exception):
  """A call the host turns down, for `code` (an `outcomes.Code`)."""

  def __init__(self, code: outcomes.Code, message: str):
    super().__init__(message)
    self.code = code


class Unreachable(Exception):
  """The synchronizer could not be reached (a learner keeps training and retries)."""


@dataclasses.dataclass(frozen=True)
class Joined:
  """A Join's answer: the synchronizer's versions then (the learner has rejoined once it holds
  them), the other live learners as they last reported, and this learner id's last report from
  an earlier process with how long that one had been silent (None: no earlier process), and
  the synchronizer's generation (None where the link cannot tell: several shards). A send of
  an older generation that arrives after it (buffered before a synchronizer restart) is stale:
  the answer was computed from the versions the Join reported (`LearnerMachine.joined`)."""

  versions: tuple[int, ...]
  peers: tuple[Peer, ...] = ()
  previous: Peer | None = None
  silent_s: float = 0.0
  generation: int | None = None


class Link(Protocol):
  """A learner's connection to the synchronizer (in-process or gRPC)."""

  def join(self, versions: tuple[int, ...], generations: tuple[int, ...]) -> Joined | None:
    ...

  def progress(self, finished: bool) -> bool:
    ...

  def upload(self, up: protocol.Upload) -> None:
    ...

  def poll(self, wait_s: float) -> list[protocol.Send]:
    ...
