"""What an upload must pass before it may touch the synchronizer's state, in the order checked.

Read-only checks against a `Synchronizer` (the `sync` argument; this module is below it): the fragment id, the checksum, paths, shapes and payload
sizes against the model, the base version (known to this generation's history, not too stale, not
already merged from that learner) and progress. Values (finite, not outliers) are checked at merge
time (`Synchronizer._screen`).
"""

from diloco.outer import compression, outcomes
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Refused, Upload


def known(sync, p: int, generation: int, version: int) -> bool:
  """Whether version `version` of fragment p from `generation` is in the synchronizer's history."""
  if not 0 <= version <= sync.versions[p]:
    return False
  if generation == sync.generation:
    return True
  return generation in sync.lineage and version <= sync.lineage[generation][p]


def invalid(sync, up: Upload) -> tuple[Code, str] | None:
  """(code, reason) of the first check the upload fails, or None."""
  p = up.fragment
  if not 0 <= p < sync.frag.num_fragments:
    return Code.UNKNOWN_FRAGMENT, f"unknown fragment {p}"
  if not up.checksum_ok():
    return Code.CHECKSUM, f"checksum mismatch: payload of fragment {p} corrupted in transit"
  want = sync.globals[p]
  if sorted(up.delta) != sorted(want):
    return Code.PATHS, "fragment paths differ from the model's"
  for k, e in up.delta.items():
    if tuple(e.shape) != want[k].shape:
      return Code.SHAPE, f"{k} has shape {tuple(e.shape)}, expected {want[k].shape}"
    if e.nbytes != compression.encoded_nbytes(e.codec, e.num_values, e.block):
      return Code.PAYLOAD_SIZE, f"{k}: corrupt {e.codec} payload of {e.nbytes} bytes"
  if not known(sync, p, up.base_generation, up.base_version):
    where = (
        f" of generation {up.base_generation}, now {sync.generation}"
        if up.base_generation != sync.generation
        else ""
    )
    return (
        Code.UNKNOWN_BASE_VERSION,
        f"unknown base version {up.base_version}{where} (current {sync.versions[p]})",
    )
  if sync.versions[p] - up.base_version > sync.policy.max_staleness:
    return Code.STALE, f"stale: base version {up.base_version}, current {sync.versions[p]}"
  if up.base_version <= sync.contributed[p].get(up.learner, -1):
    return (
        Code.DUPLICATE,
        f"learner {up.learner} already contributed to fragment {p} on "
        f"base version {sync.contributed[p][up.learner]}",
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
