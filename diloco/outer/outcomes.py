"""Why a message was refused: one enumeration for the synchronizer, its host and the learners.

A `Code` is a `str`, so records and JSON carry its value as before ('stale', 'checksum', ...) and
a code compares equal to its value; code that decides anything reads the member. Who refuses:
- the synchronizer on arrival (`admission.invalid`): the upload never entered a round;
- the synchronizer at merge time (`AT_MERGE`): the upload was in a round, which left it out;
- the host of a real-time synchronizer (sessions, sizes, rates, tokens; rpc and sync_host);
- a learner refusing a merged fragment it cannot apply (`Learner.accepts`).

What a learner does about each is `learner_machine`'s; how each crosses gRPC is rpc/service.py's
table (one status per code, the code itself in the call's trailing metadata).
"""

import enum


class Code(str, enum.Enum):
  """A refusal code."""

  # the synchronizer, on arrival of an upload, in the order admission checks them
  UNKNOWN_FRAGMENT = "unknown_fragment"
  CHECKSUM = "checksum"  # also a learner's: a merged fragment corrupted on its way down
  PATHS = "paths"
  SHAPE = "shape"
  PAYLOAD_SIZE = "payload_size"
  UNKNOWN_BASE_VERSION = "unknown_base_version"
  STALE = "stale"
  DUPLICATE = "duplicate"  # also a learner's: a version it holds already
  NO_PROGRESS = "no_progress"
  JOIN = "join"  # a Join whose version or generation lists do not fit the model
  # the synchronizer, when the upload's round merges
  NON_FINITE = "non_finite"
  OUTLIER = "outlier"
  NON_FINITE_MERGE = "non_finite_merge"
  # the real-time host
  UNAUTHENTICATED = "unauthenticated"
  MALFORMED = "malformed"
  INVALID = "invalid"
  NOT_JOINED = "not_joined"
  ALREADY_EXISTS = "already_exists"
  TOO_MANY = "too_many"
  TOO_LARGE = "too_large"
  RATE_LIMITED = "rate_limited"
  # a learner, of a merged fragment
  OLD_GENERATION = "old_generation"
  GAP = "gap"

  def __str__(self) -> str:
    return self.value

  @property
  def at_merge(self) -> bool:
    """Refused when its round merged (not when it arrived): no caller waits for this answer."""
    return self in AT_MERGE


AT_MERGE = frozenset({Code.NON_FINITE, Code.OUTLIER, Code.NON_FINITE_MERGE})
# The upload itself is malformed (as opposed to no longer applicable).
MALFORMED_UPLOAD = frozenset(
    {Code.UNKNOWN_FRAGMENT, Code.CHECKSUM, Code.PATHS, Code.SHAPE, Code.PAYLOAD_SIZE}
)


def find(value: str) -> Code | None:
  """The code named `value`, or None (a Code hashes by its name, so `value in set(Code)` fails)."""
  return Code._value2member_map_.get(value)


def parse(value: str) -> Code:
  """The code named `value`; a clear error for a name that is not one."""
  try:
    return Code(value)
  except ValueError:
    known = ", ".join(c.value for c in Code)
    raise ValueError(f"unknown refusal code {value!r}; known: {known}") from None
