"""Issue 54's acceptance run: a Decoupled DiLoCo run of separate processes with every workdir in
a bucket (the Cloud Storage server of tests/object_store.py): a synchronizer, learner 0 as one
JAX job of 4 processes x 2 CPU devices (gloo collectives, parameters sharded over fsdp=8), and
learner 1 as one process. One process of the island is SIGKILLed after its first checkpoint; the
supervisor restarts the island, which comes back from its checkpoint in the bucket and rejoins,
and the run finishes with finite parameters, identical on the island's processes, while learner 1
never stopped. Between two sync points the island made no cross-process call but its train
step's own (each process counts them by step: rpc/multihost.py)."""

import io
import json
import time

import numpy as np
from proc_helpers import only_at_sync_points

from diloco import jsonl, paths
from diloco.config import checks
from diloco.inner import manifest
from diloco.recovery.learner_checkpoint import LearnerCheckpointer
from diloco.rpc import learner_main, local

from object_store import bucket  # noqa: F401 (a fixture)

SPEC = "configs/shakespeare.py:mode=decoupled,runlocal,learners=2"
STEPS, EVERY = 30, 10


def _json(path: str) -> dict:
  return json.loads(paths.read_text(path))


def _checkpoints(url: str) -> list[int]:
  """Learner 0's steps saved whole (committed and sealed with their manifest)."""
  directory = f"{url}/learner0/checkpoints"
  steps = [int(n) for n in paths.listdir(directory) if n.isdigit()]
  return sorted(s for s in steps if manifest.exists(f"{directory}/{s}"))


def _tails(c: local.LocalCluster, names: list[str]) -> str:
  """The last lines of these processes' logs (what a failure shows)."""
  return "\n".join(
      f"--- {n}:\n" + open(f"{c.logs}/{n}.log", errors="replace").read()[-3000:] for n in names
  )


def test_an_island_of_four_processes_loses_one_and_comes_back_from_the_bucket(bucket):  # noqa: F811
  url = f"{bucket}/island"
  overrides = (
      f"--config.steps={STEPS}",
      f"--config.outer.learner_checkpoint_every={EVERY}",
      "--config.mesh.data=-1",  # and fsdp over all devices: the island's 8, over its four
      "--config.mesh.fsdp=-1",  # processes, each holding its part of the copies
      "--config.outer.error_feedback=True",  # (its residuals too, saved and restored as parts)
      "--config.progress_bar=False",
  )
  c = local.LocalCluster(
      SPEC, 2, url, devices_per_learner=2, processes_of={0: 4}, overrides=overrides
  )
  try:
    c.start()
    deadline = time.monotonic() + 240
    while not _checkpoints(url):
      assert time.monotonic() < deadline, "the island saved no checkpoint in time"
      assert all(c.alive(n) for n in c.learner_names(0)), c.procs
      time.sleep(0.2)
    c.kill("learner0.p2")  # one process of the island, SIGKILL: no cleanup runs
    codes = c.wait(420, restart_crashed=True)
  finally:
    c.stop(grace_s=2.0)
  assert set(codes.values()) == {0}, (codes, _tails(c, [n for n, code in codes.items() if code]))
  island = c.learner_names(0)
  assert [c.starts[n] for n in island] == [2, 2, 2, 2] and c.starts["learner1"] == 1

  lead = _json(f"{url}/learner0/summary.json")
  followers = [_json(f"{url}/learner0/summary.process{i}.json") for i in (1, 2, 3)]
  assert (lead["processes"], lead["devices"], lead["steps"]) == (4, 8, STEPS) and lead["settled"]
  assert lead["restored_step"] >= EVERY and lead["restored_step"] % EVERY == 0
  assert all(f["steps"] == STEPS and f["restored_step"] == lead["restored_step"] for f in followers)
  assert {f["params_crc"] for f in followers} == {lead["params_crc"]}  # one model on all four
  assert lead["params_sharded"] > 0
  params = np.load(_npz(url))
  assert all(np.isfinite(params[k]).all() for k in params.files)
  # Each process holds its quarter of the copy of the global fragments (a few small parameters,
  # replicated, whole), which gathered is the one learner 1 holds of the same versions.
  held = {s["global_copy_bytes"] for s in (lead, *followers)}
  assert len(held) == 1 and 4 * held.pop() < 1.05 * lead["global_copy_whole_bytes"]
  for summary in (lead, *followers):  # no call but the step's between two sync points
    only_at_sync_points(summary)
  k = lead["sync_interval"]
  assert followers[0]["ops"]["run"] <= (STEPS - lead["restored_step"]) // k + 1
  # The island resumed where the crash-and-rejoin machine said: learner 1's phase (H=8) as its
  # last heartbeat reported it, at the sync point at or before it; all four processes alike.
  rejoin, restored = lead["rejoin"], lead["restored_step"]
  ((peer,),) = [[p["steps"] for p in rejoin["peers"]]]
  shift = min((peer - restored) % 8, STEPS - restored) // k * k
  assert rejoin["restored_step"] == restored and rejoin["resumes_at_step"] == restored + shift
  assert rejoin["rejoined"] is not None
  assert all(f["ops"]["resume"] == (shift > 0) for f in followers)
  # The followers applied what process 0 applied (a non-blocking learner: its poll runs in a
  # thread and the arrivals wait for a sync point), and process 0 got every merge. Under rebase
  # (the Decoupled preset) an arrival that names the island's own upload as merged is applied as
  # a rebase, its own operation: the two together are process 0's applied merges.
  applied = [f["ops"]["receive"] + f["ops"]["rebase"] for f in followers]
  assert applied == [lead["applied"]] * 3 and lead["applied"] > 0, (applied, lead["applied"])
  sync = _json(f"{url}/sync/summary.json")
  assert lead["versions"] == sync["versions"] and sync["merges"] > 0

  starts = jsonl.read(f"{url}/learner1/starts.jsonl")
  other = _json(f"{url}/learner1/summary.json")
  assert len(starts) == 1 and other["steps"] == STEPS  # learner 1 ran on, once, to the end
  assert other["versions"] == lead["versions"] and other["global_crc"] == lead["global_crc"]

  # The island's last checkpoint (each process saved its part of the copies) restores into one
  # process of 8 devices, its copies whole (not the data iterators: grain keeps one per process).
  config = checks.prepare(local.load_config(SPEC, overrides))
  one = learner_main.make_learner(config, 0)
  ckpt = LearnerCheckpointer(f"{url}/learner0/checkpoints", EVERY)
  assert ckpt.restore_into(one, None) == STEPS and one.steps == STEPS
  copy = one.whole_globals()
  assert [set(g) for g in copy] == [set(paths) for paths in one.frag.paths]
  assert all(
      np.isfinite(v).all() and v.shape == params[k].shape for g in copy for k, v in g.items()
  )
  residuals = one.uplink.residuals
  assert all(residuals[p][k].shape == params[k].shape for p in residuals for k in residuals[p])
  if one.versions == lead["versions"]:  # no merge arrived after the last save: the final copy
    held = np.load(io.BytesIO(paths.read_bytes(f"{url}/learner0/global_copy.npz")))
    assert all(
        np.array_equal(v, held[f"{p}/{k}"]) for p, g in enumerate(copy) for k, v in g.items()
    )
  ckpt.close()


def _npz(url: str):
  return io.BytesIO(paths.read_bytes(f"{url}/learner0/params.process0.npz"))
