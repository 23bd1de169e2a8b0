"""A run whose --workdir is a bucket URL (the Cloud Storage server of tests/object_store.py):
runlocal dp and Decoupled DiLoCo run end to end from a directory they must not write to, stop
half way, resume from the bucket and end with the uninterrupted local run's parameters; the
bucket's checkpoints carry manifests of the store's own checksums, a changed object sets its step
aside, and a second run on a held bucket workdir is refused. (A learner process killed mid-run and
back from its checkpoint in the bucket: tests/test_island_bucket.py.)"""

import json
import os
import re
import subprocess

import pytest

from diloco import errors, jsonl, paths, train
from diloco.inner import manifest
from diloco.recovery import workdir as workdir_lib
from diloco.rpc import forked
from configs import shakespeare

from object_store import bucket  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(workdir: str, cwd: str, config: str, *flags: str) -> subprocess.CompletedProcess:
  argv = ["-m", "experiments.train", f"--config={config}", f"--workdir={workdir}", *flags]
  return forked.run(argv, {**os.environ, "PYTHONPATH": ROOT}, cwd, timeout=300)


@pytest.mark.parametrize("mode", ["dp", "decoupled"])
def test_a_bucket_workdir_trains_stops_and_resumes_with_nothing_written_locally(
    mode, bucket, tmp_path, monkeypatch  # noqa: F811
):
  """The command stops at step 20 (stop_after_steps); the same run resumed (in this process, from
  the same empty directory) ends as the uninterrupted local run does."""
  config = f"{ROOT}/configs/shakespeare.py:runlocal,mode={mode}"
  here = tmp_path / "cwd"
  here.mkdir()
  url = f"{bucket}/{mode}"
  first = _train(url, str(here), config, "--config.stop_after_steps=20")
  assert first.returncode == 0, first.stderr[-3000:]
  stopped = json.loads(paths.read_text(f"{url}/summary.json"))
  assert stopped["finished"] is False and stopped["workdir"] == url
  monkeypatch.chdir(here)
  train.train_and_evaluate(shakespeare.get_config(f"runlocal,mode={mode}"), url)
  resumed = json.loads(paths.read_text(f"{url}/summary.json"))
  assert resumed["finished"] is True and resumed["steps"] == 40
  assert not list(here.iterdir())  # nothing under the directory it ran in

  local = train.train_and_evaluate(
      shakespeare.get_config(f"runlocal,mode={mode}"), str(tmp_path / "l")
  )
  assert resumed["params_sha256"] == local["params_sha256"]
  names = set(paths.listdir(url))
  assert {"config.json", "metrics.jsonl", "summary.json", "checkpoints", "tb"} <= names
  assert workdir_lib.HOLD not in names  # released at the end
  logged = lambda d: [
      (r.get("learner"), r["step"]) for r in jsonl.read(f"{d}/metrics.jsonl") if "loss" in r
  ]
  assert logged(url) == logged(str(tmp_path / "l"))  # each step once across the resume, as locally
  merges = lambda d: [r for r in jsonl.read(f"{d}/metrics.jsonl") if r.get("event") == "merge"]
  assert merges(url) == merges(str(tmp_path / "l"))  # (decoupled: every merge record, as locally)
  assert resumed.get("per_learner") == local.get("per_learner")  # clocks, bytes and idle time
  if mode == "dp":
    assert resumed["resumed_from_step"] == 20
    step_dir = f"{url}/checkpoints/40"
  else:
    step_dir = f"{url}/checkpoints/final_params/40"
  record = json.loads(paths.read_text(f"{step_dir}/{manifest.NAME}"))
  assert record["digest"] == "crc32c" and len(record["files"]) > 3


def test_a_changed_object_sets_its_bucket_step_aside(bucket):  # noqa: F811
  directory = f"{bucket}/ckpt"
  for step in (1, 2):
    paths.write_bytes(f"{directory}/{step}/state/a", b"x" * 100)
    paths.write_bytes(f"{directory}/{step}/{manifest.COMMIT_MARKER}", b"")
    assert manifest.seal_committed(f"{directory}/{step}")
  assert manifest.intact_steps(directory, [1, 2]) == [2, 1]
  paths.write_bytes(f"{directory}/2/state/a", b"y" * 100)  # same size, another byte
  assert manifest.problem(f"{directory}/2") == "state/a does not match its crc32c (a changed byte)"
  paths.write_bytes(f"{directory}/1/state/a", b"x" * 99)
  assert "truncated" in manifest.problem(f"{directory}/1")
  assert manifest.intact_steps(directory, [1, 2], move=True) == []
  assert set(paths.listdir(directory)) == {"1.corrupt-1", "2.corrupt-1"}


def test_a_held_bucket_workdir_refuses_a_second_run_and_a_stale_hold_is_taken_over(
    bucket, monkeypatch  # noqa: F811
):
  url = f"{bucket}/held"
  other = {"host": "elsewhere", "pid": 1, "since": 0.0}
  paths.write_text(f"{url}/{workdir_lib.HOLD}", json.dumps({**other, "beat": 1e18}))
  with pytest.raises(
      workdir_lib.WorkdirError, match="in use by another run: PID 1 on host elsewhere"
  ):
    workdir_lib.Hold(url).acquire()
  paths.write_text(f"{url}/{workdir_lib.HOLD}", json.dumps({**other, "beat": 0.0}))
  hold = workdir_lib.Hold(url).acquire()  # its holder stopped renewing long ago
  mine = json.loads(paths.read_text(f"{url}/{workdir_lib.HOLD}"))
  assert mine["pid"] == os.getpid()
  hold.release()
  assert not paths.exists(f"{url}/{workdir_lib.HOLD}")


def test_a_bucket_jsonl_keeps_whole_rows_and_resumes_at_a_position(bucket):  # noqa: F811
  path = f"{bucket}/m.jsonl"
  paths.write_bytes(path, b'{"step": 1}\n{"step": 2}\n{"ste')  # a torn last row
  f = jsonl.open_append(path)
  assert f.tell() == len(b'{"step": 1}\n{"step": 2}\n')
  f.write('{"step": 3}\n')
  f.close()
  assert [r["step"] for r in jsonl.read(path)] == [1, 2, 3]
  cut = jsonl.BucketAppend(path, keep_bytes=len(b'{"step": 1}\n'))
  cut.write('{"step": 9}\n')
  cut.close()
  assert [r["step"] for r in jsonl.read(path)] == [1, 9]


@pytest.mark.parametrize("mode", ["dp", "decoupled"])
def test_a_failed_run_keeps_its_rows_in_the_bucket(bucket, mode):  # noqa: F811
  """A run stopped by an error (a loss gone NaN) still uploads the rows it wrote: a bucket's are
  held in memory between uploads, and the writer is closed on the way out."""
  config = shakespeare.get_config(f"runlocal,mode={mode}")
  config.optimizer.lr, config.optimizer.clip_norm = 1e6, 0.0
  config.log_every = 1
  url = f"{bucket}/failed-{mode}"
  with pytest.raises(FloatingPointError, match=r"at step (\d+)") as err:
    train.train_and_evaluate(config, url)
  bad = int(re.search(r"at step (\d+)", str(err.value)).group(1))
  steps = {r["step"] for r in jsonl.read(f"{url}/metrics.jsonl") if "loss" in r}
  assert bad > 2 and max(steps) == bad - 1  # every finite row, the last one's too
  assert not paths.exists(f"{url}/summary.json")


@pytest.mark.parametrize(
    "url,bad",
    [
        ("gs://my-corpus/run", False),
        ("gs://a_b-c.d/run", False),
        ("/local/b/run", False),
        ("gs://b/run", True),  # too short: an emulator takes it, tensorstore refuses it mid-run
        ("gs://My-Corpus/run", True),
        ("gs://-corpus/run", True),
        ("gs://a..b/run", True),
        ("gs://" + "a" * 64 + "/run", True),
    ],
)
def test_a_url_whose_bucket_cannot_exist_is_refused_by_its_name(url, bad):
  """Refused before any storage call (no server runs here), naming the bucket and the rule."""
  if bad:
    with pytest.raises(errors.InputError, match="--workdir: gs://.* is not a Cloud Storage bucket"):
      paths.require_bucket(url, "--workdir")
  else:
    assert paths.bad_bucket_name(url) == ""
