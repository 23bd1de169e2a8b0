"""A hypothesis rule-based state machine of the synchronizer and its learners' copies.

Random interleavings of joins, leaves, valid uploads, bad uploads (corrupt, misshapen, wrong
paths, non-finite, huge, stale, duplicated, unknown fragment, no progress), ticks, checkpoints and
restarts, under a random policy (quorum, grace, weighting, merge, damping, outlier screen and clip,
outer optimizer, uplink and downlink codecs). After every step: nothing raised; global values and
optimizer state are finite; versions only grow within a generation; an event answered only with
rejections left the state digest as it was (uploads rejected at merge time may have fed the timing
EMAs on arrival, so for those the arrays and versions are compared); every live learner holding
a fragment's current version holds it bit for bit; every Send passes its checksum and applies to
the version the learner holds.

tests/test_sync_properties.py runs it a few hundred times; scripts/fuzz_sync.py for long runs.
"""

import collections
import dataclasses
import hashlib

import jax
import numpy as np
import hypothesis
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from diloco.outer import fragments, integrity, optimizers, policies, protocol
from diloco.outer.codecs import compression
from diloco.outer.sync import merge_clock
from diloco.outer.protocol import Join, Leave, Log, Refused, Send, Tick, Upload, records
from diloco.outer.sync.synchronizer import Synchronizer

F32 = np.float32
PARAMS = {
    "embed": {"embedding": np.arange(8, dtype=F32).reshape(4, 2) / 8},
    "blocks": {
        0: {"w": np.linspace(-1, 1, 6, dtype=F32).reshape(3, 2)},
        1: {"w": np.linspace(0, 2, 5, dtype=F32)},
    },
    "final_norm": {"scale": np.ones(2, F32)},
}
FRAG = fragments.strided(PARAMS, 2)
LEARNERS = 3
BAD_KINDS = (
    "corrupt",
    "misshapen",
    "paths",
    "nan",
    "inf",
    "huge",
    "near_max",
    "stale",
    "duplicate",
    "unknown_fragment",
    "no_progress",
)
MERGE_TIME_CODES = ("non_finite", "outlier", "non_finite_merge")
COUNTS: collections.Counter = collections.Counter()  # events handled, merges, rejections by code

quorums = st.one_of(
    st.just(policies.AllMembers()),
    st.just(policies.AllLive()),
    st.integers(1, LEARNERS).map(policies.MinQuorum),
)
graces = st.one_of(
    st.just(policies.NoGrace()),
    st.builds(policies.AdaptiveGrace, st.floats(0.1, 1.0), st.integers(0, 3)),
)
policy_st = st.builds(
    policies.Policy,
    quorums,
    graces,
    st.sampled_from([policies.EqualWeights(), policies.TokenWeights()]),
    st.sampled_from([policies.Mean(), policies.RDA()]),
    max_staleness=st.integers(1, 6),
    staleness_damping=st.booleans(),
    merge_clock=st.sampled_from(merge_clock.CLOCKS),
    merge_scale=st.sampled_from(merge_clock.SCALES),
    clock_steps=st.integers(1, 4),
)
screen_st = st.one_of(
    st.none(),
    st.builds(
        integrity.OutlierScreen,
        st.sampled_from([4.0, 100.0]),
        st.integers(1, 4),
        st.integers(4, 8),
        clip_factor=st.sampled_from([0.0, 2.0]),
    ),
)
tx_st = st.one_of(
    st.builds(optimizers.nesterov, st.sampled_from([0.4, 1.0]), st.sampled_from([0.0, 0.9])),
    st.builds(optimizers.sgd, st.sampled_from([0.5, 1.0])),
    st.builds(optimizers.delayed_nesterov, st.just(0.7), st.just(0.9), st.integers(1, 3)),
)


def _core(sync: Synchronizer) -> str:
  """sha256 of the arrays of the state and the versions (not the EMAs or norm history)."""
  h = hashlib.sha256()
  arrays = sync.state_dict()["arrays"]
  for k in sorted(arrays):
    h.update(k.encode() + np.ascontiguousarray(arrays[k]).tobytes())
  h.update(repr(sync.versions).encode())
  return h.hexdigest()


class SyncMachine(RuleBasedStateMachine):
  """The synchronizer, driven as a runtime would, with each learner's copy of the fragments."""

  @initialize(
      policy=policy_st,
      tx=tx_st,
      screen=screen_st,
      downlink=st.sampled_from(compression.CODECS),
      uplink=st.sampled_from(compression.CODECS),
  )
  def setup(self, policy, tx, screen, downlink, uplink):
    if not isinstance(tx, optimizers.SGD):  # a share of a step is Nesterov's or SGD's (refused)
      policy = dataclasses.replace(policy, merge_scale="one")
    self.args = (policy, tx, downlink)
    self.screen, self.uplink = screen, uplink
    self.sync = Synchronizer(PARAMS, FRAG, policy, tx, downlink, screen=screen)
    self.now = 0.0
    # learner -> per fragment (version, generation, values) or None; who the runtime thinks is live
    self.copies: dict[int, list] = {m: [None] * FRAG.num_fragments for m in range(LEARNERS)}
    self.live: set[int] = set()
    self.last_upload: dict[int, Upload] = {}
    self.floor = list(self.sync.versions)  # versions may only grow from here in this generation
    self.checkpoint = None
    self.rng = np.random.default_rng(0)
    for m in range(LEARNERS):  # as a run starts: everyone joins holding version 0
      self.copies[m] = [
          (0, 0, {k: v.copy() for k, v in g.items()}) for g in self.sync.globals.values()
      ]
      self.live.add(m)
      self._handle(Join(m, 0.0, (0,) * FRAG.num_fragments))

  # ---- driving ----

  def _handle(self, event) -> list:
    actions = self.sync.handle(event)
    COUNTS["events"] += 1
    for a in actions:
      if isinstance(a, Send):
        self._deliver(a)
      elif isinstance(a, (Log, Refused)) and a.record["event"] in ("merge", "reject"):
        what = a.record["event"] + (
            f": {a.record['code']}" if a.record["event"] == "reject" else ""
        )
        COUNTS[what] += 1
        hypothesis.event(what)
    return actions

  def _deliver(self, send: Send) -> None:
    assert send.checksum_ok(), send
    held = self.copies[send.learner][send.fragment]
    if send.update is not None:
      assert (
          held is not None and held[0] == send.version - 1 and held[1] == send.base_generation
      ), f"update to v{send.version} for learner {send.learner} holding {held and held[:2]}"
      values = protocol.apply_send(held[2], send)
    else:
      values = protocol.apply_send({}, send)
    self.copies[send.learner][send.fragment] = (send.version, send.generation, values)

  def _tick_time(self, dt: float) -> float:
    self.now += dt
    return self.now

  def _delta(self, p: int, scale: float) -> dict:
    shapes = {k: v.shape for k, v in self.sync.globals[p].items()}
    return {k: (self.rng.standard_normal(s) * scale).astype(F32) for k, s in shapes.items()}

  def _upload(self, m, p, delta, steps=1, tokens=64, base=None, codec=None, **kw) -> Upload:
    v, g, _ = self.copies[m][p]
    t = self._tick_time(0.5)
    if codec == "raw":  # fp32 bytes past the encoder's finite check, as a faulty learner sends
      payload = {
          k: compression.Encoded("fp32", x.shape, x.tobytes(), compression.DEFAULT_BLOCK)
          for k, x in delta.items()
      }
    else:
      payload = compression.encode_tree(delta, codec or self.uplink)
    return Upload(
        m,
        p,
        v if base is None else base,
        payload,
        steps,
        tokens,
        t,
        t - 0.1,
        1.0,
        base_generation=g,
        **kw,
    )

  def _holds(self, m: int, p: int) -> bool:
    return m in self.live and self.copies[m][p] is not None

  # ---- rules ----

  @rule(m=st.integers(0, LEARNERS - 1))
  def join(self, m):
    held = self.copies[m]
    versions = tuple(-1 if h is None else h[0] for h in held)
    gens = tuple(self.sync.generation if h is None else h[1] for h in held)
    self.live.add(m)
    self._handle(Join(m, self._tick_time(0.1), versions, gens))

  @precondition(lambda self: self.live)
  @rule(data=st.data())
  def leave(self, data):
    m = data.draw(st.sampled_from(sorted(self.live)))
    self.live.discard(m)
    self._handle(Leave(m, self._tick_time(0.1)))

  @rule(
      m=st.integers(0, LEARNERS - 1),
      p=st.integers(0, FRAG.num_fragments - 1),
      scale=st.sampled_from([1e-3, 0.1, 1.0]),
      steps=st.integers(1, 4),
  )
  def upload(self, m, p, scale, steps):
    if not self._holds(m, p):
      return
    up = self._upload(m, p, self._delta(p, scale), steps=steps, tokens=32 * steps)
    self.last_upload[m] = up
    self._check_rejection_only(up)

  @rule(
      p=st.integers(0, FRAG.num_fragments - 1),
      scale=st.sampled_from([1e-3, 0.1, 1.0, float(np.finfo(F32).max) / 3]),
  )
  def round(self, p, scale):
    """Every live learner holding p uploads it in turn, as a synchronous round does (the last
    scale is finite but can overflow float32 in a merge through the momentum)."""
    for m in sorted(self.live):
      if self._holds(m, p):
        delta = {k: np.full(v.shape, scale, F32) for k, v in self.sync.globals[p].items()}
        if scale < 10:
          delta = self._delta(p, scale)
        up = self._upload(m, p, delta, steps=2, tokens=64, codec="raw" if scale > 10 else None)
        self.last_upload[m] = up
        self._check_rejection_only(up)

  @rule(
      m=st.integers(0, LEARNERS - 1),
      p=st.integers(0, FRAG.num_fragments - 1),
      kind=st.sampled_from(BAD_KINDS),
  )
  def bad_upload(self, m, p, kind):
    if not self._holds(m, p):
      return
    delta = self._delta(p, 0.1)
    k0 = sorted(delta)[0]
    if kind == "duplicate":
      if m not in self.last_upload:
        return
      up = dataclasses.replace(self.last_upload[m], time=self._tick_time(0.5))
    elif kind == "corrupt":
      good = self._upload(m, p, delta)
      up = dataclasses.replace(good, checksum=good.checksum ^ 1)
    elif kind == "misshapen":
      up = self._upload(m, p, {**delta, k0: np.zeros(delta[k0].size + 1, F32)}, codec="fp32")
    elif kind == "paths":
      up = self._upload(m, p, {**delta, "not/a/path": np.zeros(2, F32)}, codec="fp32")
    elif kind in ("nan", "inf"):
      delta[k0].flat[0] = np.nan if kind == "nan" else np.inf
      up = self._upload(m, p, delta, codec="raw")
    elif kind == "huge":
      up = self._upload(m, p, {k: v * F32(1e30) for k, v in delta.items()}, codec="raw")
    elif kind == "near_max":  # finite, but a merge through the momentum may overflow float32
      up = self._upload(
          m,
          p,
          {k: np.full(v.shape, np.finfo(F32).max / 3, F32) for k, v in delta.items()},
          codec="raw",
      )
    elif kind == "stale":  # a base version this generation knows, but too far behind
      base = self.sync.versions[p] - self.sync.policy.max_staleness - 1
      if base < 0 or self.copies[m][p][1] != self.sync.generation:
        return
      up = self._upload(m, p, delta, base=base)
    elif kind == "unknown_fragment":
      up = dataclasses.replace(self._upload(m, p, delta), fragment=7, checksum=None)
    else:  # no_progress
      up = self._upload(m, p, delta, steps=0, tokens=0)
    self._check_rejection_only(up)

  @rule(dt=st.sampled_from([0.05, 0.5, 3.0]))
  def tick(self, dt):
    self._handle(Tick(self._tick_time(dt)))

  @rule()
  def checkpoint(self):
    self.checkpoint = (self.sync.state_dict(), self.sync.digest())

  @precondition(lambda self: self.checkpoint is not None)
  @rule()
  def restart(self):
    """The synchronizer crashes and restarts from its last checkpoint; learners must rejoin."""
    COUNTS["restarts"] += 1
    state, _ = self.checkpoint
    policy, tx, downlink = self.args
    fresh = Synchronizer(PARAMS, FRAG, policy, tx, downlink, screen=self.screen)
    fresh.restart(state, self.sync.generation + 1)
    self.sync, self.live, self.last_upload = fresh, set(), {}
    self.floor = list(fresh.versions)

  # ---- checks ----

  def _check_rejection_only(self, up: Upload) -> None:
    """An upload answered only by its own rejection changes nothing; one whose rejection lets a
    round go on (the round stops waiting for it) and ends with no merge changes no array."""
    before, core = self.sync.digest(), _core(self.sync)
    actions = self._handle(up)
    logs = records(actions)
    if any(r["event"] == "merge" for r in logs):
      return
    if len(actions) == 1 and logs and logs[0]["event"] == "reject":
      if logs[0]["code"] not in MERGE_TIME_CODES:
        assert self.sync.digest() == before, f"rejected ({logs[0]['code']}) but the state changed"
    assert _core(self.sync) == core, f"no merge, but the arrays or versions changed: {logs}"

  @invariant()
  def finite_state(self):
    for g in self.sync.globals.values():
      assert all(np.isfinite(v).all() for v in g.values())
    for s in (f.opt_state for f in self.sync.fragments.values()):
      for x in jax.tree.leaves(s):
        x = np.asarray(x)
        assert not np.issubdtype(x.dtype, np.floating) or np.isfinite(x).all()

  @invariant()
  def versions_only_grow(self):
    assert all(v >= f for v, f in zip(self.sync.versions, self.floor)), (
        self.sync.versions,
        self.floor,
    )
    self.floor = list(self.sync.versions)

  @invariant()
  def learners_hold_the_global_fragments(self):
    for m in self.live:
      for p, held in enumerate(self.copies[m]):
        if held and held[0] == self.sync.versions[p] and held[1] == self.sync.generation:
          for k, v in self.sync.globals[p].items():
            assert np.array_equal(held[2][k].view(np.uint32), v.view(np.uint32)), (m, p, k)
