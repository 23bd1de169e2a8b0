"""The learner machine's vocabulary (learner_machine.py): what it reads of its learner
(`Holdings`), the decisions it returns, and the two tests a merged fragment meets on arrival
(`verdict`, `regressed`)."""

import dataclasses
from typing import Protocol

from diloco.outer import protocol
from diloco.outer.outcomes import Code


class Holdings(Protocol):
  """What the machine reads of its learner (outer.learner.Learner has all of it)."""

  versions: list[int]
  generations: list[int]
  c_steps: list[int]
  steps: int

  def heard_generation(self, p: int) -> int:
    """The newest generation heard from the synchronizer (shard) that owns fragment p."""


# ---- decisions (actions out) ----


@dataclasses.dataclass(frozen=True)
class Upload:
  """Upload fragment `fragment` now, against the version held."""

  fragment: int


@dataclasses.dataclass(frozen=True)
class Apply:
  """Apply `send`. With `rebase`, the learner's own earlier upload on the version it holds was
  merged (a copy sent again was refused as a duplicate) and the progress it made after that
  upload is kept on top of the new version (`Learner.receive`), to be sent again."""

  send: protocol.Send
  rebase: bool = False


@dataclasses.dataclass(frozen=True)
class Drop:
  send: protocol.Send
  code: Code


@dataclasses.dataclass(frozen=True)
class Rejoin:
  """Join again with the versions held. `why`: resync (a merged fragment was lost or corrupt),
  refused (an upload's base was refused: the synchronizer still holds what else is pending),
  restored, sync_restart."""

  why: str


@dataclasses.dataclass(frozen=True)
class Resend:
  """Upload `fragment` again soon, computed afresh, if the version held is still `base`; with
  `as_sent`, the unanswered upload itself where the runtime still has it (`joined_unseen`)."""

  fragment: int
  base: tuple[int, int]  # (generation, version) the refused upload was built on
  as_sent: bool = False


@dataclasses.dataclass(frozen=True)
class Rejoined:
  """A restored learner holds every fragment its Join was answered with: it trains again."""


Decision = Upload | Apply | Drop | Rejoin | Resend | Rejoined


def regressed(send: protocol.Send, held: Holdings) -> bool:
  """Whether `send` is a restarted synchronizer's fragment older than the one held: merges the
  learner holds were lost with the restart (saved every N > 1 merges). The learner then keeps
  its parameters and takes the send only as its new base, so its next upload carries what the
  restored state lacks, the lost merges and its own progress (`Learner.receive`)."""
  p = send.fragment
  return (
      send.update is None
      and send.generation > held.generations[p]
      and 0 <= send.version < held.versions[p]
  )


def verdict(send: protocol.Send, held: Holdings, num_fragments: int) -> Code | None:
  """Why `send` cannot be applied by a learner holding `held` (CHECKSUM, OLD_GENERATION,
  DUPLICATE or GAP), or None."""
  p = send.fragment
  if not 0 <= p < num_fragments:
    raise ValueError(f"got fragment {p} of {num_fragments}")
  if not send.checksum_ok():
    return Code.CHECKSUM
  if send.generation < held.heard_generation(p):
    return Code.OLD_GENERATION
  have = (held.generations[p], held.versions[p])
  if send.update is not None:
    if (send.base_generation, send.version - 1) == have:
      return None
    return Code.DUPLICATE if (send.generation, send.version) <= have else Code.GAP
  return None if (send.generation, send.version) > have else Code.DUPLICATE
