"""What the synchronizer sends a learner of a fragment: its newest version, as the update the
learner can apply to the version it holds or as the full values."""

from collections.abc import Sequence

from diloco.outer import protocol
from diloco.outer.protocol import Send
from diloco.outer.sync_state import FragmentState


def newest(
    learner: int,
    p: int,
    f: FragmentState,
    generation: int,
    held: list[int],
    held_gen: list[int],
    inner_steps: int,
    progress: int,
    own: Sequence[int] | None,
    update=None,
    update_crc: int | None = None,
) -> Send:
  """Version `f.version` of fragment p for `learner`: the encoded `update` (checksummed from its
  payload's CRC `update_crc`) when the learner holds the version before it (`held[p]`, of
  generation `held_gen[p]`), else a copy of the full values; `held` then records the version.
  `inner_steps`: DyLU's steps for the learner (0: as it was); `progress`: the inner steps merged
  so far (0: not sent); `own`: the key of the learner's upload the version merges."""
  v = f.version
  if update is not None and held[p] == v - 1:
    crc = protocol.send_checksum(
        p, v, generation, held_gen[p], update_crc, inner_steps, own, progress
    )
    send = Send(
        learner,
        p,
        v,
        update,
        generation=generation,
        base_generation=held_gen[p],
        checksum=crc,
        inner_steps=inner_steps,
        own=own,
        progress=progress,
    )
  else:
    values = {k: x.copy() for k, x in f.values.items()}
    kw = dict(generation=generation, inner_steps=inner_steps, own=own, progress=progress)
    send = Send(learner, p, v, values=values, **kw)
  held[p], held_gen[p] = v, generation
  return send
