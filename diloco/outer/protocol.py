"""Messages between learners, runtimes and the synchronizer: events in, actions out.

Fragments travel as path-keyed dicts ('blocks/3/attn/qkv' -> array). Learners upload their outer
gradient Δ = Θ_base − θ_local, encoded by a codec; the synchronizer sends back either the encoded
update that turns the learner's version v−1 into v, or the full fp32 fragment when the learner holds
an older version.

Every Upload and Send carries a CRC-32 checksum of its header numbers and payload, computed when
the message is built (by the sender) unless given, and verified by the receiver (`checksum_ok`).
Synchronizer generations: a synchronizer that restarts from a checkpoint starts a new generation;
messages carry the generation of the versions they hold or send, so that versions a restarted
synchronizer no longer knows (merged after its checkpoint) are told apart from those it does.
"""

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from diloco.outer import integrity, outcomes
from diloco.outer.codecs import compression, uplink

Flat = Mapping[str, np.ndarray]
EncodedFlat = Mapping[str, compression.Encoded]


# ---- events: what happened (the synchronizer consumes these) ----


@dataclasses.dataclass(frozen=True)
class Join:
  """Learner joins (or rejoins) holding these fragment versions."""

  learner: int
  time: float
  versions: tuple[int, ...]  # -1: holds nothing of that fragment yet
  generations: tuple[int, ...] = ()  # synchronizer generation of each version; () = current


@dataclasses.dataclass(frozen=True)
class Leave:
  learner: int
  time: float


@dataclasses.dataclass(frozen=True)
class Upload:
  """Learner's outer gradient of one fragment, with its progress since it last received it."""

  learner: int
  fragment: int
  base_version: int
  delta: EncodedFlat
  steps: int
  tokens: int
  time: float  # arrival at the synchronizer
  sent_time: float  # departure from the learner
  step_time: float  # the learner's recent seconds per inner step
  base_generation: int = 0  # synchronizer generation of base_version
  checksum: int | None = None  # None: computed now, as the sender does
  # The learner's inner steps when it sent this (-1: not said): how far a process trained, for
  # one killed before its next heartbeat (the status board's trained steps).
  step: int = -1

  def __post_init__(self):
    if self.checksum is None:
      object.__setattr__(self, "checksum", self.expected_checksum())

  def expected_checksum(self) -> int:
    """The checksum of this message's header numbers and payload as they are now."""
    return integrity.with_header(
        (self.fragment, self.base_generation, self.base_version, self.steps, self.tokens),
        integrity.tree_crc(self.delta),
    )

  def checksum_ok(self) -> bool:
    return self.checksum == self.expected_checksum()

  @property
  def key(self) -> tuple[int, int, int]:
    """(base_generation, base_version, steps): which of a learner's uploads of a fragment this
    is (two with one key carry the same progress on the same base)."""
    return (self.base_generation, self.base_version, self.steps)

  @property
  def nbytes(self) -> int:
    return compression.tree_nbytes(self.delta)


@dataclasses.dataclass(frozen=True)
class Tick:
  """A timer the synchronizer asked for has expired."""

  time: float


Event = Join | Leave | Upload | Tick


# ---- actions: what the synchronizer wants done (runtimes carry them out) ----


@dataclasses.dataclass(frozen=True)
class Send:
  """Deliver fragment `fragment` at `version` to one learner: an update or the full values."""

  learner: int
  fragment: int
  version: int
  update: EncodedFlat | None = None  # apply to version - 1
  values: Flat | None = None  # full fp32 fragment
  generation: int = 0  # the sender's synchronizer generation
  base_generation: int = 0  # an update applies to version - 1 of this generation
  checksum: int | None = None  # None: computed now; `send_checksum` reuses a payload's CRC
  inner_steps: int = 0  # DyLU: the learner's inner steps between syncs from now on; 0 = as it was
  # The receiving learner's upload this version merges, as (base_generation, base_version,
  # steps) (`Upload.key`), or None: the learner takes exactly that upload's progress as merged.
  own: tuple[int, int, int] | None = None
  # outer.schedule_by=global: the inner steps merged into this fragment so far, all learners'
  # (a restarting learner's inner schedule is at progress / learners); 0: not sent.
  progress: int = 0

  def __post_init__(self):
    if self.checksum is None:
      object.__setattr__(self, "checksum", self.expected_checksum())

  def expected_checksum(self, payload_crc: int | None = None) -> int:
    """The checksum of this message's header numbers and payload as they are now."""
    if payload_crc is None:
      payload = self.update if self.update is not None else self.values
      payload_crc = integrity.tree_crc(payload)
    return send_checksum(
        self.fragment,
        self.version,
        self.generation,
        self.base_generation,
        payload_crc,
        self.inner_steps,
        self.own,
        self.progress,
    )

  def checksum_ok(self) -> bool:
    return self.checksum == self.expected_checksum()

  @property
  def includes_own(self) -> bool:
    """This version merges one of the receiving learner's uploads."""
    return self.own is not None

  @property
  def nbytes(self) -> int:
    if self.update is not None:
      return compression.tree_nbytes(self.update)
    return int(sum(np.asarray(v).nbytes for v in self.values.values()))


@dataclasses.dataclass(frozen=True)
class SetTimer:
  time: float


@dataclasses.dataclass(frozen=True)
class Log:
  record: dict


@dataclasses.dataclass(frozen=True)
class Refused:
  """The synchronizer refused an event: learner `learner`'s upload of `fragment` (None: its Join),
  for `code`. Arrival-time codes answer the caller; `code.at_merge` ones come when the round
  merges. `record` is its log line."""

  learner: int
  fragment: int | None
  code: outcomes.Code
  reason: str
  time: float
  sent_time: float | None = None  # the refused upload's, when it was one
  base_version: int | None = None
  base_generation: int | None = None

  @property
  def record(self) -> dict:
    out = {
        "event": "reject",
        "learner": self.learner,
        "fragment": self.fragment,
        "time": self.time,
        "reason": self.reason,
        "code": self.code.value,
    }
    if self.sent_time is not None:
      out.update(
          sent_time=self.sent_time,
          base_version=self.base_version,
          base_generation=self.base_generation,
      )
    return out


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """Save the synchronizer's `state_dict()` now (due every N merges); `merges` names the save."""

  merges: int


Action = Send | SetTimer | Log | Refused | Checkpoint


def records(actions) -> list[dict]:
  """The log lines of `actions`, in order: every Log's and every Refused's."""
  return [a.record for a in actions if isinstance(a, (Log, Refused))]


def send_checksum(
    fragment: int,
    version: int,
    generation: int,
    base_generation: int,
    payload_crc: int,
    inner_steps: int = 0,
    own: tuple[int, int, int] | None = None,
    progress: int = 0,
) -> int:
  """A Send's checksum from its header numbers and the CRC of its payload (shared by a merge's
  sends of one encoded update); a DyLU step count and the merged own upload's key join the
  header when set."""
  header = (fragment, version, generation, base_generation) + (
      (inner_steps,) if inner_steps else ()
  )
  header += (-1, *own) if own is not None else ()
  header += (-2, progress) if progress else ()
  return integrity.with_header(header, payload_crc)


# ---- wire math both sides share ----


def apply_send(
    global_copy: Mapping[str, np.ndarray],
    send: Send,
    cut: Callable[[dict], Mapping[str, np.ndarray]] | None = None,
) -> dict[str, np.ndarray]:
  """A learner's new copy of the global fragment after receiving `send`; `cut` takes the part of
  whole arrays a learner holds (a multi-process learner's, rpc/host_parts.py)."""
  cut = cut or (lambda tree: tree)
  if send.update is None:
    return dict(cut({k: np.array(v, np.float32) for k, v in send.values.items()}))
  decoded = cut(compression.decode_tree(send.update))
  return {k: global_copy[k] + decoded[k] for k in global_copy}


def outer_gradient(
    global_copy: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray], codec: str
) -> dict[str, compression.Encoded]:
  """Δ = Θ_base − θ_local, encoded for the wire (log rounding, no error feedback)."""
  return uplink.Uplink(codec).encode(0, global_copy, local)
