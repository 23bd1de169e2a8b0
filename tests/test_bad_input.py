"""Every main refuses a command it cannot run with one line naming the problem and exit 2, with no
traceback and nothing written: each `experiments.*` main and `experiments.prepare` subcommand
given a missing file, a missing bucket or a malformed input (issue 70's findings among them: a
JSON line that does not parse, a bucket that does not exist as prepare's input and as a workdir,
a warm start that is not there)."""

import json
import os
import re
import subprocess
import sys

import pytest

from object_store import gcs_server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NO_BUCKET = "gs://no-such-bucket-here"
RUNLOCAL = f"--config={REPO}/configs/shakespeare.py:runlocal"


def _inputs(d):
  """A small JSON Lines file, one bad line, a file that is not Parquet, a run without a config."""
  (d / "raw").mkdir()
  (d / "raw" / "a.jsonl").write_text(json.dumps({"text": "some words"}) + "\n")
  (d / "bad.jsonl").write_text(json.dumps({"text": "fine"}) + '\n{"text": "x", oops}\n')
  (d / "bad.parquet").write_bytes(b"not parquet at all")
  (d / "run").mkdir()
  (d / "run" / "config.json").write_text("{ half a config")
  (d / "corpus").mkdir()
  (d / "corpus" / "manifest.json").write_text("[]")


# main, arguments (D: this test's directory), what the one line says
CASES = {
    "config/missing file": ("config", ["--config=D/none.py"], "No such file"),
    "train/missing bucket": (
        "train",
        [RUNLOCAL, f"--workdir={NO_BUCKET}/run"],
        f"the bucket {NO_BUCKET} does not exist",
    ),
    "train/malformed corpus": (
        "train",
        [RUNLOCAL, "--config.data.source=corpus", "--config.data.corpus=D/corpus",
         "--config.data.val_corpus=D/corpus", "--workdir=D/out"],
        "corpus/manifest.json is not a corpus manifest",
    ),  # fmt: skip
    "train/missing warm start": (
        "train",
        [RUNLOCAL, "--config.init_from=D/none", "--workdir=D/out"],
        "init_from='D/none': no such run directory",
    ),
    "evaluate/missing file": ("evaluate", ["--workdir=D/none"], "holds no run"),
    "evaluate/malformed": ("evaluate", ["--workdir=D/run"], "config.json is not a run's config"),
    "evaluate/missing bucket": (
        "evaluate",
        [f"--workdir={NO_BUCKET}/run"],
        f"the bucket {NO_BUCKET} does not exist",
    ),
    "sample/missing file": ("sample", ["--workdir=D/none"], "holds no run"),
    "prepare tokenizer/missing file": (
        "prepare",
        ["tokenizer", "--inputs=D/none*.jsonl", "--tokenizer=D/out/t.json"],
        "matches no files",
    ),
    "prepare tokenizer/missing bucket": (
        "prepare",
        ["tokenizer", f"--inputs={NO_BUCKET}/*.jsonl", "--tokenizer=D/out/t.json"],
        f"the bucket {NO_BUCKET} does not exist",
    ),
    "prepare shards/malformed jsonl": (
        "prepare",
        [
            "shards",
            "--inputs=D/bad.jsonl",
            "--tokenizer=T/tok.json",
            "--output=D/out",
            "--shards=1",
        ],
        r"bad.jsonl@\d+: not a JSON line \(Expecting property name .*: column 15\)",
    ),
    "prepare shards/malformed parquet": (
        "prepare",
        ["shards", "--inputs=D/bad.parquet", "--format=parquet", "--tokenizer=T/tok.json",
         "--output=D/out"],
        "bad.parquet: not a readable Parquet file",
    ),  # fmt: skip
    "prepare shards/missing bucket": (
        "prepare",
        ["shards", "--inputs=D/raw/*.jsonl", "--tokenizer=T/tok.json", f"--output={NO_BUCKET}/c"],
        f"the bucket {NO_BUCKET} does not exist",
    ),
    "prepare/no subcommand": ("prepare", ["--inputs=x", "--tokenizer=y"], "say what to prepare"),
    "plan/missing file": ("plan", ["--config=D/none.py", "--topology=v5p-8"], "No such file"),
    "sweep/missing file": ("sweep", ["--config=D/none.py", "--workdir=D/out"], "does not exist"),
    "learner/missing file": (
        "learner",
        ["--config=D/none.py", "--learner_id=0", "--synchronizer=localhost:1", "--workdir=D/out"],
        "No such file",
    ),
    "synchronizer/missing file": (
        "synchronizer",
        ["--config=D/none.py", "--workdir=D/o"],
        "No such",
    ),
    "launch_ray/missing file": (
        "launch_ray",
        ["--config=D/none.py", "--learners=2", "--workdir=D/out"],
        "No such file",
    ),
    "bandwidth/missing file": ("bandwidth", ["--config=D/none.py", "--workdir=D/out"], "No such"),
    "simulate_goodput/missing file": (
        "simulate_goodput",
        ["--config=D/none.py", "--workdir=D/out"],
        "No such file",
    ),
    "chaos_suite/missing file": (
        "chaos_suite",
        ["--config=D/none.py", "--workdir=D/out"],
        "No such file",
    ),
    "supervise/no command": ("supervise", [], "give the command to supervise"),
}


@pytest.fixture(scope="module")
def emulator():
  with gcs_server() as url:
    yield url


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from diloco.data.corpus import tokenizer_files

  d = tmp_path_factory.mktemp("tok")
  tokenizer_files.train("bpe", ["some words and more words"] * 20, 270, str(d / "tok.json"))
  return d


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_command_that_cannot_run_is_one_line_exit_2_and_writes_nothing(
    case, tmp_path, emulator, tokenizer
):
  main, args, says = CASES[case]
  _inputs(tmp_path)
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  args = [a.replace("D/", f"{tmp_path}/").replace("T/", f"{tokenizer}/") for a in args]
  out = subprocess.run(
      [sys.executable, "-m", f"experiments.{main}", *args],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=120,
  )
  bar = re.compile(r"^\s*\d+%\|")  # a progress bar's line (prepare's, before it failed)
  lines = [l for l in out.stderr.splitlines() if l.strip() and not bar.match(l)]
  assert out.returncode == 2, out.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
  assert re.search(says.replace("D/", f"{tmp_path}/"), lines[0]), lines[0]
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
