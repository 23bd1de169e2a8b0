"""One merge round of the real synchronizer on a synthetic fragment: what scripts/bench_sync.py
times and what the plan's merge rate (plan/sync_load.py) measures.

A fragment of float32 matrices of 1024 columns; M learners each upload a small random delta of it
in the uplink codec; a round hands the synchronizer every upload at its current version (each
with its checksum, computed once: the senders' work), and the last one triggers the merge.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from diloco.outer import fragments, integrity, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.protocol import Join, Upload
from diloco.outer.sync.synchronizer import Synchronizer


def make_fragment(mbytes: int, leaves: int = 4) -> dict[str, np.ndarray]:
  """`leaves` float32 matrices of 1024 columns, `mbytes` MiB together."""
  rows = max(mbytes * 2**20 // 4 // 1024 // leaves, 1)
  rng = np.random.default_rng(0)
  return {
      f"blocks/0/w{i}": rng.standard_normal((rows, 1024), dtype=np.float32) for i in range(leaves)
  }


def _uploads(params, m: int, codec: str) -> list[Upload]:
  """M uploads of small random deltas, each encoded as soon as it is drawn (one fp32 delta alive
  at a time)."""
  rng = np.random.default_rng(1)
  out = []
  for i in range(m):
    d = {
        k: rng.standard_normal(x.shape, dtype=np.float32) * np.float32(1e-3)
        for k, x in params.items()
    }
    out.append(Upload(i, 0, 0, compression.encode_tree(d, codec), 8, 8 * 1024, 0.0, 0.0, 1.0))
    del d
  return out


class MergeRound:
  """A synchronizer of one fragment (all learners live, no grace, equal weights, Nesterov 0.7/0.9)
  with M joined learners and their uploads; calling it runs one merge round."""

  def __init__(self, params, learners: int, uplink: str, rule: str, downlink: str = "fp4"):
    policy = policies.Policy(
        policies.AllLive(),
        policies.NoGrace(),
        weights=policies.EqualWeights(),
        merge=policies.MERGES[rule],
    )
    self.fragment_bytes = sum(x.nbytes for x in params.values())
    self.learners = learners
    self.sync = Synchronizer(
        params,
        fragments.balanced(params, 1),
        policy,
        optimizers.nesterov(0.7, 0.9),
        downlink_codec=downlink,
    )
    for i in range(learners):
      self.sync.handle(Join(i, 0.0, (0,)))
    # (from the synchronizer's own copy: the caller may drop `params`)
    self.uploads = _uploads(self.sync.globals[0], learners, uplink)
    self._crcs = [integrity.tree_crc(u.delta) for u in self.uploads]

  def __call__(self) -> None:
    v = self.sync.versions[0]
    actions = []
    for up, crc in zip(self.uploads, self._crcs):
      checksum = integrity.with_header(
          (up.fragment, up.base_generation, v, up.steps, up.tokens), crc
      )
      actions = self.sync.handle(dataclasses.replace(up, base_version=v, checksum=checksum))
    assert self.sync.versions[0] == v + 1 and len(actions) == self.learners + 1, actions[:1]
