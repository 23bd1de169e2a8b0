"""What an upload must pass before it may touch the synchronizer's state, in the order checked.

Read-only checks against what they need of the synchronizer (its fragments' values for their
paths and shapes, its version history, its staleness bound, who contributed on which base): the
fragment id, the checksum, paths, shapes and payload sizes against the model, the base version
(known to this generation's history, not too stale, not already merged from that learner) and
progress. Values (finite, not outliers) are checked at merge
time (`Synchronizer._screen`).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from diloco.outer import outcomes
from diloco.outer.codecs import compression
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Join, Refused, Upload


@dataclasses.dataclass(frozen=True)
class History:
  """The synchronizer's versions as admission sees them."""

  versions: Sequence[int]  # per fragment, current
  generation: int
  lineage: Mapping[int, Sequence[int]]  # earlier generation -> versions shared with ours


class Fragment(Protocol):
  """What admission reads of a fragment's state (`sync_state.FragmentState`)."""

  values: Mapping[str, np.ndarray]
  contributed: Mapping[int, int]  # learner -> the newest base version merged from it


def known(history: History, p: int, generation: int, version: int) -> bool:
  """Whether version `version` of fragment p from `generation` is in the synchronizer's history."""
  if not 0 <= version <= history.versions[p]:
    return False
  if generation == history.generation:
    return True
  return generation in history.lineage and version <= history.lineage[generation][p]


def invalid(
    up: Upload, fragments: Mapping[int, Fragment], history: History, max_staleness: int
) -> tuple[Code, str] | None:
  """(code, reason) of the first check the upload fails, or None. `fragments`: each owned
  fragment's global values (their paths and shapes) and who contributed on which base."""
  p = up.fragment
  if p not in fragments:
    if isinstance(p, int) and 0 <= p < len(history.versions):
      return Code.UNKNOWN_FRAGMENT, f"fragment {p} is owned by another synchronizer shard"
    return Code.UNKNOWN_FRAGMENT, f"unknown fragment {p}"
  if not up.checksum_ok():
    return Code.CHECKSUM, f"checksum mismatch: payload of fragment {p} corrupted in transit"
  want, contributed = fragments[p].values, fragments[p].contributed
  if sorted(up.delta) != sorted(want):
    return Code.PATHS, "fragment paths differ from the model's"
  for k, e in up.delta.items():
    if tuple(e.shape) != want[k].shape:
      return Code.SHAPE, f"{k} has shape {tuple(e.shape)}, expected {want[k].shape}"
    if e.nbytes != compression.encoded_nbytes(e.codec, e.num_values, e.block):
      return Code.PAYLOAD_SIZE, f"{k}: corrupt {e.codec} payload of {e.nbytes} bytes"
  if not known(history, p, up.base_generation, up.base_version):
    where = (
        f" of generation {up.base_generation}, now {history.generation}"
        if up.base_generation != history.generation
        else ""
    )
    return (
        Code.UNKNOWN_BASE_VERSION,
        f"unknown base version {up.base_version}{where} (current {history.versions[p]})",
    )
  if history.versions[p] - up.base_version > max_staleness:
    return Code.STALE, f"stale: base version {up.base_version}, current {history.versions[p]}"
  if up.base_version <= contributed.get(up.learner, -1):
    return (
        Code.DUPLICATE,
        f"learner {up.learner} already contributed to fragment {p} on "
        f"base version {contributed[up.learner]}",
    )
  if up.steps <= 0 or up.tokens <= 0:
    return Code.NO_PROGRESS, f"no progress to merge: {up.steps} steps, {up.tokens} tokens"
  return None


def refusal(
    learner: int,
    fragment: int | None,
    time: float,
    reason: str,
    code: outcomes.Code,
    up: Upload | None = None,
) -> Refused:
  """The synchronizer's refusal of an upload (`up`) or a Join (fragment None)."""
  if up is None:
    return Refused(learner, fragment, code, reason, time)
  return Refused(
      learner, fragment, code, reason, time, up.sent_time, up.base_version, up.base_generation
  )


def invalid_join(event: Join, num_fragments: int) -> Refused | None:
  """The refusal of a Join that does not name a version (and, if any, a generation) for each
  fragment, or None."""
  for what, n in (("versions", len(event.versions)), ("generations", len(event.generations))):
    if n != num_fragments and (what == "versions" or n):
      why = f"join with {n} {what}, expected {num_fragments}"
      return refusal(event.learner, None, event.time, why, Code.JOIN)
  return None
