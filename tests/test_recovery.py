"""Recovery, in the style of torchft's recovery tests: inject a fault at a chosen moment of a real
(tiny) run, then check what every survivor holds.

Runs are Decoupled DiLoCo runlocal on four learners (40 steps of 1 simulated second each, H=8, P=4,
no jitter unless stated), with checkpoints on as the `chaos=` variant sets them: learners every 8
steps, the synchronizer every 16 merges. A `Watch` records the synchronizer's global fragments at
every version it ever had, its checkpoints and restores (digests), and what a crashed learner holds
the moment its rejoin completes. Compiled step functions are shared between the runs of this
module (they are pure functions of the model, optimizer and mesh), which only saves compile time.
"""

import contextlib
import json
import math
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from configs import chaos_suite as suite_config
from configs import shakespeare
from diloco import metrics, train
from diloco.chaos import schedule as chaos
from diloco.inner import manifest, step as step_lib
from diloco.outer import fragments, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.protocol import Join, Upload
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.recovery import rejoin, sync_checkpoint
from diloco.runtime import virtual, virtual_chaos
from experiments.studies import chaos_suite

BASE = "runlocal,mode=decoupled,learners=4"


@pytest.fixture(scope="module", autouse=True)
def shared_compiled_steps():
  """build_step_fns memoised by (model config, optimizer config, mesh) for this module."""
  cache = {}
  build = step_lib.build_step_fns

  def cached(model_cfg, opt_cfg, mesh):
    key = (model_cfg, opt_cfg, mesh)
    if key not in cache:
      cache[key] = build(model_cfg, opt_cfg, mesh)
    return cache[key]

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(step_lib, "build_step_fns", cached)
    yield


def _config(schedule: str, **overrides):
  c = shakespeare.get_config(f"{BASE},chaos={schedule}")
  c.progress_bar = False
  c.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
  return c


class Watch:
  """Records what happens inside runs (without changing it): `run`, or `with watch.patched()`."""

  def __init__(self):
    self.history: dict[tuple[int, int, int], dict] = {}  # (generation, p, version) -> Θ_p
    self.saves: list[tuple[float, int, str]] = []  # (sim time, merges, digest) completed
    self.interrupted: list[int] = []  # merges of the saves a crash cut short
    self.restored: list[str] = []  # digest of each restored synchronizer, before it resumes
    self.rejoins: list[dict] = []
    self.runtime: virtual.VirtualRuntime | None = None  # the run's (one with faults)

  def run(self, config, workdir: str) -> "Watch":
    with self.patched():
      self.summary = train.train_and_evaluate(config, workdir)
    self.rows = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
    self.merges = [r for r in self.rows if r.get("event") == "merge"]
    self.evals = [r for r in self.rows if "eval_loss" in r]
    return self

  @contextlib.contextmanager
  def patched(self):
    watch = self

    sync_init, sync_merge, sync_load, sync_restart = (
        Synchronizer.__init__,
        Synchronizer._merge,
        Synchronizer.load_state_dict,
        Synchronizer.restart,
    )

    def remember(sync):
      for p, g in sync.globals.items():
        watch.history[(sync.generation, p, sync.versions[p])] = {k: v.copy() for k, v in g.items()}

    def recorded_sync_init(sync, *args, **kwargs):
      sync_init(sync, *args, **kwargs)
      remember(sync)

    def recorded_merge(sync, p, now):
      actions = sync_merge(sync, p, now)
      remember(sync)
      return actions

    def recorded_load(sync, state):
      sync_load(sync, state)
      watch.restored.append(sync.digest())

    def recorded_restart(sync, state, generation):
      sync_restart(sync, state, generation)
      remember(sync)

    save_sync, rejoined, bind = (
        rejoin.Recovery.save_sync,
        virtual_chaos.Chaos._rejoined,
        virtual_chaos.Chaos.bind,
    )

    def recorded_save(rec, sync, force=False, interrupt=False):
      now = watch.runtime.now if watch.runtime is not None else 0.0
      try:
        saved = save_sync(rec, sync, force=force, interrupt=interrupt)
      except sync_checkpoint.SimulatedCrash:
        watch.interrupted.append(sync.merges)
        raise
      if saved:
        watch.saves.append((now, sync.merges, sync.digest()))
      return saved

    def recorded_rejoined(component, m):
      runtime = component.runtime
      learner = runtime.learners[m]
      watch.rejoins.append(
          {
              "learner": m,
              "time": runtime.now,
              "steps": learner.steps,
              "versions": list(learner.versions),
              "generations": list(learner.generations),
              "global_copy": [{k: v.copy() for k, v in g.items()} for g in learner.global_copy],
              "local": learner.host_params(),
              "sync_versions": list(runtime.sync.versions),
          }
      )
      return rejoined(component, m)

    def recorded_bind(component, runtime):
      bind(component, runtime)
      watch.runtime = runtime

    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(Synchronizer, "__init__", recorded_sync_init)
      mp.setattr(Synchronizer, "_merge", recorded_merge)
      mp.setattr(Synchronizer, "load_state_dict", recorded_load)
      mp.setattr(Synchronizer, "restart", recorded_restart)
      mp.setattr(rejoin.Recovery, "save_sync", recorded_save)
      mp.setattr(virtual_chaos.Chaos, "_rejoined", recorded_rejoined)
      mp.setattr(virtual_chaos.Chaos, "bind", recorded_bind)
      yield self


def _bits_equal(a: dict, b: dict) -> bool:
  return sorted(a) == sorted(b) and all(
      np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a
  )


def test_a_crashed_learner_rejoins_holding_exactly_the_global_fragments(tmp_path):
  """Learner 2 crashes at t=13.5 s for 8 s: it was in step 14, its last checkpoint is step 8.

  Under `outer.delivery=replace` at its outer lr, where a fragment it is sent overwrites its own. (Under the
  Decoupled preset's rebase it keeps what its checkpoint trained that the merge lacks, unless
  the Join's answer names its upload as merged: tests/test_delivery.py works both by hand.)
  """
  # (The second crash comes after the run's end: never reached, not counted as scheduled.)
  w = Watch().run(
      _config(
          "crash learner 2 at t=13.5s for 8s; crash learner 0 at t=9999s for 1s",
          eval_every=2,
          outer__delivery="replace",
          outer__lr=0.4,  # (replace's rate; the preset's 0.2 is rebase's under period)
          # Merges on arrival: under the period clock a merge scheduled inside the downtime may
          # still take the upload it sent before the crash (which arrived in time).
          outer__merge_clock="arrival",
      ),
      str(tmp_path),
  )
  s = w.summary
  assert s["faults"] == {"crash": 1} and s["rejoins"] == 1 and s["rejected"] == {}
  assert s["chaos"]["faults_scheduled"] == 1 and s["sim_time_s"] < 100
  assert s["chaos"]["restored_from_checkpoint"] == 1
  # Back at t=21.5 from step 8, in the others' schedule phase: they are in step 22, so 8 + 6.
  (recover,) = [r for r in w.rows if r.get("event") == "recover"]
  assert (recover["restored_step"], recover["resumes_at_step"]) == (8, 14)
  # Steps 9-13 since the checkpoint and the step in progress are lost: 6 steps, 5.5 s of work.
  assert s["chaos"]["steps_lost"] == 6
  # The others' merges continue while it is down, without it.
  down = [r for r in w.merges if 13.5 < r["time"] < 21.5]
  assert len(down) >= 4 and all(2 not in r["learners"] for r in down)
  assert {m for r in down for m in r["learners"]} == {0, 1, 3}
  assert any(2 in r["learners"] for r in w.merges if r["time"] > 21.5)  # and with it again
  # When its rejoin completes it holds, for every fragment, exactly the synchronizer's global
  # fragment at the version it holds, no older than the synchronizer's at the Join; the
  # fragments it was sent overwrite its local parameters (alpha = 0).
  (rejoin,) = w.rejoins
  assert rejoin["learner"] == 2 and 21.5 < rejoin["time"] < 22.0
  assert rejoin["steps"] == 14  # no step before the newer fragments arrived: they would undo it
  for p in range(4):
    key = (rejoin["generations"][p], p, rejoin["versions"][p])
    assert _bits_equal(rejoin["global_copy"][p], w.history[key]), p
    assert rejoin["versions"][p] == rejoin["sync_versions"][p]
  sent = [
      p
      for p in range(4)
      if any(r["fragment"] == p and r["time"] < 21.5 and r["version"] > 0 for r in w.merges)
  ]
  assert sent  # fragments moved on while it was down
  for p in sent:
    assert _bits_equal(
        {k: rejoin["local"][k] for k in w.history[(0, p, 0)]}, rejoin["global_copy"][p]
    )
  # Final global parameters finite; eval loss keeps falling after the crash.
  final = w.runtime.sync.global_params()
  assert all(np.isfinite(v).all() for v in final.values())
  before = [r["eval_loss"] for r in w.evals if r["sim_time_s"] <= 13.5]
  after = [r["eval_loss"] for r in w.evals if r["sim_time_s"] > 22.0]
  assert before[-1] < before[0] - 1.0
  assert s["eval_loss"] < before[-1] - 0.3 and min(after) < before[-1] - 0.3
  assert s["goodput"] < 1.0 - 8.0 / (4 * s["sim_time_s"])  # 8 s down, 5.5 s of work lost


@pytest.mark.parametrize("down_s", [2.0, 4.0])
def test_goodput_of_synchronous_diloco_counts_the_stall_and_the_redo_by_hand(tmp_path, down_s):
  """Synchronous DiLoCo, 2 learners, H=10, 40 steps of 1 s, no latency, checkpoints every 10
  steps. Learner 1 crashes at t=15.5 s in step 16 (steps 11-15 and half of 16 lost: 5.5 s) and is
  back at 15.5 + R. It restores step 10 and redoes the round, steps 11-20, until 25.5 + R, while
  learner 0, done with step 20 at t=20, waits for the merge: 5.5 + R s idle. Rounds 3 and 4 take
  10 s each: the run ends at 45.5 + R. The 5 lost steps return to the budget, so both learners
  train 40 steps. Goodput = useful / allocated learner-seconds = (40 + 40) / (2 (45.5 + R)): the
  survivor's wait, the crashed learner's downtime and its lost 5.5 s are not useful. Uptime: the
  merge at 20 came at 25.5 + R, 5.5 + R s late. (Before the fix, with R=2 learner 1 skipped the
  redo, jumping to learner 0's step 18, and nobody waited.)"""
  c = shakespeare.get_config(
      f"runlocal,mode=diloco,learners=2,chaos=crash learner 1 at t=15.5s for {down_s:g}s"
  )
  c.progress_bar = False
  c.sim.latency_s, c.sim.bandwidth_gbps = 0.0, 1e9
  s = train.train_and_evaluate(c, str(tmp_path))
  end = 45.5 + down_s
  assert s["sim_time_s"] == pytest.approx(end)
  assert s["goodput"] == pytest.approx(80.0 / (2 * end))
  assert s["uptime"] == pytest.approx(1.0 - (5.5 + down_s) / end)
  l0, l1 = s["per_learner"]
  assert (l0["steps"], l1["steps"], s["merges"]) == (40, 40, 4)
  assert s["tokens"] == 80 * c.batch_size * c.seq_len  # the whole budget, trained
  assert (l0["busy_s"], l0["idle_s"]) == pytest.approx((40.0, 5.5 + down_s), abs=1e-6)
  assert (l1["busy_s"], l1["idle_s"]) == pytest.approx((45.5, 0.0), abs=1e-6)  # 5.5 s lost
  assert s["chaos"]["steps_lost"] == 6 and s["chaos"]["learner_downtime_s"] == pytest.approx(down_s)
  rows = metrics.read_jsonl(os.path.join(tmp_path, metrics.METRICS_FILE))
  (recover,) = [r for r in rows if r.get("event") == "recover"]
  assert (recover["restored_step"], recover["resumes_at_step"]) == (10, 10)


def test_a_learner_without_a_checkpoint_starts_over_from_the_global_parameters(tmp_path):
  """Learner checkpoints off: learner 1 crashes at t=13.5 s for 5 s and comes back with nothing;
  it fetches every global fragment before its first step, then trains from step 0."""
  w = Watch().run(
      _config("crash learner 1 at t=13.5s for 5s", outer__learner_checkpoint_every=0), str(tmp_path)
  )
  s = w.summary
  assert s["rejoins"] == 1 and s["chaos"]["restored_from_checkpoint"] == 0
  assert s["chaos"]["steps_lost"] == 14  # steps 1-13 and the one in progress
  (rejoin,) = w.rejoins
  assert rejoin["versions"] == rejoin["sync_versions"]  # all four sent, none missing
  for p in range(4):  # it holds the global fragments, and its parameters are exactly them
    global_p = w.history[(0, p, rejoin["versions"][p])]
    assert _bits_equal(rejoin["global_copy"][p], global_p)
    assert _bits_equal({k: rejoin["local"][k] for k in global_p}, global_p)
  (recover,) = [r for r in w.rows if r.get("event") == "recover"]
  # It starts over at step 0 in the others' schedule phase: at t=18.5 they are in step 19, and
  # 19 mod H=8 = 3.
  assert recover["restored_step"] is None and recover["resumes_at_step"] == 3
  first_step = min(
      r["sim_time_s"]
      for r in w.rows
      if r.get("learner") == 1 and "loss" in r and r["sim_time_s"] > 13.5
  )
  assert first_step > rejoin["time"]  # it trained only once it held them all
  assert s["chaos"]["every_crashed_learner_rejoined"] and s["eval_loss"] < 4.0


@pytest.mark.parametrize("mode", ["now", "save"])
def test_a_restarted_synchronizer_is_its_last_checkpoint_bit_for_bit(tmp_path, mode):
  """`now`: it crashes between two merges at t=20.3 s; `save`: it crashes in the middle of its
  first checkpoint write after t=20.3 s. Either way it is down 3 s and restores the newest
  complete checkpoint (saved every 4 merges here), and the run finishes."""
  w = Watch().run(
      _config(f"sync_crash at t=20.3s for 3s {mode}", outer__sync_checkpoint_every=4, eval_every=2),
      str(tmp_path),
  )
  s = w.summary
  assert s["faults"] == {"sync_crash": 1} and s["synchronizer_restarts"] == 1
  (restart,) = [r for r in w.rows if r.get("event") == "sync_restart"]
  crash_time = next(r["time"] for r in w.rows if r.get("event") == "fault")
  before_crash = [x for x in w.saves if x[0] <= crash_time]
  assert len(before_crash) >= 3  # the initial save and some every 4 merges
  assert w.restored == [before_crash[-1][2]]  # the digest of the newest complete save
  assert restart["merges"] == before_crash[-1][1]
  if mode == "save":
    (cut,) = w.interrupted
    assert cut == before_crash[-1][1] + 4 and restart["merges_lost"] == 4
    # Step `cut` is saved again only by the restarted synchronizer (replacing the unfinished
    # directory): a different state, reached again after the restart.
    assert all(t >= restart["time"] for t, m, _ in w.saves if m == cut)
  else:
    assert w.interrupted == [] and 0 <= restart["merges_lost"] < 4
  assert restart["time"] == pytest.approx(crash_time + 3.0)
  # The run finishes: merges resume, learners never stopped (the whole budget of 4 x 40 steps
  # is trained), the parameters stay finite and the eval loss fell.
  assert sum(r["time"] > restart["time"] for r in w.merges) >= 4
  assert sum(l["steps"] for l in s["per_learner"]) == 160 and s["chaos"]["steps_lost"] == 0
  assert s["chaos"]["global_params_finite"] and math.isfinite(s["eval_loss"])
  # No learner's work is lost: each merged share is the run without the fault's (0.925: 37 of
  # its 40 steps, pinned from that run). The merges after the checkpoint were lost with the
  # restart; each learner's next upload carries their effect and counts its steps in them again
  # (`Learner.merged_own`; without it the shares were 0.825 under `now`).
  assert [l["merged_share"] for l in s["per_learner"]] == [0.925] * 4
  # Every live learner holds, for each fragment it shares a version with the final
  # synchronizer, exactly its global fragment.
  sync = w.runtime.sync
  for learner in w.runtime.learners:
    for p in range(4):
      if (learner.generations[p], learner.versions[p]) == (sync.generation, sync.versions[p]):
        assert _bits_equal(learner.global_copy[p], sync.globals[p])
  assert s["eval_loss"] < w.evals[0]["eval_loss"] - 1.0  # the first is after 2 steps


def _tiny_sync() -> Synchronizer:
  params = {
      "embed": {"embedding": np.arange(4, dtype=np.float32).reshape(2, 2)},
      "blocks": {0: {"w": np.ones(3, np.float32)}, 1: {"w": np.ones(2, np.float32)}},
  }
  frag = fragments.strided(params, 2)
  sync = Synchronizer(params, frag, policies.SYNCHRONOUS, optimizers.nesterov(0.5, 0.5))
  sync.handle(Join(0, 0.0, (0, 0)))
  return sync


def _merge_once(sync: Synchronizer, p: int, scale: float) -> None:
  delta = {k: np.full(v.shape, scale, np.float32) for k, v in sync.globals[p].items()}
  sync.handle(
      Upload(0, p, sync.versions[p], compression.encode_tree(delta, "fp32"), 1, 8, 1.0, 1.0, 1.0)
  )


def test_a_crash_during_a_checkpoint_write_leaves_the_previous_one_restorable(
    tmp_path, monkeypatch
):
  sync = _tiny_sync()
  _merge_once(sync, 0, 0.5)
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path))
  assert ckpt.save(sync.merges, sync.state_dict())
  first = sync.digest()
  _merge_once(sync, 1, 0.25)
  _merge_once(sync, 0, -0.5)
  assert sync.digest() != first

  # The write of the arrays fails halfway (an exception injected into orbax's array writer).
  def failing(self, *args, **kwargs):
    raise OSError("disk full")

  with monkeypatch.context() as mp:
    mp.setattr(ocp.handlers.StandardCheckpointHandler, "async_save", failing)
    assert not ckpt.save(sync.merges, sync.state_dict())  # logged; the run goes on
  # The injected crash of the chaos schedule: half a JSON file, then the process dies.
  with pytest.raises(sync_checkpoint.SimulatedCrash):
    ckpt.save(sync.merges + 1, sync.state_dict(), interrupt=True)
  # The failed save left fragment 0's write unfinished; the crash wrote both fragments' new
  # versions and half of step 4.
  assert sorted(os.listdir(tmp_path)) == ["1", "4.orbax-checkpoint-tmp", "fragments"]
  frags = lambda: sorted(os.listdir(tmp_path / "fragments"))
  assert frags() == ["0.v1", "0.v2", "1.v0", "1.v1"]
  # A restarted synchronizer (a new manager over the directory) finds the first save, whole,
  # and removes the fragments written after it (a later generation merges those versions anew).
  reopened = sync_checkpoint.SyncCheckpointer(str(tmp_path))
  assert reopened.latest_step() == 1
  fresh = _tiny_sync()
  fresh.load_state_dict(reopened.restore(fresh.state_dict()))
  assert fresh.digest() == first
  assert fresh.versions == [1, 0] and fresh.members == {0}
  assert frags() == ["0.v1", "1.v0"]
  # Saving that step again replaces the unfinished directory.
  assert reopened.save(3, sync.state_dict())
  assert reopened.latest_step() == 3 and "3" in os.listdir(tmp_path)
  assert frags() == ["0.v1", "0.v2", "1.v0", "1.v1"]  # steps 1 and 3 are kept (keep=2)


def test_a_save_writes_only_the_fragments_merged_since_the_last_one(tmp_path):
  """Issue 72: bytes written per save scale with the fragments merged, not with the model."""
  sync = (
      _tiny_sync()
  )  # strided: fragment 0 = blocks/0 (3 floats) + embed (4), fragment 1 = blocks/1 (2)
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path), keep=3)
  assert ckpt.save(sync.merges, sync.state_dict())
  # Each fragment: global, residual and the Nesterov momentum, float32; the versions (2 int64).
  f0, f1, versions = 3 * 7 * 4, 3 * 2 * 4, 2 * 8  # 84, 24 and 16 bytes
  assert ckpt.bytes_written == f0 + f1 + versions
  _merge_once(sync, 1, 0.25)
  assert ckpt.save(sync.merges, sync.state_dict())
  assert ckpt.bytes_written == f0 + f1 + versions + f1 + versions
  before = ckpt.bytes_written
  assert ckpt.save(5, sync.state_dict())  # nothing merged since: only the step itself
  assert ckpt.bytes_written == before + versions and ckpt.saves == 3
  names = sorted(os.listdir(tmp_path / "fragments"))
  assert names == ["0.v0", "1.v0", "1.v1"]
  ckpt.save(6, sync.state_dict())  # keep=3: step 0, the only one naming 1.v0, is dropped
  assert sorted(os.listdir(tmp_path / "fragments")) == ["0.v0", "1.v1"]
  fresh = _tiny_sync()
  fresh.load_state_dict(sync_checkpoint.SyncCheckpointer(str(tmp_path)).restore(fresh.state_dict()))
  assert fresh.digest() == sync.digest()


def _save_whole(directory, step: int, state: dict) -> None:
  """Step `step` as the code before fragment items wrote it (format 1), or with the meta given."""
  manager = ocp.CheckpointManager(str(directory), options=ocp.CheckpointManagerOptions(create=True))
  manager.save(
      step,
      args=ocp.args.Composite(
          arrays=ocp.args.StandardSave(state["arrays"]), meta=ocp.args.JsonSave(state["meta"])
      ),
  )
  manager.wait_until_finished()
  manager.close()
  manifest.write(os.path.join(directory, str(step)))


def test_a_checkpoint_of_the_format_before_fragments_restores_and_a_newer_one_is_refused(tmp_path):
  """A step written whole (format 1: every array in the step, no layout) restores as it was; a
  step of a format this code does not know is refused, naming it."""
  sync = _tiny_sync()
  _merge_once(sync, 0, 0.5)
  _save_whole(tmp_path, 1, sync.state_dict())
  ckpt = sync_checkpoint.SyncCheckpointer(str(tmp_path))
  fresh = _tiny_sync()
  fresh.load_state_dict(ckpt.restore(fresh.state_dict()))
  assert fresh.digest() == sync.digest()
  assert ckpt.save(2, fresh.state_dict())  # the next save writes every fragment: none on disk
  assert sorted(os.listdir(tmp_path / "fragments")) == ["0.v1", "1.v0"]
  assert ckpt.bytes_written == 3 * 7 * 4 + 3 * 2 * 4 + 2 * 8
  newer = sync.state_dict()
  newer["meta"][sync_checkpoint.LAYOUT] = {"format": 3, "fragments": []}
  _save_whole(tmp_path / "newer", 1, newer)
  with pytest.raises(ValueError, match="has format 3; this code reads formats 1-2"):
    sync_checkpoint.SyncCheckpointer(str(tmp_path / "newer")).restore(fresh.state_dict())


def test_a_seeded_chaos_run_is_deterministic_and_the_suite_tables_it(tmp_path, capsys):
  """The suite's run with seed 0 (heavy preset, 40 steps, jittered step times), then the same
  run again: same faults, same bits. Seed 1 draws other faults."""
  cfg = suite_config.get_config("runs=1,steps=40")
  with Watch().patched() as first:
    out = chaos_suite.run(cfg, str(tmp_path / "suite"), shakespeare.get_config)
  (row,) = out["runs"]
  assert row["seed"] == 0 and row["faults_total"] == out["faults_total"] >= 10
  assert len(out["faults"]) >= 5  # kinds
  assert row["params_ok"] and row["all_rejoined"] and row["advanced"] and not out["failed_runs"]
  assert row["tainted"]["merged"] == 0 and row["tainted"]["caught"] >= 3
  table = (tmp_path / "suite" / "chaos_suite.md").read_text()
  assert table.startswith("| seed | crash | straggle |") and "\n| 0 | " in table
  assert f"1 runs, {row['faults_total']} faults injected" in table
  assert json.loads((tmp_path / "suite" / "chaos_suite.json").read_text())[0]["seed"] == 0
  capsys.readouterr()

  run0 = tmp_path / "suite" / "run0"
  again = Watch().run(
      chaos_suite.run_config(cfg, 0, shakespeare.get_config), str(tmp_path / "again")
  )
  assert (tmp_path / "again" / "chaos_schedule.txt").read_text() == (
      run0 / "chaos_schedule.txt"
  ).read_text()
  summary = json.loads((run0 / "summary.json").read_text())
  for key in (
      "faults",
      "rejected",
      "rejoins",
      "synchronizer_restarts",
      "merges",
      "eval_loss",
      "sim_time_s",
      "bytes_sent",
      "goodput",
      "chaos",
  ):
    assert metrics._plain(again.summary[key]) == summary[key], key
  events = [r for r in metrics.read_jsonl(run0 / metrics.METRICS_FILE) if "event" in r]
  assert events == [r for r in again.rows if "event" in r]  # every merge, reject, fault
  assert _bits_equal(first.runtime.sync.global_params(), again.runtime.sync.global_params())
  assert _schedule(chaos_suite.run_config(cfg, 1, shakespeare.get_config)) != _schedule(
      chaos_suite.run_config(cfg, 0, shakespeare.get_config)
  )


def _schedule(config) -> str:
  return chaos.format_schedule(
      chaos.from_config(config.chaos, config.outer.learners, config.steps * config.sim.step_s)
  )
