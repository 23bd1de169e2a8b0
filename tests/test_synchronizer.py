"""The synchronizer state machine on a hand-made four-leaf model, with hand-computed numbers.

Values are dyadic (sums of a few powers of two) wherever a test claims bit equality, so the float32
arithmetic of the synchronizer and of the hand computation is exact.
"""

import math
import struct
import zlib

import jax
import numpy as np
import pytest

from diloco import metrics
from diloco.outer import fragments, optimizers, policies, protocol
from diloco.outer.codecs import compression
from diloco.outer.outcomes import Code
from diloco.outer.protocol import Join, Leave, Log, Refused, Send, SetTimer, Tick, Upload, records
from diloco.outer.sync.synchronizer import Synchronizer

F32 = np.float32
PARAMS = {
    "embed": {"embedding": np.array([[1.0, 2.0], [3.0, 4.0]], F32)},
    "blocks": {
        0: {"w": np.array([[0.5, -1.0], [2.0, 0.25]], F32)},
        1: {"w": np.array([1.0, -2.0, 4.0], F32)},
    },
    "final_norm": {"scale": np.array([1.0, 1.0], F32)},
}
FRAG = fragments.strided(PARAMS, 2)  # 0: embed, block 0; 1: block 1, final norm
E, W0, W1, S = "embed/embedding", "blocks/0/w", "blocks/1/w", "final_norm/scale"
EQUAL_MEAN = dict(weights=policies.EqualWeights(), merge=policies.Mean())


def _sync(policy, tx, learners: int, codec: str = "fp32") -> Synchronizer:
  sync = Synchronizer(PARAMS, FRAG, policy, tx, downlink_codec=codec)
  for m in range(learners):
    assert sync.handle(Join(m, 0.0, (0, 0))) == [Log({"event": "join", "learner": m, "time": 0.0})]
  return sync


def _up(
    m: int,
    p: int,
    delta: dict,
    base: int,
    time: float = 1.0,
    steps: int = 1,
    tokens: int = 8,
    sent: float | None = None,
    step_time: float = 1.0,
) -> Upload:
  return Upload(
      m,
      p,
      base,
      compression.encode_tree(delta, "fp32"),
      steps,
      tokens,
      time,
      time if sent is None else sent,
      step_time,
  )


def _f(*rows) -> np.ndarray:
  return np.array(rows, F32)


def _assert_bits(a: dict, b: dict) -> None:
  assert sorted(a) == sorted(b)
  for k in a:
    assert a[k].dtype == b[k].dtype == F32, k
    np.testing.assert_array_equal(a[k].view(np.uint32), b[k].view(np.uint32), err_msg=k)


def _of(actions, kind):
  return [a for a in actions if isinstance(a, kind)]


def _merges(actions) -> list[dict]:
  return [a.record for a in _of(actions, Log) if a.record["event"] == "merge"]


def _snapshot(sync: Synchronizer):
  """Deep copy of everything a rejected event must leave alone."""
  return (
      [{k: v.copy() for k, v in g.items()} for g in sync.globals.values()],
      [np.array(x) for x in jax.tree.leaves([f.opt_state for f in sync.fragments.values()])],
      list(sync.versions),
      [{k: v.copy() for k, v in r.items()} for r in (f.residual for f in sync.fragments.values())],
  )


def _assert_unchanged(before, sync: Synchronizer) -> None:
  globals_, opt, versions, residuals = before
  after = _snapshot(sync)
  for g0, g1 in zip(globals_, after[0]):
    _assert_bits(g0, g1)
  assert len(opt) == len(after[1])
  for x0, x1 in zip(opt, after[1]):
    np.testing.assert_array_equal(x0, x1)
    assert x0.dtype == x1.dtype
  assert versions == after[2]
  for r0, r1 in zip(residuals, after[3]):
    _assert_bits(r0, r1)


# ---- synchronous policy: quorum = all, equal weights, mean, Nesterov ----


def test_synchronous_merge_is_the_hand_computed_nesterov_step_and_learners_match_bitwise():
  lr, beta = 0.5, 0.5
  sync = _sync(policies.SYNCHRONOUS, optimizers.nesterov(lr, beta), learners=2)
  theta0 = {E: PARAMS["embed"]["embedding"], W0: PARAMS["blocks"][0]["w"]}
  copies = [dict(theta0), dict(theta0)]  # each learner's copy of global fragment 0

  # Round 1: learner m trained to θ_m = Θ − d_m and uploads Δ_m = Θ − θ_m (= d_m exactly).
  d = [
      {E: _f([0.5, 0.0], [1.0, -1.0]), W0: _f([0.25, 0.5], [0.0, 1.0])},
      {E: _f([1.5, 1.0], [-1.0, 1.0]), W0: _f([0.75, -0.5], [2.0, 0.0])},
  ]
  ups = [
      Upload(
          m,
          0,
          0,
          protocol.outer_gradient(
              copies[m], {k: copies[m][k] - d[m][k] for k in copies[m]}, "fp32"
          ),
          4,
          128,
          1.0,
          0.9,
          0.25,
      )
      for m in range(2)
  ]
  assert sync.handle(ups[0]) == []  # one of two live learners: no merge yet
  assert sync.versions == [0, 0]
  actions = sync.handle(ups[1])
  # g = mean Δ = [[1, .5], [0, 0]] and [[.5, 0], [1, .5]]; first step θ − lr(βg + g) = θ − .75g.
  want1 = {E: _f([0.25, 1.625], [3.0, 4.0]), W0: _f([0.125, -1.0], [1.25, -0.125])}
  _assert_bits(sync.globals[0], want1)
  assert sync.versions == [1, 0]
  (record,) = _merges(actions)
  assert record == {
      "event": "merge",
      "time": 1.0,
      "fragment": 0,
      "version": 1,
      "quorum": 2,
      "learners": [0, 1],
      "weights": [0.5, 0.5],
      "staleness": [0, 0],
      "grace_s": 0.0,
      "steps": [4, 4],
      "tokens": [128, 128],
      "clipped": [],
      "arrived": [1.0, 1.0],  # (both uploads at t = 1)
      # the merge clock: by arrival, a whole outer step; its period, H (1 here) times the
      # reference learner's 0.25 s a step
      "clock": "arrival",
      "scale": 1.0,
      "period_s": 0.25,
      "due_s": None,  # (the period clock's scheduled time for this merge)
  }
  sends = _of(actions, Send)
  assert [(s.learner, s.fragment, s.version) for s in sends] == [(0, 0, 1), (1, 0, 1)]
  assert all(s.update is not None and s.values is None for s in sends)  # learners held v0
  for m, s in enumerate(sends):
    copies[m] = protocol.apply_send(copies[m], s)
    _assert_bits(copies[m], sync.globals[0])
  # Fragment 1 never moved.
  _assert_bits(sync.globals[1], {W1: PARAMS["blocks"][1]["w"], S: PARAMS["final_norm"]["scale"]})

  # Round 2 carries the momentum: m2 = βg + g2, θ ← θ − lr(g2 + β·m2).
  d2 = [
      {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.0], [0.0, 2.0])},
      {E: _f([1.0, -1.0], [1.0, 1.0]), W0: _f([0.0, 0.0], [2.0, 0.0])},
  ]
  sync.handle(_up(0, 0, d2[0], base=1, time=2.0))
  actions = sync.handle(_up(1, 0, d2[1], base=1, time=2.0))
  want2 = {E: _f([-0.625, 1.5625], [2.25, 3.25]), W0: _f([0.0625, -1.0], [0.375, -0.9375])}
  _assert_bits(sync.globals[0], want2)
  assert _merges(actions)[0]["version"] == 2
  for m, s in enumerate(_of(actions, Send)):
    _assert_bits(protocol.apply_send(copies[m], s), want2)


def test_synchronous_merge_with_the_paper_outer_hyperparameters():
  """lr 0.7, momentum 0.9 (not dyadic): the first step is θ − 0.7·1.9·g to float32 rounding."""
  sync = _sync(policies.SYNCHRONOUS, optimizers.nesterov(0.7, 0.9), learners=2)
  rng = np.random.default_rng(0)
  d = [{W1: rng.normal(size=3).astype(F32), S: rng.normal(size=2).astype(F32)} for _ in range(2)]
  sync.handle(_up(0, 1, d[0], base=0))
  sync.handle(_up(1, 1, d[1], base=0))
  for k, x0 in ((W1, PARAMS["blocks"][1]["w"]), (S, PARAMS["final_norm"]["scale"])):
    g = (d[0][k].astype(np.float64) + d[1][k]) / 2
    np.testing.assert_allclose(sync.globals[1][k], x0 - 0.7 * 1.9 * g, rtol=1e-6, atol=1e-6)


# ---- quorum ----


def test_min_quorum_merges_with_the_live_learners_while_others_stall():
  sync = _sync(
      policies.Policy(policies.MinQuorum(2), policies.NoGrace(), **EQUAL_MEAN),
      optimizers.sgd(1.0),
      learners=4,
  )
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  for v in range(3):  # learners 2 and 3 never upload
    assert sync.handle(_up(0, 0, delta, base=v, time=v + 0.5)) == []
    actions = sync.handle(_up(1, 0, delta, base=v, time=v + 0.75))
    (record,) = _merges(actions)
    assert record["learners"] == [0, 1] and record["quorum"] == 2
    assert record["version"] == v + 1 and record["time"] == v + 0.75
    assert [s.learner for s in _of(actions, Send)] == [0, 1, 2, 3]
    # Each send says whether it merges its learner's upload (the delivery rules read it).
    # (`Send.own`: the key of the upload merged, (base generation, base version, steps)).
    assert [s.own for s in _of(actions, Send)] == [(0, v, 1), (0, v, 1), None, None]
    assert all(s.checksum_ok() for s in _of(actions, Send))
  np.testing.assert_array_equal(sync.globals[0][E], PARAMS["embed"]["embedding"] - 3.0)


def test_all_learners_waits_for_stalled_learners_until_they_leave():
  sync = _sync(
      policies.Policy(policies.AllLive(), policies.NoGrace(), **EQUAL_MEAN),
      optimizers.sgd(1.0),
      learners=4,
  )
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  assert sync.handle(_up(0, 0, delta, base=0)) == []
  assert sync.handle(_up(1, 0, delta, base=0)) == []
  assert sync.handle(Tick(100.0)) == []
  assert sync.handle(Leave(2, 101.0)) == []  # 2 of 3 live learners
  assert sync.versions == [0, 0]
  actions = sync.handle(Leave(3, 102.0))  # now every live learner has uploaded
  (record,) = _merges(actions)
  assert record["learners"] == [0, 1] and record["time"] == 102.0
  assert [s.learner for s in _of(actions, Send)] == [0, 1]  # nothing goes to departed learners
  assert sync.versions == [1, 0]


def test_a_round_of_all_members_stops_waiting_for_a_learner_that_finished():
  # Synchronous DiLoCo's learners told to leave at different steps: learner 0 uploaded at its
  # sync point, learner 1 left mid-period and reports itself finished. Its round merges
  # learner 0's upload alone; a round whose quorum is met without it is left to that quorum.
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=2)
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  assert sync.handle(_up(0, 0, delta, base=0, time=1.0)) == []
  assert sync.handle(Tick(50.0)) == [] and sync.finished(0, 50.0) == []  # (0 is in it)
  (record,) = _merges(sync.finished(1, 51.0))
  assert record["learners"] == [0] and record["time"] == 51.0 and sync.versions == [1, 0]
  assert sync.finished(1, 52.0) == []  # (nothing waits for it now)
  k2 = _sync(policies.Policy(policies.MinQuorum(2), policies.NoGrace(), **EQUAL_MEAN),
             optimizers.sgd(1.0), learners=3)  # fmt: skip
  assert k2.handle(_up(0, 0, delta, base=0)) == [] and k2.finished(2, 2.0) == []
  assert not k2.rounds[0].abstaining  # (2 of 3: learner 1's upload still merges it)


def test_merged_work_sums_the_steps_and_tokens_of_merged_uploads_and_survives_a_restart():
  sync = _sync(
      policies.Policy(policies.MinQuorum(2), policies.NoGrace(), **EQUAL_MEAN),
      optimizers.sgd(1.0),
      learners=3,
  )
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  sync.handle(_up(0, 0, delta, base=0, steps=3, tokens=24))
  sync.handle(_up(1, 0, delta, base=0, steps=5, tokens=40))  # merge 1 of fragment 0: 0 and 1
  sync.handle(_up(2, 0, delta, base=0, steps=7, tokens=56))  # on base 0, one behind: pending
  (reject,) = _of(sync.handle(_up(0, 0, delta, base=0, steps=4)), Refused)  # 0 already merged
  assert reject.code == Code.DUPLICATE  # on base 0: a refused upload counts nothing
  sync.handle(_up(0, 0, delta, base=1, steps=2, tokens=16))  # merge 2: learners 2 and 0
  d1 = {W1: _f(1.0, 1.0, 1.0), S: _f(0.0, 0.0)}
  sync.handle(_up(1, 1, d1, base=0, steps=6, tokens=48))
  sync.handle(_up(2, 1, d1, base=0, steps=6, tokens=48))  # fragment 1's merge: 1 and 2
  want = {
      0: {"steps": {0: 3 + 2}, "tokens": {0: 24 + 16}},
      1: {"steps": {0: 5, 1: 6}, "tokens": {0: 40, 1: 48}},
      2: {"steps": {0: 7, 1: 6}, "tokens": {0: 56, 1: 48}},
  }
  assert sync.versions == [2, 1] and sync.merged_work() == want
  again = Synchronizer(PARAMS, FRAG, sync.policy, optimizers.sgd(1.0))
  again.restart(sync.state_dict(), 1)  # what a checkpoint holds
  assert again.merged_work() == want
  # The summary's shares: merged steps over fragments × trained steps (learner 3 never merged).
  shares = metrics.merged_shares(want, {0: 10, 1: 6, 2: 8, 3: 4}, fragments=2)
  assert {m: s["merged_share"] for m, s in shares.items()} == {
      "0": 5 / 20,
      "1": 11 / 12,
      "2": 13 / 16,
      "3": 0.0,
  }
  assert shares["2"]["merged_steps"] == {"0": 7, "1": 6} and shares["2"]["merged_tokens"] == 104


def test_a_join_answer_names_the_joiners_merged_upload_whose_merge_it_never_got():
  # Learner 0's upload (base 0, 3 steps) is merged into version 1; the sends are lost in a
  # restart from a checkpoint that holds the merge. Rejoining with version 0, learner 0 is told
  # that what it gets holds that upload (a rebasing learner would keep its 3 steps twice
  # otherwise); learner 1, which holds version 1, gets nothing; learner 2, whose upload was
  # merged into version 2, is told on its own key whatever version it holds before 2.
  sync = _sync(
      policies.Policy(policies.MinQuorum(1), policies.NoGrace(), **EQUAL_MEAN),
      optimizers.sgd(1.0),
      learners=3,
  )
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  sends = _of(sync.handle(_up(0, 0, delta, base=0, steps=3)), Send)
  assert [s.own for s in sends] == [(0, 0, 3), None, None]
  sends = _of(sync.handle(_up(2, 0, delta, base=0, steps=5)), Send)  # stale by one: version 2
  assert [s.own for s in sends] == [None, None, (0, 0, 5)]
  again = Synchronizer(PARAMS, FRAG, sync.policy, optimizers.sgd(1.0))
  again.restart(sync.state_dict(), 1)
  (send,) = _of(again.handle(Join(0, 5.0, (0, 0), (0, 0))), Send)
  assert (send.fragment, send.version, send.own) == (0, 2, (0, 0, 3))
  assert _of(again.handle(Join(1, 5.0, (2, 0), (0, 0))), Send) == []
  (send,) = _of(again.handle(Join(2, 5.0, (1, 0), (0, 0))), Send)
  assert send.own == (0, 0, 5)
  # Once a learner holds the version that merged its upload, a rejoin names nothing.
  (send,) = _of(again.handle(Join(0, 6.0, (1, 0), (0, 0))), Send)
  assert send.own is None


# ---- grace window ----


def test_adaptive_grace_formula_by_hand_and_never_negative():
  g = policies.AdaptiveGrace(gamma=0.5, overlap=2)
  assert g.window(1.0, 0.25, 0.5) == 0.5 * (2 * 1.0 - 0.25 - 0.5) == 0.625
  assert g.window(0.25, 0.25, 0.5) == 0.0  # 0.5·(0.5 − 0.75) < 0
  assert policies.AdaptiveGrace(0.0, 2).window(1.0, 0.0, 0.0) == 0.0
  assert policies.AdaptiveGrace(0.8, 0).window(5.0, 0.0, 0.0) == 0.0
  rng = np.random.default_rng(1)
  for step, quorum, sync in rng.uniform(0, 3, size=(200, 3)):
    w = g.window(step, quorum, sync)
    assert w >= 0.0 and w == max(0.0, 0.5 * (2 * step - quorum - sync))
  for bad in (dict(gamma=1.5), dict(gamma=-0.1), dict(overlap=-1)):
    with pytest.raises(ValueError):
      policies.AdaptiveGrace(**bad)


def test_grace_window_includes_learners_inside_it_and_defers_the_late_one():
  """K=2 of 3, γ=0.5, τ=4, EMA decay 0.5; every EMA below is worked out from the events."""
  policy = policies.Policy(
      policies.MinQuorum(2), policies.AdaptiveGrace(0.5, 4), **EQUAL_MEAN, ema_decay=0.5
  )
  sync = _sync(policy, optimizers.sgd(1.0), learners=3)
  delta = {E: _f([1.0, 0.0], [0.0, 0.0]), W0: _f([0.0, 0.0], [0.0, 1.0])}
  # ξ_step = 1, ξ_sync = 2·0.25 = 0.5; one upload is below the quorum.
  assert sync.handle(_up(0, 0, delta, 0, time=10.0, sent=9.75)) == []
  # Quorum after 0.5 s: ξ_quorum = 0.5, grace = 0.5·(4·1 − 0.5 − 0.5) = 1.5.
  assert sync.handle(_up(1, 0, delta, 0, time=10.5, sent=10.25)) == [SetTimer(12.0)]
  assert sync.handle(Tick(11.0)) == []  # inside the window
  actions = sync.handle(Tick(12.0))
  (first,) = _merges(actions)
  assert first["learners"] == [0, 1] and first["grace_s"] == 1.5 and first["version"] == 1
  # Learner 2 arrives after the deadline: it starts the next round, at staleness 1.
  assert sync.handle(_up(2, 0, delta, 0, time=12.5, sent=12.25)) == []
  # Quorum again after 0.5 s: every EMA is unchanged, so the window is 1.5 s again.
  assert sync.handle(_up(0, 0, delta, 1, time=13.0, sent=12.75)) == [SetTimer(14.5)]
  # The last live learner arrives inside the window: merge at once, no wait for the timer.
  actions = sync.handle(_up(1, 0, delta, 1, time=13.25, sent=13.0))
  (second,) = _merges(actions)
  assert second["learners"] == [0, 1, 2] and second["staleness"] == [0, 0, 1]
  assert second["grace_s"] == 0.25 and second["version"] == 2
  assert sync.handle(Tick(14.5)) == []  # the old timer finds nothing to do
  assert sync.versions == [2, 0]


# ---- weights ----


def test_merge_records_carry_normalised_token_weights_and_the_merge_uses_them():
  policy = policies.Policy(
      policies.AllLive(), policies.NoGrace(), weights=policies.TokenWeights(), merge=policies.Mean()
  )
  sync = _sync(policy, optimizers.sgd(1.0), learners=3)
  counters = [(32, 1), (32, 2), (64, 2)]  # tokens²/steps = 1024, 512, 2048 -> 2/7, 1/7, 4/7
  deltas = [
      {W1: _f(7.0, 0.0, 0.0), S: _f(0.0, 0.0)},
      {W1: _f(0.0, 7.0, 0.0), S: _f(0.0, 0.0)},
      {W1: _f(0.0, 0.0, 7.0), S: _f(7.0, -7.0)},
  ]
  actions = []
  for m, ((tokens, steps), d) in enumerate(zip(counters, deltas)):
    actions = sync.handle(_up(m, 1, d, base=0, tokens=tokens, steps=steps))
  (record,) = _merges(actions)
  np.testing.assert_allclose(record["weights"], [2 / 7, 1 / 7, 4 / 7], rtol=1e-12)
  assert math.isclose(sum(record["weights"]), 1.0)
  assert record["tokens"] == [32, 32, 64] and record["steps"] == [1, 2, 2]
  # Outer SGD lr 1: Θ − Σ w̃Δ = [1 − 2, −2 − 1, 4 − 4] and [1 − 4, 1 + 4].
  np.testing.assert_allclose(sync.globals[1][W1], [-1.0, -3.0, 0.0], atol=1e-6)
  np.testing.assert_allclose(sync.globals[1][S], [-3.0, 5.0], atol=1e-6)


# ---- rejections ----


def _raw_fp32(values: np.ndarray) -> compression.Encoded:
  """An fp32 payload built from raw bytes, past the encoder's finite check."""
  values = np.asarray(values, F32)
  return compression.Encoded("fp32", values.shape, values.tobytes(), compression.DEFAULT_BLOCK)


def _good(m: int, base: int) -> Upload:
  return _up(m, 0, {E: _f([1.0, 0.5], [0.25, 0.0]), W0: _f([0.0, 1.0], [-1.0, 2.0])}, base)


@pytest.fixture
def merged_once() -> Synchronizer:
  """Two learners, one Nesterov merge done (so the momentum is not zero)."""
  sync = _sync(policies.SYNCHRONOUS, optimizers.nesterov(0.5, 0.5), learners=2)
  sync.handle(_good(0, 0))
  sync.handle(_good(1, 0))
  assert sync.versions == [1, 0]
  return sync


def _with_delta(up: Upload, delta: dict) -> Upload:
  return Upload(
      up.learner,
      up.fragment,
      up.base_version,
      delta,
      up.steps,
      up.tokens,
      up.time,
      up.sent_time,
      up.step_time,
  )


@pytest.mark.parametrize(
    "case, code, reason",
    [
        ("unknown fragment", Code.UNKNOWN_FRAGMENT, "unknown fragment 5"),
        ("wrong shape", Code.SHAPE, "embed/embedding has shape (3, 2), expected (2, 2)"),
        ("missing path", Code.PATHS, "fragment paths differ"),
        ("extra path", Code.PATHS, "fragment paths differ"),
        ("future base version", Code.UNKNOWN_BASE_VERSION, "unknown base version 2 (current 1)"),
        ("negative base version", Code.UNKNOWN_BASE_VERSION, "unknown base version -1"),
        ("no progress", Code.NO_PROGRESS, "no progress to merge"),
        ("corrupt payload", Code.PAYLOAD_SIZE, "embed/embedding: corrupt fp32 payload of 12 bytes"),
    ],
)
def test_invalid_uploads_are_rejected_and_change_nothing(merged_once, case, code, reason):
  sync = merged_once
  good = _good(0, 1)
  bad = {
      "unknown fragment": Upload(0, 5, 1, good.delta, 1, 8, 1.0, 1.0, 1.0),
      "wrong shape": _with_delta(good, {**good.delta, E: _raw_fp32(np.zeros((3, 2)))}),
      "missing path": _with_delta(good, {E: good.delta[E]}),
      "extra path": _with_delta(good, {**good.delta, W1: _raw_fp32(np.zeros(3))}),
      "future base version": Upload(0, 0, 2, good.delta, 1, 8, 1.0, 1.0, 1.0),
      "negative base version": Upload(0, 0, -1, good.delta, 1, 8, 1.0, 1.0, 1.0),
      "no progress": Upload(0, 0, 1, good.delta, 0, 0, 1.0, 1.0, 1.0),
      "corrupt payload": _with_delta(
          good,
          {
              **good.delta,
              E: compression.Encoded(
                  "fp32", (2, 2), good.delta[E].payload[:12], compression.DEFAULT_BLOCK
              ),
          },
      ),
  }[case]
  before = _snapshot(sync)
  (refused,) = sync.handle(bad)
  assert isinstance(refused, Refused) and refused.learner == 0 and refused.code == code
  assert reason in refused.reason and refused.record["event"] == "reject"
  _assert_unchanged(before, sync)
  assert sync.pending == [{}, {}]
  # The next valid round still merges both learners normally.
  sync.handle(_good(0, 1))
  assert _merges(sync.handle(_good(1, 1)))[0]["learners"] == [0, 1]


def test_stale_uploads_beyond_max_staleness_are_rejected():
  policy = policies.Policy(policies.MinQuorum(1), policies.NoGrace(), **EQUAL_MEAN, max_staleness=0)
  sync = _sync(policy, optimizers.sgd(1.0), learners=2)
  assert _merges(sync.handle(_good(0, 0)))[0]["version"] == 1
  before = _snapshot(sync)
  (refused,) = sync.handle(_good(1, 0))
  assert refused.code == Code.STALE and "stale" in refused.reason
  _assert_unchanged(before, sync)


@pytest.mark.parametrize("damping, second_step", [(False, 1.0), (True, 0.5)])
def test_staleness_damping_halves_an_upload_one_version_behind(damping, second_step):
  # K=1, outer SGD lr 1: a merge moves the globals by minus its (scaled) outer gradient. Both
  # learners upload fragment 0 from version 0; learner 0 merges alone (staleness 0, scale 1),
  # then learner 1 merges one version behind: scale 1/(1+1) with damping, 1 without.
  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), **EQUAL_MEAN, staleness_damping=damping
  )
  sync = _sync(policy, optimizers.sgd(1.0), learners=2)
  d0 = {E: _f([1.0, 0.5], [0.25, 0.0]), W0: _f([0.0, 1.0], [-1.0, 2.0])}
  d1 = {E: _f([2.0, -4.0], [8.0, 1.0]), W0: _f([0.5, 0.0], [4.0, -2.0])}
  assert _merges(sync.handle(_up(0, 0, d0, base=0)))[0]["staleness"] == [0]
  assert _merges(sync.handle(_up(1, 0, d1, base=0)))[0]["staleness"] == [1]
  want = {
      E: PARAMS["embed"]["embedding"] - d0[E] - second_step * d1[E],
      W0: PARAMS["blocks"][0]["w"] - d0[W0] - second_step * d1[W0],
  }
  _assert_bits(sync.globals[0], want)


def test_the_global_anchor_takes_each_upload_against_the_fragment_as_it_is():
  """Issue 51: under outer.anchor=global an upload carries θ_m and the synchronizer forms
  Θ − θ_m on arrival. K=1, outer SGD lr 1/2: each merge moves Θ halfway to the uploaded θ, and
  an upload on version 0 arriving after version 1 is not stale (no damping though it is on)."""
  policy = policies.Policy(
      policies.MinQuorum(1),
      policies.NoGrace(),
      **EQUAL_MEAN,
      staleness_damping=True,
      anchor="global",
  )
  sync = _sync(policy, optimizers.sgd(0.5), learners=2)
  start = {E: PARAMS["embed"]["embedding"], W0: PARAMS["blocks"][0]["w"]}
  t0 = {E: _f([2.0, 2.0], [4.0, 4.0]), W0: _f([0.5, 0.0], [2.0, 0.25])}
  t1 = {E: _f([0.0, 1.0], [2.0, 3.0]), W0: _f([1.5, -1.0], [2.0, 1.25])}
  assert _merges(sync.handle(_up(0, 0, t0, base=0)))[0]["staleness"] == [0]
  one = {k: start[k] - 0.5 * (start[k] - t0[k]) for k in start}
  _assert_bits(sync.globals[0], one)
  assert _merges(sync.handle(_up(1, 0, t1, base=0)))[0]["staleness"] == [0]
  _assert_bits(sync.globals[0], {k: one[k] - 0.5 * (one[k] - t1[k]) for k in one})


@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_non_finite_payloads_never_reach_the_global_state(merged_once, bad_value):
  sync = merged_once
  poisoned = _f([1.0, bad_value], [0.0, 0.0])
  before = _snapshot(sync)
  good = _good(0, 1)
  for m in (0, 1):
    actions = sync.handle(_with_delta(_good(m, 1), {**good.delta, E: _raw_fp32(poisoned)}))
  rejects = records(actions)
  assert [(r["event"], r["learner"], r["reason"]) for r in rejects] == [
      ("reject", 0, "non-finite values"),
      ("reject", 1, "non-finite values"),
  ]
  assert not _of(actions, Send)
  _assert_unchanged(before, sync)
  assert sync.pending == [{}, {}]


def test_a_non_finite_upload_is_dropped_and_the_others_merge():
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=2)
  good = _good(1, 0)
  sync.handle(_with_delta(_good(0, 0), {**good.delta, W0: _raw_fp32(_f([np.nan, 0], [0, 0]))}))
  actions = sync.handle(good)
  assert [r["event"] for r in records(actions)] == ["reject", "merge"]
  assert _merges(actions)[0]["learners"] == [1]
  # SGD lr 1 on learner 1's Δ alone.
  np.testing.assert_array_equal(
      sync.globals[0][E], PARAMS["embed"]["embedding"] - _f([1.0, 0.5], [0.25, 0.0])
  )


def test_join_with_the_wrong_number_of_versions_is_rejected():
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=1)
  (refused,) = sync.handle(Join(7, 3.0, (0, 0, 0)))
  assert refused.code == Code.JOIN and "3 versions, expected 2" in refused.reason
  assert sync.live == {0}


# ---- downlink codec with error feedback ----


def test_fp4_downlink_learners_match_bitwise_and_the_residual_is_the_error():
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=2, codec="fp4")
  rng = np.random.default_rng(3)
  theta0 = {E: PARAMS["embed"]["embedding"], W0: PARAMS["blocks"][0]["w"]}
  copies = [dict(theta0), dict(theta0)]
  total = {k: np.zeros_like(v) for k, v in theta0.items()}  # Σ of the raw outer steps
  residual = {k: np.zeros_like(v) for k, v in theta0.items()}
  for v in range(1, 4):
    d = [
        {
            k: (rng.normal(size=x.shape) * 10.0 ** rng.integers(-3, 1, size=x.shape)).astype(F32)
            for k, x in theta0.items()
        }
        for _ in range(2)
    ]
    old = {k: x.copy() for k, x in sync.globals[0].items()}
    sync.handle(_up(0, 0, d[0], base=v - 1, time=v))
    actions = sync.handle(_up(1, 0, d[1], base=v - 1, time=v))
    # By hand: raw = −mean Δ + previous residual; the sync applies decode(encode(raw)).
    raw = {k: -merging_mean(d, k) + residual[k] for k in theta0}
    decoded = {k: compression.decode(compression.encode(raw[k], "fp4")) for k in theta0}
    _assert_bits(sync.globals[0], {k: old[k] + decoded[k] for k in theta0})
    residual = {k: raw[k] - decoded[k] for k in theta0}
    _assert_bits(sync.fragments[0].residual, residual)
    assert any(np.any(r != 0) for r in residual.values())  # fp4 did lose something
    for m, s in enumerate(_of(actions, Send)):
      assert s.update is not None and all(e.codec == "fp4" for e in s.update.values())
      assert s.nbytes == sum(compression.encoded_nbytes("fp4", x.size) for x in theta0.values())
      copies[m] = protocol.apply_send(copies[m], s)
      _assert_bits(copies[m], sync.globals[0])
    for k in theta0:
      total[k] += -merging_mean(d, k)
  # Error feedback: global + residual tracks Θ0 + Σ raw steps (only float rounding apart).
  for k in theta0:
    np.testing.assert_allclose(
        sync.globals[0][k] + residual[k], theta0[k] + total[k], rtol=0, atol=1e-5
    )


def merging_mean(d: list[dict], k: str) -> np.ndarray:
  """The synchronizer's equal-weight mean of two deltas, in its float32 arithmetic."""
  return d[0][k] * F32(0.5) + d[1][k] * F32(0.5)


def test_a_late_joiner_gets_the_full_fragment_then_updates():
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=1, codec="fp4")
  sync.handle(_good(0, 0))
  assert sync.versions == [1, 0]
  actions = sync.handle(Join(1, 2.0, (0, 0)))  # holds version 0 of fragment 0
  (send,) = _of(actions, Send)
  assert (send.learner, send.fragment, send.version) == (1, 0, 1)
  assert send.update is None
  _assert_bits(send.values, sync.globals[0])
  copy = protocol.apply_send({}, send)
  sync.handle(_good(0, 1))
  sends = _of(sync.handle(_good(1, 1)), Send)
  assert [s.update is not None for s in sends] == [True, True]
  _assert_bits(protocol.apply_send(copy, sends[1]), sync.globals[0])


def test_checksums_are_zlibs_crc32_of_the_header_and_payload():
  """Whichever library computes it (zlib-ng when installed), the value is zlib's CRC-32."""
  up = _good(1, 0)
  crc = 0
  for path in sorted(up.delta):
    e = up.delta[path]
    for part in (path.encode(), f"{e.codec}{e.shape}{e.block}".encode(), e.payload):
      crc = zlib.crc32(part, crc)
  header = struct.pack("<5q", up.fragment, up.base_generation, up.base_version, up.steps, up.tokens)
  assert up.checksum == zlib.crc32(header, crc) and up.checksum_ok()
  sync = _sync(policies.SYNCHRONOUS, optimizers.sgd(1.0), learners=2)
  assert sync.handle(up) == [] and sync.pending[0] == {1: up}  # accepted, waits for 0


def test_a_non_finite_upload_is_dropped_under_rda_too():
  """RDA's norms name the NaN upload (no outlier screen here); the other merges alone."""
  policy = policies.Policy(
      policies.AllLive(), policies.NoGrace(), weights=policies.EqualWeights(), merge=policies.RDA()
  )
  sync = _sync(policy, optimizers.sgd(1.0), learners=2)
  good = _good(1, 0)
  bad = _with_delta(_good(0, 0), {**good.delta, W0: _raw_fp32(_f([np.nan, 0], [0, 0]))})
  assert sync.handle(bad) == []
  actions = sync.handle(good)
  assert [(r["event"], r.get("code")) for r in records(actions)] == [
      ("reject", "non_finite"),
      ("merge", None),
  ]
  assert _merges(actions)[0]["learners"] == [1]
  # SGD lr 1 on learner 1's Δ alone (RDA of one delta is that delta, up to rounding).
  np.testing.assert_allclose(
      sync.globals[0][W0], PARAMS["blocks"][0]["w"] - _f([0.0, 1.0], [-1.0, 2.0]), rtol=1e-6
  )
