"""Synchronizer shards (`outer.sync_shards`): ownership, a shard's own state, and the same run.

Fragments merge independently, so S shards driven on the virtual clock give the merge log and the
final parameters of one synchronizer, bit for bit, for synchronous, streaming and decoupled
DiLoCo with a straggler and a learner crash. What legitimately differs, the adaptive grace window
(a shard's EMAs see only its own uploads), is tested for what holds instead.
"""

import json
import os

import numpy as np
import pytest

from configs import shakespeare
from diloco import train
from diloco.inner import stacked, step as step_lib
from diloco.outer import fragments, optimizers, policies, protocol
from diloco.outer.codecs import compression
from diloco.outer.sync import ownership
from diloco.outer.outcomes import Code
from diloco.outer.sync.sharded import ShardedSynchronizer
from diloco.outer.sync.synchronizer import Synchronizer


@pytest.fixture(scope="module", autouse=True)
def shared_compiled_steps():
  """The step builders memoised for this module: nine runs of one model compile once."""
  with pytest.MonkeyPatch.context() as mp:
    for mod, name in ((step_lib, "build_step_fns"), (stacked, "build_stacked_fns")):
      cache, build = {}, getattr(mod, name)

      def cached(*args, _cache=cache, _build=build):
        if args not in _cache:
          _cache[args] = _build(*args)
        return _cache[args]

      mp.setattr(mod, name, cached)
    yield


def test_ownership_balances_bytes_by_hand():
  # Bytes 10, 40, 30, 20: 40 -> shard 0, 30 -> 1, 20 -> 1 (30 < 40), 10 -> 0 (40 < 50).
  assert ownership.owners([10, 40, 30, 20], 2) == (0, 0, 1, 1)
  assert ownership.owners([10, 40, 30, 20], 1) == (0, 0, 0, 0)
  # Equal sizes: round robin by index (ties go to fewer fragments, then the lower shard).
  assert ownership.owners([8] * 5, 3) == (0, 1, 2, 0, 1)
  assert ownership.owned((0, 0, 1, 1), 1) == (2, 3)
  with pytest.raises(ValueError, match="sync_shards=3 exceeds outer.fragments=2"):
    ownership.owners([1, 1], 3)
  with pytest.raises(ValueError, match="positive integer"):
    ownership.owners([1, 1], 0)
  assert ownership.checked_owned(None, 3) == (0, 1, 2)
  for bad in ((2, 1), (1, 1), (), (0, 4)):
    with pytest.raises(ValueError, match="sorted, distinct and in 0..3"):
      ownership.checked_owned(bad, 4)


PARAMS = {f"w{i}": np.full(4, float(i), np.float32) for i in range(4)}
FRAG = fragments.balanced(PARAMS, 4)


def _shard(owned, grace=policies.NoGrace()):
  policy = policies.Policy(policies.MinQuorum(1), grace, policies.EqualWeights(), policies.Mean())
  return Synchronizer(PARAMS, FRAG, policy, optimizers.nesterov(0.5, 0.0), owned=owned)


def _upload(m, p, step_time=1.0, time=0.0):
  delta = compression.encode_tree({k: np.ones(4, np.float32) for k in FRAG.paths[p]}, "fp32")
  return protocol.Upload(m, p, 0, delta, 1, 8, time, time, step_time)


def test_a_shard_holds_and_merges_only_its_own_fragments():
  shard = _shard((1, 3))
  assert sorted(shard.fragments) == [1, 3] and sorted(shard.global_params()) == ["w1", "w3"]
  shard.handle(protocol.Join(0, 0.0, (0, 0, 0, 0)))
  refused = shard.handle(_upload(0, 2))
  assert [(a.code, a.reason) for a in refused] == [
      (Code.UNKNOWN_FRAGMENT, "fragment 2 is owned by another synchronizer shard")
  ]
  merged = shard.handle(_upload(0, 3))
  # Delta 1 at lr 0.5, no momentum: w3 = 3 - 0.5 = 2.5; version 1 of fragment 3 only.
  np.testing.assert_array_equal(shard.globals[3]["w3"], np.full(4, 2.5, np.float32))
  assert shard.versions == [0, 0, 0, 1] and shard.merges == 1
  assert [a.fragment for a in merged if isinstance(a, protocol.Send)] == [3]
  state = shard.state_dict()
  assert state["meta"]["owned"] == [1, 3] and "global.0.0" not in state["arrays"]
  other = _shard((0, 2))
  with pytest.raises(
      ValueError, match=r"state of fragments \[1, 3\], but this shard owns \[0, 2\]"
  ):
    other.load_state_dict(state)
  # One synchronizer owning everything writes the state it wrote before shards existed.
  assert "owned" not in _shard(None).state_dict()["meta"]


def test_the_joint_state_of_shards_restarts_each_shard():
  shards = [_shard((0, 1)), _shard((2, 3))]
  sync = ShardedSynchronizer(shards, (0, 0, 1, 1))
  for m in (0, 1):
    sync.handle(protocol.Join(m, 0.0, (0, 0, 0, 0)))
  sync.handle(_upload(0, 2))
  assert sync.versions == [0, 0, 1, 0] and sync.merges == 1
  state, digest = sync.state_dict(), sync.digest()
  sync.handle(_upload(1, 0))
  assert sync.versions == [1, 0, 1, 0]
  sync.restart(state, 1)  # every shard back to the saved state, generation 1
  assert sync.versions == [0, 0, 1, 0] and [s.generation for s in shards] == [1, 1]
  assert sync.digest() != digest  # (the generation is part of the state)
  with pytest.raises(ValueError, match="owns fragments"):
    ShardedSynchronizer(shards, (0, 1, 0, 1))


def test_a_shards_grace_window_reads_only_its_own_uploads():
  """What differs from one synchronizer, and why: each shard's EMA of step times is fed by the
  uploads of its own fragments (separate processes share nothing)."""
  grace = policies.AdaptiveGrace(1.0, 2)
  whole, shards = _shard(None, grace), [_shard((0, 1), grace), _shard((2, 3), grace)]
  sync = ShardedSynchronizer(shards, (0, 0, 1, 1))
  for s in (whole, sync):
    for m in (0, 1):
      s.handle(protocol.Join(m, 0.0, (0, 0, 0, 0)))
  for p, step_time in ((0, 1.0), (2, 3.0), (1, 1.0)):
    whole.handle(_upload(0, p, step_time))
    sync.handle(_upload(0, p, step_time))
  # EMA decay 0.9: whole 1, then 0.9*1 + 0.1*3 = 1.2, then 0.9*1.2 + 0.1*1 = 1.18.
  assert whole.ema_step.value == pytest.approx(1.18)
  assert shards[0].ema_step.value == pytest.approx(1.0)  # 1, then 1
  assert shards[1].ema_step.value == pytest.approx(3.0)


CASES = {
    "diloco": {},
    "streaming": {},
    # Decoupled DiLoCo without the rules that read other fragments' history: the adaptive
    # grace window (see the test above), clipping against the outlier screen's norms, whose
    # pooled history (any fragment's) a shard keeps of its own fragments, and the period
    # clock's pace, which a shard measures from its own fragments' uploads (a scheduled time a
    # few microseconds off one synchronizer's can take or miss an upload arriving then).
    "decoupled": {
        "outer.grace_gamma": 0.0,
        "outer.clip_factor": 0.0,
        "outer.merge_clock": "arrival",
    },
}


def _run(tmp_path, mode: str, shards: int) -> tuple[dict, list[dict]]:
  c = shakespeare.get_config(
      f"runlocal,mode={mode},learners=3,chaos=crash learner 2 at t=9.5s for 6s"
  )
  c.progress_bar = False
  c.update_from_flattened_dict(
      {
          "steps": 24,
          "sim.speeds": "1,1,2",  # learner 2 is a straggler
          "outer.fragments": 4,
          "outer.fragment_kind": "balanced",
          "outer.sync_shards": shards,
          "eval_every": 100,
          **CASES[mode],
      }
  )
  workdir = str(tmp_path / f"{mode}_{shards}")
  summary = train.train_and_evaluate(c, workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  # A merge's `period_s` is the merge clock's reading of the learners' pace, which each shard
  # measures from its own fragments' uploads, as its grace EMAs (outer/sync/sharded.py): under the
  # arrival clock it decides nothing, so the merges compared are the rest of each record.
  merges = [
      {k: v for k, v in r.items() if k != "period_s"} for r in rows if r.get("event") == "merge"
  ]
  return summary, sorted(merges, key=lambda r: (r["time"], r["fragment"]))


@pytest.mark.parametrize("mode", sorted(CASES))
def test_shards_give_one_synchronizers_merges_and_bits(tmp_path, mode):
  one, log1 = _run(tmp_path, mode, 1)
  assert one["faults"] == {"crash": 1} and one["rejoins"] == 1
  assert len(log1) >= 8 and {r["fragment"] for r in log1} == {0, 1, 2, 3}
  for shards in (2, 3):
    s, log = _run(tmp_path, mode, shards)
    assert log == log1, f"S={shards}: merge log differs"
    assert s["params_sha256"] == one["params_sha256"], f"S={shards}"
    assert s["learner_decisions"] == one["learner_decisions"], f"S={shards}"


def test_one_shard_crashes_alone_on_the_virtual_clock(tmp_path):
  """Shard 1 of 2 loses its memory at t=8 s for 6 s: shard 0 merges through the outage, shard 1
  comes back from the newest checkpoint as its own generation 1 and merges again."""
  c = shakespeare.get_config(
      "runlocal,mode=decoupled,learners=2,chaos=sync_crash shard 1 at t=8s for 6s"
  )
  c.progress_bar = False
  c.update_from_flattened_dict(
      {"steps": 30, "outer.fragments": 4, "outer.fragment_kind": "balanced", "outer.sync_shards": 2}
  )
  summary = train.train_and_evaluate(c, str(tmp_path / "run"))
  with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  owned = ownership.owned(build_owner_of(c), 1)
  merges = [r for r in rows if r.get("event") == "merge"]
  during = [r for r in merges if 8.0 <= r["time"] < 14.0]
  assert during and all(r["fragment"] not in owned for r in during), during
  after = [r for r in merges if r["time"] >= 14.0 and r["fragment"] in owned]
  assert after, "shard 1 never merged again"
  restarts = [r for r in rows if r.get("event") == "sync_restart"]
  assert [(r["shard"], r["generation"]) for r in restarts] == [(1, 1)]
  assert summary["synchronizer_restarts"] == 1 and summary["faults"] == {"sync_crash": 1}
  assert summary["chaos"]["global_params_finite"]
  with pytest.raises(ValueError, match="has no shard 2 to crash alone"):
    bad = shakespeare.get_config("runlocal,mode=decoupled,chaos=sync_crash shard 2 at t=8s for 6s")
    bad.outer.sync_shards, bad.outer.fragments, bad.outer.fragment_kind = 2, 4, "balanced"
    train.prepare(bad)


def build_owner_of(config) -> tuple[int, ...]:
  from diloco.config import build  # pylint: disable=import-outside-toplevel

  return build.synchronizer_only(config).owner_of
