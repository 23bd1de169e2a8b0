"""Every main refuses a command it cannot run with one line naming the problem and exit 2, with no
traceback and nothing written: each `experiments.*` main and `experiments.prepare` subcommand
given a missing file, a missing bucket or a malformed input (issue 70's findings among them: a
JSON line that does not parse, a bucket that does not exist as prepare's input and as a workdir,
a warm start that is not there)."""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from object_store import gcs_server

HERE = pathlib.Path(__file__).resolve().parent
REPO = str(HERE.parent)
NO_BUCKET = "gs://no-such-bucket-here"
RUNLOCAL = f"--config={REPO}/configs/shakespeare.py:runlocal"


def _inputs(d):
  """A small JSON Lines file, one bad line, a file that is not Parquet, a run whose config does not
  parse, an empty workdir."""
  (d / "raw").mkdir()
  (d / "raw" / "a.jsonl").write_text(json.dumps({"text": "some words"}) + "\n")
  (d / "bad.jsonl").write_text(json.dumps({"text": "fine"}) + '\n{"text": "x", oops}\n')
  (d / "bad.parquet").write_bytes(b"not parquet at all")
  (d / "run").mkdir()
  (d / "run" / "config.json").write_text("{ half a config")
  (d / "empty").mkdir()
  (d / "corpus").mkdir()
  (d / "corpus" / "manifest.json").write_text("[]")
  (d / "bad.py").write_text("def get_config(:\n")
  (d / "raises.py").write_text("def get_config(arg=None):\n  return undefined_name\n")


KINDS = ("missing file", "missing bucket", "malformed")
SUBCOMMANDS = {"prepare": ("tokenizer", "shards")}
CFGS = f"--config={REPO}/configs"
CFG = f"{CFGS}/shakespeare.py"
NONE, BAD = "--config=D/none.py", "--config=D/bad.py"  # a config file not there; one that fails
NOT_FOUND = "No such file|does not exist"
GONE = f"the bucket {NO_BUCKET} does not exist"
SYNTAX = "D/bad.py line 1: SyntaxError: invalid syntax"
LOCAL = "writes with local file calls, so a bucket URL would become a local directory"
NO_RUN = (  # (the whole line)
    r"^error: workdir D/empty holds no run \(no config\.json\); pass the --workdir of a run that "
    r"`python -m experiments\.train` wrote$"
)
TOKEN = "--token_from=env:BAD_INPUT_TOKEN"  # (set for the commands: their token is checked first)


def _three(
    main: str, extra: list[str], bucket: list[str], cfg: str = CFG, bucket_says: str = GONE
) -> dict:
  """A main whose config file is its input: none there, a workdir in a bucket that is not there,
  one that does not parse; a main with a config file of its own (`cfg`) also given another's."""
  cases = {
      f"{main}/missing file": (main, [NONE, *extra], NOT_FOUND),
      f"{main}/missing bucket": (main, [cfg, *bucket], bucket_says),
      f"{main}/malformed": (main, [BAD, *extra], SYNTAX),
  }
  if cfg != CFG:
    cases[f"{main}/another command's config"] = (main, [CFG, *extra], "not a config of this")
  return cases


# "main/kind": (main, arguments (D: this case's directory, T: the tokenizer's), what its line says)
CASES = {
    "config/missing file": ("config", [NONE], NOT_FOUND),
    "config/missing bucket": ("config", [f"--config={NO_BUCKET}/c.py"], NOT_FOUND),
    "config/malformed": ("config", [BAD], SYNTAX),
    "config/unknown key": ("config", [CFG, "--config.stepz=3"], "did you mean 'steps'"),
    "config/unknown variant": ("config", [f"{CFG}:nosuch"], "unknown config variant 'nosuch'"),
    "config/raising config file": ("config", ["--config=D/raises.py"], "line 2: NameError"),
    "train/missing file": (
        "train",
        [RUNLOCAL, "--config.init_from=D/none", "--workdir=D/out"],
        "init_from='D/none': no such run directory",
    ),
    "train/missing bucket": ("train", [RUNLOCAL, f"--workdir={NO_BUCKET}/run"], GONE),
    "train/malformed": (
        "train",
        [RUNLOCAL, "--config.data.source=corpus", "--config.data.corpus=D/corpus",
         "--config.data.val_corpus=D/corpus", "--workdir=D/out"],
        "corpus/manifest.json is not a corpus manifest",
    ),  # fmt: skip
    "train/bucket name": (
        "train",
        [RUNLOCAL, "--workdir=gs://b/run"],
        "gs://b is not a Cloud Storage bucket name",
    ),
    "evaluate/missing file": ("evaluate", ["--workdir=D/none"], "holds no run"),
    "evaluate/missing bucket": ("evaluate", [f"--workdir={NO_BUCKET}/run"], GONE),
    "evaluate/malformed": ("evaluate", ["--workdir=D/run"], "config.json is not a run's config"),
    "evaluate/empty workdir": ("evaluate", ["--workdir=D/empty"], NO_RUN),
    "sample/missing file": ("sample", ["--workdir=D/none"], "holds no run"),
    "sample/missing bucket": ("sample", [f"--workdir={NO_BUCKET}/run"], GONE),
    "sample/malformed": ("sample", ["--workdir=D/run"], "config.json is not a run's config"),
    "sample/empty workdir": ("sample", ["--workdir=D/empty"], NO_RUN),
    "prepare tokenizer/missing file": (
        "prepare",
        ["tokenizer", "--inputs=D/none*.jsonl", "--tokenizer=D/out/t.json"],
        "matches no files",
    ),
    "prepare tokenizer/missing bucket": (
        "prepare",
        ["tokenizer", f"--inputs={NO_BUCKET}/*.jsonl", "--tokenizer=D/out/t.json"],
        GONE,
    ),
    "prepare tokenizer/malformed": (
        "prepare",
        ["tokenizer", "--inputs=D/bad.jsonl", "--tokenizer=D/out/t.json"],
        r"bad.jsonl@\d+: not a JSON line",
    ),
    "prepare shards/missing file": (
        "prepare",
        ["shards", "--inputs=D/raw/*.jsonl", "--tokenizer=D/none.json", "--output=D/out"],
        "none.json",
    ),
    "prepare shards/missing bucket": (
        "prepare",
        ["shards", "--inputs=D/raw/*.jsonl", "--tokenizer=T/tok.json", f"--output={NO_BUCKET}/c"],
        GONE,
    ),
    "prepare shards/malformed": (
        "prepare",
        ["shards", "--inputs=D/bad.jsonl", "--tokenizer=T/tok.json", "--output=D/out",
         "--shards=1"],
        r"bad.jsonl@\d+: not a JSON line \(Expecting property name .*: column 15\)",
    ),  # fmt: skip
    "prepare shards/malformed parquet": (
        "prepare",
        ["shards", "--inputs=D/bad.parquet", "--format=parquet", "--tokenizer=T/tok.json",
         "--output=D/out"],
        "bad.parquet: not a readable Parquet file",
    ),  # fmt: skip
    "prepare/no subcommand": ("prepare", ["--inputs=x", "--tokenizer=y"], "say what to prepare"),
    **_three("plan", ["--topology=v5p-8"], ["--topology=v5p-8", f"--json={NO_BUCKET}/p.json"]),
    **_three("sweep", ["--workdir=D/out"], [f"--workdir={NO_BUCKET}/s"], bucket_says=LOCAL),
    **_three(
        "learner",
        ["--learner_id=0", "--synchronizer=localhost:1", "--workdir=D/out"],
        ["--learner_id=0", "--synchronizer=localhost:1", TOKEN, f"--workdir={NO_BUCKET}/l"],
    ),
    **_three("synchronizer", ["--workdir=D/o"], [TOKEN, f"--workdir={NO_BUCKET}/s"]),
    **_three(
        "launch_ray",
        ["--learners=2", "--workdir=D/out"],
        ["--learners=2", f"--workdir={NO_BUCKET}/r"],
        bucket_says=LOCAL,
    ),
    **_three(
        "bandwidth", ["--workdir=D/out"], [f"--workdir={NO_BUCKET}/b"], f"{CFGS}/bandwidth.py"
    ),
    **_three(
        "simulate_goodput", ["--workdir=D/out"], [f"--workdir={NO_BUCKET}/g"], f"{CFGS}/goodput.py"
    ),
    **_three(
        "chaos_suite",
        ["--workdir=D/out"],
        [f"--workdir={NO_BUCKET}/c"],
        f"{CFGS}/chaos_suite.py",
        bucket_says=LOCAL,
    ),
    "chaos_suite/missing base file": (
        "chaos_suite",
        [f"{CFGS}/chaos_suite.py", "--config.base_file=D/none.py", "--workdir=D/out"],
        "base_file: config file",
    ),
    "supervise/missing file": ("supervise", ["--", "D/none"], "D/none"),
    "supervise/missing bucket": ("supervise", [f"--log={NO_BUCKET}/log.jsonl", "--", "true"], GONE),
    "supervise/malformed": ("supervise", ["--backoff_s=abc", "--", "true"], "--backoff_s"),
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


def _mains() -> list[str]:
  """Every experiments main (a module that runs through config_cli.run), prepare's subcommands
  each on its own."""
  found = []
  for path in sorted(pathlib.Path(REPO, "experiments").glob("*.py")):
    if "config_cli.run(" in path.read_text(encoding="utf-8"):
      subcommands = SUBCOMMANDS.get(path.stem)
      found.extend([f"{path.stem} {s}" for s in subcommands] if subcommands else [path.stem])
  return found


def test_every_main_is_tried_with_each_kind_of_bad_input():
  mains = _mains()
  assert len(mains) >= 15 and "train" in mains and "prepare shards" in mains
  missing = [f"{m}/{k}" for m in mains for k in KINDS if f"{m}/{k}" not in CASES]
  assert not missing, missing


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, emulator, tokenizer):
  """Every case run once, all in one process (tests/bad_input_driver.py: one import of the
  libraries instead of one per main, 17 processes of about 4 s of CPU each); per case its
  directory, the files before, exit code and stderr."""
  root = tmp_path_factory.mktemp("cases")
  batch, runs = [], {}
  for name in sorted(CASES):
    d = root / re.sub(r"\W", "_", name)
    d.mkdir()
    _inputs(d)
    args = [a.replace("D/", f"{d}/").replace("T/", f"{tokenizer}/") for a in CASES[name][1]]
    batch.append({"main": CASES[name][0], "argv": args, "cwd": str(d), "out": str(d) + ".out"})
    runs[name] = {"dir": d, "before": sorted(x.relative_to(d) for x in d.rglob("*"))}
  (root / "cases.json").write_text(json.dumps(batch))
  subprocess.run(
      [sys.executable, str(HERE / "bad_input_driver.py"), "cases.json", "codes.json"],
      cwd=root,
      env={**os.environ, "BAD_INPUT_TOKEN": "a-token"},
      timeout=600,
      check=True,
  )
  codes = json.loads((root / "codes.json").read_text())
  for (name, run), code, b in zip(runs.items(), codes, batch, strict=True):
    run.update(code=code, stderr=pathlib.Path(b["out"] + ".stderr").read_text())
  return runs


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_command_that_cannot_run_is_one_line_exit_2_and_writes_nothing(case, outcomes):
  says = CASES[case][2]
  run = outcomes[case]
  d, stderr = run["dir"], run["stderr"]
  bar = re.compile(r"^\s*\d+%\|")  # a progress bar's line (prepare's, before it failed)
  lines = [l for l in stderr.splitlines() if l.strip() and not bar.match(l)]
  assert run["code"] == 2, stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-2000:]
  assert re.search(says.replace("D/", f"{d}/"), lines[0]), lines[0]
  assert sorted(x.relative_to(d) for x in d.rglob("*")) == run["before"]
