"""The corpus issue's acceptance run: a generated corpus of 24 MB of JSON Lines in a bucket, a
byte-level BPE tokenizer of 8,192 ids trained on it by `experiments.prepare tokenizer`, its shards
written to the bucket by `experiments.prepare shards`, and one learner island of two processes
(`jax.distributed` on the loopback, FSDP over both) training on it: each process copies and reads
only its own shards, the summary's parameter hash is the saved model's (gathered from both), and
the run stopped after its middle checkpoint and resumed ends with the uninterrupted run's
parameters. The bucket is the Cloud Storage server of tests/object_store.py."""

import functools
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np

from diloco import metrics, paths
from diloco.data.corpus import manifest as manifest_lib
from diloco.inner import checkpoint, island as island_lib
from diloco.outer import fragments
from diloco.rpc import forked, local
from diloco.runners import finished_run
from object_store import bucket  # noqa: F401 (a fixture)
from proc_helpers import REPO, train_command

RAW_BYTES = 24_000_000
VOCAB = 8192


@functools.cache
def _words() -> tuple[list[str], np.ndarray]:
  """20,000 words of 1-3 syllables (the same for every split) and their Zipf probabilities."""
  rng = np.random.default_rng(0)
  syllables = [a + b for a in "bcdfghjklmnprstvwz" for b in ("a", "e", "i", "o", "u", "ai", "ou")]
  words = ["".join(rng.choice(syllables, k)) for k in rng.integers(1, 4, 20_000)]
  p = 1.0 / np.arange(1, len(words) + 1) ** 1.1
  return words, p / p.sum()


def _generated_jsonl(size: int, seed: int) -> bytes:
  """JSON Lines of `size` bytes: documents of 50-600 words drawn (Zipf, s = 1.1) from 20,000
  words of 1-3 syllables, enough distinct text for 8,192 BPE ids."""
  words, p = _words()  # (built once for both splits: 0.9 s each; the same bytes as before)
  rng = np.random.default_rng(seed)
  lines, total = [], 0
  while total < size:
    text = " ".join([words[i] for i in rng.choice(len(words), int(rng.integers(50, 600)), p=p)])
    lines.append(json.dumps({"text": text}) + "\n")
    total += len(lines[-1])
  return "".join(lines).encode()


def _prepare_command(what: str, *flags: str) -> None:
  command = [sys.executable, "-m", "experiments.prepare", what, "--format=jsonl", "--field=text"]
  done = subprocess.run(
      command + list(flags), cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 0, done.stderr[-3000:]


def _prepare(bucket_url):
  """Raw JSON Lines in the bucket; the tokenizer trained on the training split by the command; a
  train corpus of 4 shards (2 workers) and a validation corpus of 1, all in the bucket."""
  paths.write_bytes(f"{bucket_url}/raw/train.jsonl", _generated_jsonl(RAW_BYTES, 1))
  paths.write_bytes(f"{bucket_url}/raw/val.jsonl", _generated_jsonl(200_000, 2))
  tokenizer = f"{bucket_url}/tokenizer.json"
  _prepare_command(
      "tokenizer", f"--inputs={bucket_url}/raw/train.jsonl", "--kind=bpe",
      f"--vocab_size={VOCAB}", f"--tokenizer={tokenizer}",
  )  # fmt: skip
  for name, shards in (("train", 4), ("val", 1)):  # (one shard: no pool of worker processes)
    _prepare_command(
        "shards", f"--inputs={bucket_url}/raw/{name}.jsonl", f"--tokenizer={tokenizer}",
        f"--output={bucket_url}/{name}", f"--shards={shards}", f"--workers={min(shards, 2)}",
        "--noprogress",
    )  # fmt: skip
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
    env = {**os.environ, "XLA_FLAGS": local.xla_flags(2)}
    env |= {"JAX_PLATFORMS": "cpu", "DILOCO_DATA_DIR": str(tmp_path / f"cache{i}")}
    command = train_command(workdir, *flags, f"--process_id={i}", variants="runlocal,mode=dp")
    procs.append(forked.start(command[1:], env, REPO, str(tmp_path / f"log{i}")))
  for p in procs:
    p.wait(300)
  outs = [(tmp_path / f"log{i}").read_text() for i in range(len(procs))]
  assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-4000:] for o in outs)
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def _saved_sha256(workdir: str, step: int) -> str:
  """The parameter hash of checkpoint `step` of the run in `workdir`, its config from config.json
  on one device of this process."""
  config = finished_run.read_config(workdir)
  config.update_from_flattened_dict({"distributed": False, "mesh.fsdp": 1, "mesh.data": 1})
  isl = island_lib.build_island(config, jax.devices()[:1])
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), every=1, set_aside=False)
  saved, state = ckpt.restore(isl.abstract_state())
  ckpt.close()
  assert saved == step
  flat = fragments.flatten(jax.device_get(state.params))
  return metrics.params_sha256({k: np.asarray(v) for k, v in flat.items()})


def test_two_processes_read_their_own_shards_from_a_bucket_and_resume_exactly(tmp_path, bucket):
  m = _prepare(bucket)
  assert m.vocab_size == VOCAB and max(s.max_id for s in m.shards) > 4000  # (8,192 BPE ids used)
  assert sum(s.text_bytes for s in m.shards) > 0.9 * RAW_BYTES
  workdir = str(tmp_path / "run")
  whole = _run(tmp_path, bucket, workdir)
  assert whole["finished"] and whole["data"]["source"] == "corpus"
  assert whole["data"]["vocab_size"] == VOCAB
  # The two processes' readers gave half the global batch each: 12 steps of it in all.
  with open(os.path.join(workdir, "config.json")) as f:
    c = json.load(f)
  assert whole["data"]["mixture"][0]["tokens"] == 12 * c["batch_size"] * c["seq_len"]
  # Each process copied only its shards (round robin: process 0 shards 0 and 2, process 1 the
  # others) into its own cache; the validation corpus, which both score, to both.
  for i, mine in ((0, [0, 2]), (1, [1, 3])):
    cached = sorted(os.listdir(tmp_path / f"cache{i}" / "corpus" / "shards"))
    assert cached == sorted(f"{m.shards[k].sha256[:24]}.array_record" for k in mine), (i, cached)
  # The summary's hash covers the whole model, gathered from both processes of the FSDP island:
  # it is the final checkpoint's, restored here onto one device.
  assert whole["params_sha256"] == _saved_sha256(workdir, 12)
  # Stopped after step 6, as if killed: the checkpoint holds both processes' reader positions.
  shutil.rmtree(os.path.join(workdir, "checkpoints", "12"))
  resumed = _run(tmp_path, bucket, workdir)
  assert resumed["resumed_from_step"] == 6
  assert resumed["params_sha256"] == whole["params_sha256"]
