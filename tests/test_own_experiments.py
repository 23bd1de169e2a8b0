"""README "Your own experiments": its sweep file and command, run as written from a folder outside
the repository on a generated corpus; summary.json's `data`; validation files that are training
files refused when the config is checked."""

import csv
import hashlib
import json
import os
import pathlib
import random
import re
import shlex
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import train
from diloco.config import checks
from diloco.data import batching, pipeline, sources
from diloco.inner import island as island_lib
from diloco.rpc import local

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORDS = "the quick brown fox jumps over a lazy dog while birds sing in tall green trees".split()


def _section() -> str:
  readme = (ROOT / "README.md").read_text(encoding="utf-8")
  return readme.split("\n## Your own experiments\n", 1)[1].split("\n## ", 1)[0]


def _readme_sweep() -> tuple[str, list[str]]:
  """The section's sweep file (its python block) and its sweep command."""
  section = _section()
  (sweep_file,) = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "get_sweep" in b]
  (command,) = [l for l in section.splitlines() if l.startswith("python -m experiments.sweep")]
  return sweep_file, shlex.split(command)


def _write_corpus(folder: pathlib.Path, files: int = 10) -> None:
  """`files` text files of a few kB in two sub-folders (seeded)."""
  rng = random.Random(0)
  for i in range(files):
    lines = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "." for _ in range(50)]
    path = folder / "abcd"[i % 2] / f"doc{i}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_the_readme_sweep_runs_from_a_folder_outside_the_repository(tmp_path):
  assert ROOT not in tmp_path.parents
  _write_corpus(tmp_path / "corpus")
  sweep_file, command = _readme_sweep()
  assert "from configs import shakespeare" in sweep_file
  (tmp_path / "my_sweep.py").write_text(sweep_file, encoding="utf-8")
  # The installed packages only, on one CPU device (as on a laptop; 8 fake ones compile slower),
  # with the suite's XLA flags, whose programs its compilation cache holds (38 s in the recorded
  # suite with XLA's defaults, 16 s alone with these).
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["XLA_FLAGS"] = local.xla_flags(1)
  env["DILOCO_DATA_DIR"] = str(tmp_path / "cache")  # the tokenizer's cache
  args = [sys.executable, *command[1:], "--parallel=0", "--progress_bar=False"]
  proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  workdir = tmp_path / "runs" / "lr"
  with open(workdir / "results.csv", newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  assert [r["status"] for r in rows] == ["done"] * 3
  assert sorted(float(r["config.optimizer.lr"]) for r in rows) == [3e-3, 1e-2, 3e-2]
  data = [json.loads((workdir / r["name"] / "summary.json").read_text())["data"] for r in rows]
  assert {(d["source"], d["tokenizer"]) for d in data} == {("text_glob", "sentencepiece")}
  assert len({d["eval_sha256"] for d in data}) == 1 and data[0]["eval_sequences"] > 0
  assert data[0]["train_documents"] == 9 and data[0]["val_documents"] == 1  # the last 10%
  assert 256 < data[0]["vocab_size"] <= 512
  assert data[0]["train_tokens"] < data[0]["train_bytes"]  # BPE pieces of several bytes


def test_summary_data_reads_the_corpus_once_and_hashes_what_evaluation_scores(
    tmp_path, monkeypatch
):
  _write_corpus(tmp_path / "corpus", files=4)
  config = shakespeare.get_config("runlocal")
  config.data.source, config.data.text_glob = "text_glob", str(tmp_path / "corpus/**/*.txt")
  config.data.eval_sequences, config.data.final_eval_sequences = 0, 16
  reads, islands = [], []
  read_text = pipeline._LOADERS["text_glob"]
  monkeypatch.setitem(pipeline._LOADERS, "text_glob", lambda *a: reads.append(1) or read_text(*a))
  build = lambda c, _: islands.append(island_lib.build_island(c, jax.devices())) or {}
  monkeypatch.setitem(train.MODES, "dp", build)  # mode=dp's island, built as dp.run builds it
  data = train.train_and_evaluate(config, str(tmp_path / "run"))["data"]
  assert len(reads) == 1  # the island and the summary share one read and tokenization
  texts = sorted((tmp_path / "corpus").rglob("*.txt"))
  assert data["val_bytes"] == data["val_tokens"] == texts[-1].stat().st_size
  n = (data["val_tokens"] - 1) // 32  # every complete sequence of 32 bytes
  assert data["train_documents"] == 3 and data["eval_sequences"] == n
  assert (data["final_eval_sequences"], data["final_eval_tokens"]) == (16, 16 * 32)
  (scored,) = islands[0].data.eval_set.batches(final=True, multiple=1)
  assert scored["inputs_BxL"].shape == (64, 32)  # data.eval_batch_size: 16 records, 48 pads
  assert scored["weights_B"].tolist() == [1] * 16 + [0] * 48
  scored = [{k: v[:16] for k, v in scored.items()}]
  val = np.frombuffer(texts[-1].read_bytes(), np.uint8)
  record = 3 * n // 32  # the middle of the second of 16 strata: (2 * 1 + 1) * n // (2 * 16)
  np.testing.assert_array_equal(scored[0]["targets_BxL"][1], val[record * 32 + 1 :][:32])
  digest = hashlib.sha256()
  for name in ("inputs_BxL", "targets_BxL"):
    digest.update(f"{name}:<i4:(32,);".encode())
    digest.update(np.concatenate([b[name] for b in scored]).tobytes())
  assert data["final_eval_sha256"] == digest.hexdigest()


def test_eval_hash_changes_with_the_sequences_scored():
  packed = sources.PackedTokenSource(np.arange(200, dtype=np.int32) % 97, seq_len=8)

  def digest(sequences: int) -> str:
    return batching.eval_set_sha256(packed, batching.eval_sample(len(packed), sequences))

  assert digest(8) == digest(8) and digest(0) == digest(24) == digest(100)  # 24: all of them
  assert len({digest(4), digest(8), digest(0)}) == 3


def _text_config(train_glob: str, val_glob: str):
  config = shakespeare.get_config("runlocal")
  config.data.source, config.data.text_glob, config.data.val_text_glob = (
      "text_glob",
      train_glob,
      val_glob,
  )
  return config


def test_validation_files_that_are_training_files_are_refused(tmp_path):
  _write_corpus(tmp_path / "corpus", files=4)
  everything, held_out = str(tmp_path / "corpus/**/*.txt"), str(tmp_path / "corpus/b/*.txt")
  with pytest.raises(checks.ConfigError, match=r"data.val_text_glob=.*matches .*/b/doc1\.txt"):
    checks.prepare(_text_config(everything, held_out))
  assert checks.prepare(_text_config(str(tmp_path / "corpus/a/*.txt"), held_out))
  with pytest.raises(checks.ConfigError, match="is data.text_glob"):
    checks.prepare(_text_config(held_out, held_out))
  sources.write_array_record(tmp_path / "t-0.arrayrecord", [[1, 2, 3]])
  config = shakespeare.get_config("runlocal")
  config.data.source = "array_record"
  config.data.array_record_glob = str(tmp_path / "t-*.arrayrecord")
  config.data.val_array_record_glob = str(tmp_path / "t-0.arrayrecord")
  with pytest.raises(checks.ConfigError, match=r"val_array_record_glob.*t-0\.arrayrecord"):
    checks.prepare(config)
