"""Decoupled DiLoCo on the tiny model: determinism, the synchronous limit, and a slow learner.

Compiled step functions are shared between the runs of this module (pure functions of the model,
optimizer and mesh), which only saves compile time.
"""

import os
import random
import threading

import numpy as np

from configs import shakespeare
from diloco import metrics, train
from diloco.config import build
from diloco.outer import protocol
from diloco.outer.codecs import compression
from diloco.runtime import learner_loop


def _config(arg: str, **overrides):
  """shakespeare.get_config(arg) with dotted-key overrides (`outer__lr=1.0` is outer.lr)."""
  c = shakespeare.get_config(arg)
  c.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
  return c


def _run(config, workdir: str) -> tuple[dict, dict[str, np.ndarray], list[dict]]:
  """Summary, the synchronizer's final global parameters, and the merge records."""
  parts = build.local_learners(config)
  summary = train.train_and_evaluate(config, workdir, parts=parts)
  rows = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
  return summary, parts.syncs[0].global_params(), [r for r in rows if r.get("event") == "merge"]


def _same_bits(a: dict, b: dict) -> bool:
  return sorted(a) == sorted(b) and all(
      np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a
  )


def test_same_seed_same_bits_other_seed_other_run(tmp_path):
  """Decoupled runlocal (K=1, grace, token weights, RDA, fp4, τ=2) with jittered step times."""
  cfg = lambda seed: _config("runlocal,mode=decoupled", seed=seed, sim__step_jitter=0.3)
  a = _run(cfg(0), str(tmp_path / "a"))
  b = _run(cfg(0), str(tmp_path / "b"))
  c = _run(cfg(1), str(tmp_path / "c"))
  assert a[0]["merges"] >= 20 and len(a[2]) == a[0]["merges"]
  assert _same_bits(a[1], b[1])
  assert a[2] == b[2]  # every merge record: time, learners, weights, staleness, grace
  for key in ("eval_loss", "sim_time_s", "bytes_sent", "bytes_received", "goodput"):
    assert a[0][key] == b[0][key], key
  assert not _same_bits(a[1], c[1])
  assert max(float(np.max(np.abs(a[1][k] - c[1][k]))) for k in a[1]) > 0.01
  assert a[2] != c[2]
  # The jitter did reorder things: quorum-1 merges with one learner, and some with both.
  assert {r["quorum"] for r in a[2]} == {1, 2}


def test_decoupled_code_path_in_the_synchronous_limit_is_synchronous_diloco(tmp_path):
  """Quorum = all on arrival, no grace, equal weights, mean, τ=0, no latency, equal speeds:
  non-blocking learners (the decoupled path) do exactly what blocking ones do."""
  limit = dict(
      outer__merge_clock="arrival",
      outer__quorum=0,
      outer__grace_gamma=0.0,
      outer__weighting="equal",
      outer__merge="mean",
      outer__overlap=0,
      sim__latency_s=0.0,
      sim__bandwidth_gbps=float("inf"),
  )
  decoupled = _run(
      _config("runlocal,mode=decoupled", outer__blocking=False, **limit),
      str(tmp_path / "decoupled"),
  )
  synchronous = _run(
      _config("runlocal,mode=decoupled", outer__blocking=True, **limit),
      str(tmp_path / "synchronous"),
  )
  assert _same_bits(decoupled[1], synchronous[1])
  assert decoupled[2] == synchronous[2]
  assert decoupled[0]["merges"] == 40 // 8 * 4  # every fragment once per H=8 steps
  assert all(r["quorum"] == 2 and r["staleness"] == [0, 0] for r in decoupled[2])
  for key in ("eval_loss", "sim_time_s", "bytes_sent"):
    assert decoupled[0][key] == synchronous[0][key], key


def test_a_three_times_slower_learner_does_not_hold_the_others_back(tmp_path):
  """Four islands of two devices, learner 3 at a third of the speed: K=1 against synchronous
  DiLoCo with the same speeds and the same token budget (40 steps × 4 learners)."""
  slow = dict(sim__speeds="1,1,1,3")
  dec, _, dec_merges = _run(
      _config("runlocal,mode=decoupled,learners=4", **slow), str(tmp_path / "decoupled")
  )
  syn, _, _ = _run(_config("runlocal,mode=diloco,learners=4", **slow), str(tmp_path / "diloco"))
  fast, slowest = dec["per_learner"][:3], dec["per_learner"][3]
  # The slow learner takes part in fewer merges and does about a third of a fast one's steps.
  assert slowest["merges_joined"] < min(f["merges_joined"] for f in fast)
  assert all(f["steps"] >= 2.5 * slowest["steps"] for f in fast)
  assert sum(r["steps"] for r in dec["per_learner"]) == 40 * 4
  # Fast learners never wait; in synchronous DiLoCo they wait for the slow one about 2/3 of
  # the time (3 s per step of its, 1 s of theirs).
  assert all(f["idle_s"] <= 0.01 * dec["sim_time_s"] for f in fast)
  assert all(f["idle_s"] >= 0.5 * syn["sim_time_s"] for f in syn["per_learner"][:3])
  # The budget is spent at (1+1+1+1/3) steps/s instead of 4/3: about 0.4 of the time.
  assert dec["sim_time_s"] < 0.5 * syn["sim_time_s"]
  assert dec["goodput"] > 0.9 > syn["goodput"]
  assert slowest["merges_joined"] > 0 and dec["mean_quorum"] < 4
  assert slowest["merges_joined"] == sum(3 in r["learners"] for r in dec_merges)


def test_a_rebase_keeps_what_a_learner_trained_after_its_merged_upload():
  """Issue 49, point 3: learner 0 uploaded fragment 0 after 2 steps (u0: its merge was lost when
  the synchronizer restarted), again after 3 (u1: merged, the merge never came back) and after 5
  (u2: refused as a duplicate of that base; u3, computed then, was never sent). Taking the merged version with `rebase` keeps the 2
  steps after u1: θ ← Θ_new + ((θ − Θ_old) + decode(u1)), counters at 2; a plain receive
  (outer.alpha = 0, delivery replace) drops them."""
  config = _config("runlocal,mode=decoupled", outer__delivery="replace")
  parts = build.local_learners(config)
  learner, batches = parts.make_learner(0, holds_start=True), parts.islands[0].data.train_iter
  ups = []
  for t, steps in enumerate((2, 1, 2)):
    for _ in range(steps):
      learner.step(next(batches))
    ups.append(learner.upload(0, sent_time=float(t), arrival_time=0.0, step_time=0.0))
  assert [u.steps for u in ups] == [2, 3, 5] and learner.c_steps[0] == 5
  learner.not_merged(0, sent_time=2.0)  # u2
  # u3 is computed, then dropped unsent (the loop's outbox when the link went down): not merged.
  ups.append(learner.upload(0, sent_time=3.0, arrival_time=0.0, step_time=0.0))
  loop = learner_loop._LearnerLoop(learner, None, threading.Event(), 1.0, 1.0, random.Random(0))
  loop._send([ups[-1]])  # (not joined)
  assert learner.sent[0] == ups[:2]
  old, now = learner.global_copy[0], learner._read(0)
  merged = {k: v - 1.0 for k, v in old.items()}  # Θ_new: any values of version 1
  send = protocol.Send(0, 0, 1, values=merged)
  plain = parts.make_learner(0, holds_start=True)
  plain.state, plain.c_steps = learner.state, list(learner.c_steps)
  plain.receive(send)
  assert all(np.array_equal(plain._read(0)[k], merged[k]) for k in merged)  # progress dropped
  learner.receive(send, rebase=True)
  sent = compression.decode_tree(ups[1].delta)
  kept = {k: merged[k] + ((now[k] - old[k]) + sent[k]) for k in merged}
  assert _same_bits(learner._read(0), kept)
  assert learner.c_steps[0] == 2 and learner.c_tokens[0] == 2 * learner.tokens_per_step
  assert learner.versions[0] == 1 and learner.sent == {}


def test_a_send_older_than_the_version_held_becomes_the_base_and_keeps_the_parameters():
  """Issue 49, point 3: a synchronizer saving every N > 1 merges restarted without merge 2,
  which learner 0 holds; its Join is answered with version 1 of the new generation. The learner
  keeps θ (merge 2 and its own 3 steps since), takes version 1 as its base, and its next upload
  carries both (Θ_1 − θ); before, it replaced θ with Θ_1."""
  config = _config("runlocal,mode=decoupled")
  parts = build.local_learners(config)
  learner, batches = parts.make_learner(0, holds_start=True), parts.islands[0].data.train_iter
  two = {k: v - 0.5 for k, v in learner.global_copy[0].items()}
  learner.receive(protocol.Send(0, 0, 2, values=two))  # (as a late joiner gets version 2)
  for _ in range(3):
    learner.step(next(batches))
  before = learner._read(0)
  one = {k: v + 0.25 for k, v in two.items()}
  learner.receive(protocol.Send(0, 0, 1, values=one, generation=1))
  assert _same_bits(learner._read(0), before) and _same_bits(learner.global_copy[0], one)
  assert (learner.versions[0], learner.generations[0], learner.c_steps[0]) == (1, 1, 3)
  up = learner.upload(0, sent_time=0.0, arrival_time=0.0, step_time=0.0)
  assert (up.base_version, up.base_generation, up.steps) == (1, 1, 3)
