"""The hook points at which the virtual runtime (virtual.py) lets a fault component act.

`Faults` names them, one method each, called at one place of the runtime's loop, and is the
runtime's default: every step and message goes through unchanged. A fault component
(virtual_chaos.Chaos) overrides what it needs. It holds the runtime (`bind`) to push events, hand
events to the synchronizer and decide for learners, and the runtime hands it back the events it
pushed: those of kind k to its `on_k`.
"""

from typing import Any

from diloco.outer import protocol

Message = protocol.Upload | protocol.Join | protocol.Leave  # what a learner sends up


class Faults:
  """The hook points, each a no-op or a pass-through here: a run without faults."""

  runtime: Any

  def bind(self, runtime: Any) -> None:
    """Takes the runtime it acts in (its constructor calls this once)."""
    self.runtime = runtime

  def start(self) -> None:
    """The run starts, before the learners' first steps are scheduled."""

  def goes_on(self) -> bool:
    """Whether the run goes on though no event but background ones is due."""
    return False

  def duration(self, m: int, seconds: float) -> float:
    """How long the step learner m starts now lasts, `seconds` on a healthy machine."""
    return seconds

  def stepped(self, m: int, seconds: float, saved: bool) -> None:
    """Learner m finished a step `seconds` long, and saved its checkpoint after it or not."""

  def send_up(self, m: int, message: Message, delay: float) -> tuple[float, Message] | None:
    """When learner m's message sent now reaches the synchronizer (`delay` on a healthy
    link), and as what; None: it is lost."""
    return self.runtime.now + delay, message

  def send_down(self, send: protocol.Send, delay: float) -> tuple[float, protocol.Send] | None:
    """When a Send put on the link now reaches its learner, and as what; None: it is lost."""
    return self.runtime.now + delay, send

  def arrived(self, send: protocol.Send, decisions: list) -> None:
    """A Send reached its learner, whose machine decided `decisions` about it."""

  def handle(self, event: protocol.Event) -> None:
    """The synchronizer handles an arrival or a tick, and its actions are carried out."""
    self.runtime.handle(event)

  def checkpoint(self, action: protocol.Checkpoint) -> bool:
    """Whether a fault takes the synchronizer's checkpoint action over (nothing saved then)."""
    return False

  def rejoins(self, m: int, why: str) -> bool:
    """Whether learner m sends the Join its machine decided on (`why`: `Rejoin.why`)."""
    return True

  def rejoined(self, m: int) -> bool:
    """Learner m's rejoin is complete; whether it starts training now."""
    return True

  def learner_up(self, m: int) -> bool:
    """Whether learner m is up: one that crashed hears of no refusal."""
    return True

  def finish(self) -> None:
    """The run is over (before the runtime counts the last idle time and saves)."""
