"""A real local Ray cluster (started here, stopped at the end): two synchronizer shards and two
learners of the tiny model in mode=decoupled under experiments.launch_ray. One learner's process
and then one shard's are SIGKILLed by PID; Ray's driver brings both back, the learner resumes from
its checkpoint and merges again, the other shard merges on through the outage, and the restarted
shard holds exactly its checkpoint and merges its fragments again."""

import json
import os
import signal

from diloco.chaos import recovery_times
from diloco.launch import ray_local

# Learner 1 straggles 3x for the first 40 s of the run (its clock survives its restart), so that
# it outlasts its own restart and the synchronizer's (a fresh Ray worker, JAX's import, the
# checkpoint: 5-15 s each) whatever the machine's speed: 600 unstraggled steps take 15-30 s on 2
# cores, and with 900 of them and no straggle the run once ended before the new synchronizer came.
# With the straggle, learner 1 was at step 121 when it first merged with the restarted shard (30 s
# after its first start), still straggling, and at 195 when the straggle ended; the 400 steps after
# that took 18 s more. 400 steps in all leave it 3x the steps it needed, and end 8 s sooner.
STEPS = 400
CONFIG = f"configs/shakespeare.py:mode=decoupled,runlocal,learners=2,steps={STEPS}"
FLAGS = (
    "--config.chaos.schedule=straggle learner 1 at t=0s for 40s x3",
    "--config.outer.learner_checkpoint_every=20",
    "--config.deploy.restart_backoff_s=0.5",
    "--config.deploy.absent_after_s=3",
    "--config.outer.sync_shards=2",
    "--config.outer.fragments=4",
    "--config.outer.fragment_kind=balanced",
)


def _progress(wd: str, m: int) -> int:
  return max((r["step"] for r in ray_local.rows(f"{wd}/learner{m}/progress.jsonl")), default=0)


def _merged_after(wd: str, t: float, m: int | None = None, role: str = "sync1") -> bool:
  return any(
      r["time"] > t and (m is None or m in r["learners"]) for r in ray_local.merges(wd, role)
  )


def _serving_since(wd: str, role: str, t: float) -> bool:
  """`role`'s process wrote WORKDIR/<role>/port after `t`: a process started since serves (a
  restarted synchronizer removes the file as it starts and writes it once it listens)."""
  port = os.path.join(wd, role, "port")
  try:
    return os.path.getmtime(port) > t
  except FileNotFoundError:
    return False


def _all_merges(wd: str) -> list[dict]:
  return sorted(
      ray_local.merges(wd, "sync0") + ray_local.merges(wd, "sync1"), key=lambda r: r["time"]
  )


def _run_with_kills(wd: str, log: str, jax_cache: str) -> list[dict]:
  """Kills learner 1 once it checkpointed, then shard 1 as soon as learner 1's new process has
  restored its checkpoint; waits for learner 1's first merge with the new shard 1."""
  kills = []
  with ray_local.cluster(num_cpus=4, jax_cache=jax_cache) as address:
    proc = ray_local.launch(address, CONFIG, 2, wd, *FLAGS, log=log)
    try:
      ray_local.wait_for(lambda: _progress(wd, 1) >= 30, 300, proc=proc)
      kills.append(ray_local.kill(wd, "learner1"))
      starts = ray_local.wait_for(
          lambda: ray_local.rows(f"{wd}/learner1/starts.jsonl")[1:], 90, proc=proc
      )
      assert starts[0]["restored_step"] is not None
      # Learner 1 is frozen (SIGSTOP) from just before shard 1's kill until shard 1's new process
      # serves (its port file written again), so that it cannot end its run before the restarted
      # shard could merge its work, whatever the machine's speed: on a slowed machine shard 1
      # took 22 s to come back, learner 1 ended 26 s later without having reached it, and the
      # launcher exited while the test waited.
      frozen = ray_local.state(wd)["procs"]["learner1"]["pid"]
      os.kill(frozen, signal.SIGSTOP)
      try:
        kills.append(ray_local.kill(wd, "sync1"))
        ray_local.wait_for(lambda: _serving_since(wd, "sync1", kills[1]["time"]), 120, proc=proc)
      finally:
        os.kill(frozen, signal.SIGCONT)
      assert ray_local.state(wd)["procs"]["sync1"]["pid"] != kills[1]["pid"]
      ray_local.wait_for(lambda: _merged_after(wd, kills[1]["time"], 1), 90, proc=proc)
      assert proc.wait(timeout=180) == 0
    finally:
      if proc.poll() is None:
        proc.kill()
  return kills


def test_ray_brings_back_a_killed_learner_and_synchronizer(tmp_path):
  wd = str(tmp_path / "run")
  # The suite's compilation cache (tests/conftest.py) where there is one, so programs that other
  # tests of the same tiny model compiled are not compiled again; restarted processes read theirs.
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path / "jax_cache")
  kills = _run_with_kills(wd, str(tmp_path / "launch.log"), cache)
  with open(os.path.join(wd, "ray_report.json")) as f:
    report = json.load(f)
  assert report["restarts"] == {"sync0": 0, "sync1": 1, "learner0": 0, "learner1": 1}
  failed = [(e["role"], e["error"]) for e in report["events"] if e["event"] == "failed"]
  assert [role for role, _ in failed] == ["learner1", "sync1"], failed
  # The learner came back in a new process from its newest checkpoint (every 20 steps, killed
  # after step 30), and finished every step.
  starts = ray_local.rows(f"{wd}/learner1/starts.jsonl")
  assert len(starts) == 2 and starts[1]["pid"] != starts[0]["pid"] == kills[0]["pid"]
  assert starts[1]["restored_step"] is not None and starts[1]["restored_step"] >= 20
  assert report["learners"][1]["restored_step"] == starts[1]["restored_step"]
  assert [r["steps"] for r in report["learners"]] == [STEPS, STEPS]
  # Shard 1 restarted as its own generation 1 from its checkpoint, arrays equal to it; shard 0
  # never restarted, and merged its own fragments while shard 1 was away.
  shard0, shard1 = report["shards"]
  assert shard1["generation"] == 1 and shard1["restored_from"] is not None
  assert shard1["restored_arrays_equal"] is True
  assert shard0["generation"] == 0 and not set(shard0["owned"]) & set(shard1["owned"])
  back = min(r["time"] for r in ray_local.merges(wd, "sync1") if r["time"] > kills[1]["time"])
  outage = [r for r in ray_local.merges(wd, "sync0") if kills[1]["time"] < r["time"] < back]
  assert outage and {r["fragment"] for r in outage} <= set(shard0["owned"]), outage
  shard_kill = {**kills[1], "process": "sync"}  # shard 1's merges, as one synchronizer's
  rec = recovery_times.recovery(ray_local.merges(wd, "sync1"), [shard_kill], {}, learners=2)
  assert rec["sync_kills"][0]["first_merge_s"] > 0
  rec = recovery_times.recovery(_all_merges(wd), kills[:1], ray_local.starts(wd, 2), learners=2)
  assert rec["learner_kills"][0]["first_merge_s"] > rec["learner_kills"][0]["restart_s"] > 0
  # The restarted learner merged again with both shards (with shard 1 after its restart).
  assert _merged_after(wd, starts[1]["time"], 1, "sync0")
  assert _merged_after(wd, kills[1]["time"], 1, "sync1")
