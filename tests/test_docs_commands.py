"""The docs' walkthroughs run as written: docs/running.md's own-corpus walkthrough (a Cloud Storage
server on the loopback, a tokenizer, shards, a run, its score and a sample) on a small corpus of
this test's own, from a folder that holds `raw/` and this checkout's `configs/`."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
MARK = "<!-- walkthrough: own corpus -->"
WORDS = "the of and to in a is that for it as was with be by on not he this are".split()


def walkthrough(doc: pathlib.Path = REPO / "docs" / "running.md") -> str:
  """The ```bash block that follows MARK."""
  text = doc.read_text(encoding="utf-8")
  found = re.search(re.escape(MARK) + r"\s*```bash\n(.*?)\n```", text, re.S)
  assert found, f"{doc} has no ```bash block after {MARK}"
  return found.group(1)


def _raw(folder: pathlib.Path) -> None:
  """Two training files and a validation file of random sentences, one document a line."""
  rng = np.random.default_rng(0)
  (folder / "raw").mkdir()
  for name, n in (("train-0", 150), ("train-1", 150), ("val", 40)):
    with open(folder / "raw" / f"{name}.jsonl", "w", encoding="utf-8") as f:
      for _ in range(n):
        words = rng.choice(WORDS, rng.integers(20, 120))
        f.write(json.dumps({"text": " ".join(words).capitalize() + "."}) + "\n")


def test_the_own_corpus_walkthrough_runs_as_written(tmp_path):
  _raw(tmp_path)
  (tmp_path / "configs").symlink_to(REPO / "configs")
  commands = walkthrough()
  # As a user with the project's environment active: `python` is this test's Python.
  env = dict(
      os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
  )
  with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
    proc = subprocess.Popen(
        ["bash", "-x", "-euo", "pipefail", "-c", commands],  # -x: the log names each command
        cwd=tmp_path,
        env=env,
        stdout=out,
        stderr=err,
        start_new_session=True,  # the emulator it starts goes with it, whatever happens
    )
    try:
      proc.wait(timeout=400)
    finally:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
  out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
  assert proc.returncode == 0, err[-3000:]
  assert "gs://my-corpus/train: 2 shards, 300 documents" in out
  assert "gs://my-corpus/val: 1 shards, 40 documents" in out
  scored = re.search(r"gs://my-corpus/runs/first\s+20\s+validation split.*", out)
  assert scored and len(scored.group(0).split()) == 9, out
  said = [l for l in err.splitlines() if not l.startswith("+")]  # (bash's trace of each command)
  assert not [l for l in said if "Traceback" in l or re.match(r"E\d{4} ", l)], err[-3000:]
