"""Merges are atomic: a round whose merge, outer step or downlink would not be finite is rejected
with `non_finite_merge`, the state bit-identical to before, and `handle` never raises."""

import numpy as np

from diloco.outer import fragments, merging, optimizers, policies, protocol
from diloco.outer.codecs import compression
from diloco.outer.protocol import Join, Log, Send, Upload, records
from diloco.outer.sync.synchronizer import Synchronizer

F32 = np.float32
BIG = np.finfo(F32).max
PARAMS = {"blocks": {0: {"w": np.array([1.0, -2.0], F32)}, 1: {"w": np.array([0.5, 4.0], F32)}}}
FRAG = fragments.strided(PARAMS, 1)
W0, W1 = "blocks/0/w", "blocks/1/w"


def _sync(merge, learners=2, momentum=0.9, lr=1.0, codec="fp32") -> Synchronizer:
  policy = policies.Policy(
      policies.AllMembers(), policies.NoGrace(), policies.EqualWeights(), merge
  )
  sync = Synchronizer(PARAMS, FRAG, policy, optimizers.nesterov(lr, momentum), codec)
  for m in range(learners):
    sync.handle(Join(m, 0.0, (0,)))
  return sync


def _up(m, base, delta, time=1.0):
  return Upload(m, 0, base, compression.encode_tree(delta, "fp32"), 1, 8, time, time, 1.0)


def _records(actions, event):
  return [r for r in records(actions) if r["event"] == event]


def test_rda_of_a_subnormal_delta_and_a_huge_one_is_finite():
  tiny = {W0: np.array([1e-44, 0.0], F32), W1: np.array([0.0, 1e-44], F32)}
  huge = {W0: np.array([1e37, 0.0], F32), W1: np.array([0.0, 1e37], F32)}
  for path in (W0, W1):
    out = merging.rda([tiny[path], huge[path]], [1.0, 1.0])
    assert np.isfinite(out).all(), out
    # Both point the same way: the direction is that of either, the norm their mean.
    np.testing.assert_allclose(out, huge[path] / 2, rtol=1e-6)


def test_a_merge_that_overflows_through_the_momentum_is_rejected_and_changes_nothing():
  sync = _sync(policies.Mean(), momentum=0.9, lr=1.0)
  q = BIG / 4
  near = {W0: np.array([q, -q], F32), W1: np.array([q, 1.0], F32)}
  for m in (0, 1):
    acts = sync.handle(_up(m, 0, near))
  # Round 1: trace t = g = q, step g + 0.9 t = 1.9 q = 0.475 max: finite globals near -0.475 max.
  assert len(_records(acts, "merge")) == 1
  before = sync.digest()
  # Round 2: t = 0.9 q + q, step g + 0.9 t = 2.71 q; the globals would reach 1.15 max: overflow.
  for m in (0, 1):
    acts = sync.handle(_up(m, 1, near, time=2.0))
  rejects = _records(acts, "reject")
  assert [r["code"] for r in rejects] == ["non_finite_merge"] * 2
  assert not [a for a in acts if isinstance(a, Send)] and not _records(acts, "merge")
  assert sync.digest() == before and sync.versions == [1]
  for leaf in sync.fragments[0].opt_state[0].trace.values():
    assert np.isfinite(leaf).all()
  # The state is not poisoned: a sane round merges after it.
  small = {W0: np.array([0.5, 0.5], F32), W1: np.array([0.25, 0.0], F32)}
  for m in (0, 1):
    acts = sync.handle(_up(m, 1, small, time=3.0))
  assert len(_records(acts, "merge")) == 1 and sync.versions == [2]
  assert all(np.isfinite(v).all() for v in sync.globals[0].values())


def test_rda_round_of_a_subnormal_and_a_huge_upload_merges_finite():
  sync = _sync(policies.RDA(), momentum=0.0, lr=1.0, codec="fp4")
  tiny = {W0: np.array([1e-44, 0.0], F32), W1: np.array([0.0, 1e-44], F32)}
  huge = {W0: np.array([1e30, 0.0], F32), W1: np.array([0.0, 1e30], F32)}
  sync.handle(_up(0, 0, tiny))
  acts = sync.handle(_up(1, 0, huge))
  assert len(_records(acts, "merge")) == 1 and not _records(acts, "reject")
  assert all(np.isfinite(v).all() for v in sync.globals[0].values())
  assert all(np.isfinite(v).all() for v in sync.fragments[0].residual.values())


def test_handle_never_raises_when_the_merge_itself_fails(monkeypatch):
  sync = _sync(policies.Mean())
  delta = {W0: np.array([0.5, 0.5], F32), W1: np.array([0.25, 0.0], F32)}
  for m in (0, 1):  # one round first, so that the timing EMAs (fed on arrival) are settled
    sync.handle(_up(m, 0, delta))
  before = sync.digest()

  def broken(*a, **k):
    raise FloatingPointError("overflow in the outer step")

  monkeypatch.setattr(optimizers, "host_step", broken)
  sync.handle(_up(0, 1, delta, time=2.0))
  acts = sync.handle(_up(1, 1, delta, time=2.0))
  assert [r["code"] for r in _records(acts, "reject")] == ["non_finite_merge"] * 2
  assert "overflow in the outer step" in _records(acts, "reject")[0]["reason"]
  assert sync.digest() == before and sync.versions == [1] and sync.rounds_skipped == 1
