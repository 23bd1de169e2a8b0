"""Two synchronizer shards and two learner processes over gRPC; one shard is SIGKILLed mid-run.

The learners are given far more steps than the test lets them take: it waits for each event
(both learners training, the outage, the restarted shard merging) rather than racing the
learners to the end of a budget, then stops every process with SIGTERM. Their steps sleep to 4x
their own time from 2 s on (net_faults' pace): each wait counts steps and merges, and the learners
spinning at full speed through the shard's restart (imports, compile) were most of the test's CPU.
"""

import json
import os
import time

import numpy as np
from proc_helpers import read_jsonl, wait_for

from configs import shakespeare
from diloco.config import build
from diloco.outer import fragments
from diloco.outer.sync import ownership
from diloco.rpc import local
from experiments.studies import net_faults as nf

SPEC = "configs/shakespeare.py:mode=decoupled,runlocal,learners=2,steps=100000"
FOUR_FRAGMENTS = ("--config.outer.fragments=4", "--config.outer.fragment_kind=balanced")
OVERRIDES = (*FOUR_FRAGMENTS, *nf.RUN, *nf.PACE)  # (RUN: the defaults a chaos schedule changes)


def _merges(c, name: str, after: float = 0.0) -> list[dict]:
  rows = read_jsonl(os.path.join(c.workdir, name, "metrics.jsonl"))
  return [r for r in rows if r.get("event") == "merge" and r["wall_time"] > after]


def _step(c, m: int, before: float = float("inf")) -> int:
  rows = read_jsonl(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))
  return max([r["step"] for r in rows if r["time"] < before], default=0)


def _owned(shard: int) -> set[int]:
  """The fragments `shard` owns, as the processes cut them (the initial parameters' bytes)."""
  config = shakespeare.get_config(SPEC.split(":", 1)[1])
  config.outer.update(dict(fragments=4, fragment_kind="balanced", sync_shards=2))
  params0 = build.initial_params(config)
  frag = fragments.make("balanced", params0, 4)
  owner_of = ownership.owners([frag.nbytes(p, params0) for p in range(4)], 2)
  return set(ownership.owned(owner_of, shard))


def _holds_new(c, m: int, back_at: float, owned: set[int]) -> bool:
  """Whether learner m's last progress row holds every fragment of the restarted shard 1 (all of
  `owned` merged since the restart) at least at the version of its first merge since then."""
  first: dict[int, int] = {}
  for r in _merges(c, "sync1", back_at):
    first.setdefault(r["fragment"], r["version"])
  rows = read_jsonl(os.path.join(c.workdir, f"learner{m}", "progress.jsonl"))
  return set(first) == owned and all(rows[-1]["versions"][p] >= v for p, v in first.items())


def _summary(c, name: str) -> dict:
  with open(os.path.join(c.workdir, name, "summary.json")) as f:
    return json.load(f)


def test_a_killed_shard_holds_back_only_its_fragments_and_restarts(tmp_path):
  owned1 = _owned(1)
  c = local.LocalCluster(SPEC, 2, str(tmp_path), overrides=OVERRIDES, shards=2)
  try:
    c.start()
    wait_for(
        lambda: min(_step(c, 0), _step(c, 1)) >= 10 and len(_merges(c, "sync1")) >= 2,
        180,
        "the learners never trained with both shards merging",
    )
    c.kill("sync1")
    killed_at = time.time()
    at_kill = [_step(c, m) for m in (0, 1)]
    # The outage: shard 0 keeps merging and the learners keep stepping.
    wait_for(
        lambda: time.time() - killed_at > 3
        and len(_merges(c, "sync0", killed_at)) >= 5
        and all(_step(c, m) >= at_kill[m] + 10 for m in (0, 1)),
        120,
        "shard 0 or a learner stopped while shard 1 was down",
    )
    back_at = time.time()
    c.start_sync(shard=1)
    wait_for(
        lambda: {m for r in _merges(c, "sync1", back_at) for m in r["learners"]} == {0, 1},
        180,
        "shard 1 never merged both learners' uploads again",
    )
    wait_for(
        lambda: all(_holds_new(c, m, back_at, owned1) for m in (0, 1)),
        120,
        "shard 1's merges of each of its fragments never arrived",
    )
    ended_at = time.time()
  finally:
    c.stop(grace_s=20.0)
  codes = {n: p.returncode for n, p in c.procs.items()}
  # stop() sent SIGTERM to all: each saved its state and asked to be restarted (75)
  assert codes == {"sync0": 75, "sync1": 75, "learner0": 75, "learner1": 75}, codes

  outage = _merges(c, "sync0", killed_at)
  outage = [r for r in outage if r["wall_time"] < back_at]
  stepped = [_step(c, m, back_at) - at_kill[m] for m in (0, 1)]
  print(f"outage {back_at - killed_at:.1f} s: {len(outage)} merges of shard 0, steps {stepped}")
  assert len(outage) >= 5 and min(stepped) >= 10, (len(outage), stepped)
  shards = [_summary(c, f"sync{s}") for s in (0, 1)]
  owned = [s["owned"] for s in shards]
  assert sorted(owned[0] + owned[1]) == [0, 1, 2, 3] and not set(owned[0]) & set(owned[1])
  assert set(owned[1]) == owned1  # (what the wait above took for shard 1's)
  # Each shard merged only its own fragments; shard 1 restarted from its checkpoint as its own
  # generation 1 (shard 0 never restarted) and merged them again, with both learners.
  assert {r["fragment"] for r in _merges(c, "sync0")} <= set(owned[0])
  assert {r["fragment"] for r in _merges(c, "sync1")} <= set(owned[1])
  assert shards[0]["generation"] == 0 and shards[0]["restored_from"] is None
  assert shards[1]["generation"] == 1 and shards[1]["restored_from"] is not None
  assert shards[1]["restored_arrays_equal"]
  learners = [_summary(c, f"learner{m}") for m in (0, 1)]
  # Shard 1 was found down once by the kill (and perhaps once more by the final SIGTERMs).
  assert all(s["shards_down"][1] >= 1 for s in learners), learners
  for s in learners:  # what each learner holds of shard 1's fragments is generation 1's
    assert all(s["generations"][p] == 1 for p in owned[1]), s["generations"]
    assert all(s["generations"][p] == 0 for p in owned[0]), s["generations"]
  held = np.load(os.path.join(c.workdir, "learner0", "global_copy.npz"))
  assert all(np.isfinite(held[k]).all() for k in held.files)
  assert ended_at - killed_at < 300
