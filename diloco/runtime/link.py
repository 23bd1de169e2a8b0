"""A learner's connection to the synchronizer (in-process, faulty or gRPC) and its two errors.

A link raises `Refused` when the synchronizer host turns a call down (the call never reached the
state machine, so its state is unchanged) and `Unreachable` when the host could not be reached (the
learner keeps training and retries).
"""

from typing import Protocol

from diloco.outer import outcomes, protocol


class Refused(Exception):
  """A call the host turns down, for `code` (an `outcomes.Code`)."""

  def __init__(self, code: outcomes.Code, message: str):
    super().__init__(message)
    self.code = code


class Unreachable(Exception):
  """The synchronizer could not be reached (a learner keeps training and retries)."""


class Link(Protocol):
  """A learner's connection to the synchronizer (in-process or gRPC)."""

  def join(self, versions: tuple[int, ...], generations: tuple[int, ...]) -> None:
    ...

  def progress(self, finished: bool) -> bool:
    ...

  def upload(self, up: protocol.Upload) -> None:
    ...

  def poll(self, wait_s: float) -> list[protocol.Send]:
    ...
