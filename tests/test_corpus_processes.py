"""A prepared corpus in a bucket, trained on by one learner island of two processes
(`jax.distributed` on the loopback, FSDP over both): each process copies and reads only its own
shards, and the run stopped after its middle checkpoint and resumed ends with the uninterrupted
run's parameters. The bucket is the Cloud Storage server of tests/object_store.py."""

import json
import os
import shutil
import subprocess

import numpy as np

from diloco.data.corpus import files, manifest as manifest_lib, prepare, tokenizer_files
from diloco.rpc import local
from object_store import bucket  # noqa: F401 (a fixture)
from proc_helpers import REPO, train_command

WORDS = "the of and to in a is that for it as was with be by on not he this are".split()


def _prepare(tmp_path, bucket_url):
  """A train corpus of 4 shards and a validation corpus of 1 in the bucket (byte-level BPE)."""
  rng = np.random.default_rng(0)
  texts = [" ".join(rng.choice(WORDS, rng.integers(20, 120))) for _ in range(400)]
  for name, part in (("train", texts[:360]), ("val", texts[360:])):
    files.put_bytes(
        f"{bucket_url}/raw/{name}.jsonl",
        "".join(json.dumps({"text": t}) + "\n" for t in part).encode(),
    )
  tok = tokenizer_files.train("bpe", texts, 300, f"{bucket_url}/tokenizer.json")
  for name, shards in (("train", 4), ("val", 1)):
    spec = prepare.Spec(
        (f"{bucket_url}/raw/{name}.jsonl",), "jsonl", tok.path, f"{bucket_url}/{name}", shards
    )
    prepare.prepare(spec, progress=False)
  return manifest_lib.read(f"{bucket_url}/train")


def _run(tmp_path, bucket_url, workdir):
  port = local.free_port()
  flags = (
      "--config.distributed=True",
      "--config.mesh.fsdp=4",
      "--config.mesh.data=1",
      "--config.steps=12",
      "--config.checkpoint_every=6",
      "--config.data.source=corpus",
      f"--config.data.corpus={bucket_url}/train",
      f"--config.data.val_corpus={bucket_url}/val",
      f"--coordinator=127.0.0.1:{port}",
      "--num_processes=2",
  )
  procs = []
  for i in (0, 1):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    env |= {"JAX_PLATFORMS": "cpu", "DILOCO_DATA_DIR": str(tmp_path / f"cache{i}")}
    command = train_command(workdir, *flags, f"--process_id={i}", variants="runlocal,mode=dp")
    procs.append(
        subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    )
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def test_two_processes_read_their_own_shards_from_a_bucket_and_resume_exactly(tmp_path, bucket):
  m = _prepare(tmp_path, bucket)
  workdir = str(tmp_path / "run")
  whole = _run(tmp_path, bucket, workdir)
  assert whole["finished"] and whole["data"]["source"] == "corpus"
  # Each process copied only its shards (round robin: process 0 shards 0 and 2, process 1 the
  # others) into its own cache; the validation corpus, which both score, to both.
  for i, mine in ((0, [0, 2]), (1, [1, 3])):
    cached = sorted(os.listdir(tmp_path / f"cache{i}" / "corpus" / "shards"))
    assert cached == sorted(f"{m.shards[k].sha256[:24]}.array_record" for k in mine), (i, cached)
  # Stopped after step 6, as if killed: the checkpoint holds both processes' reader positions.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "12"))
  resumed = _run(tmp_path, bucket, workdir)
  assert resumed["resumed_from_step"] == 6
  assert resumed["params_sha256"] == whole["params_sha256"]
