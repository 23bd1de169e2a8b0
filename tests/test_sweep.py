"""experiments.sweep: points from get_sweep, checked first, run, resumed, tabulated."""

import csv
import json
import os

import pytest

from diloco import train
from diloco.sweeps import sweep, sweep_run
from diloco.rpc import forked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A sweep over the scaling study's tiny mode; `bad` adds a point whose run raises at data setup
# (a glob that matches no file passes the config's checks: the files are looked for at run time).
SWEEP_FILE = """
from configs.sweeps import scaling

SWEEP_KEYS = ("eval_loss", "params", "steps")

def get_config(arg=None):  # the toy's own variants (bad, typo, variant) select points only
  kept = [t for t in arg.split(",") if t not in ("bad", "typo", "variant")]
  return scaling.get_config(",".join(kept))

def get_sweep(arg=None):
  if arg and "empty" in arg:  # a staged sweep's closed grid
    return []
  points = [
      {"size": "d8l1", "method": "dp", "seed": 0},
      {"size": "d8l1", "method": "diloco", "learners": 2, "config.outer.lr": 0.5, "seed": 0},
  ]
  if arg and "bad" in arg:
    missing = {"config.data.source": "text_glob", "config.data.text_glob": "/nonexistent/*.txt"}
    points.insert(1, {"size": "d8l1", "method": "dp", **missing, "seed": 0})
  if arg and "typo" in arg:
    points.append({"size": "d8l1", "config.outer.lrr": 0.5})
  if arg and "variant" in arg:
    points.append({"size": "d8l1", "methd": "dp"})
  return points
"""


@pytest.fixture
def sweep_file(tmp_path):
  path = tmp_path / "toy_sweep.py"
  path.write_text(SWEEP_FILE)
  return str(path)


def _spec(path: str, *extra: str) -> str:
  return f"{path}:" + ",".join(("tiny", "part=tune") + extra)


def _read_csv(path):
  with open(path, encoding="utf-8") as f:
    return list(csv.DictReader(f))


def test_point_names_follow_the_overrides_in_order():
  assert sweep.point_name({"size": "d8l1", "config.outer.lr": 0.5, "iid": True}) == (
      "size=d8l1+outer.lr=0.5+iid=true"
  )
  assert sweep.point_name({"a": "x/y z"}) == "a=x_y_z"


def test_a_sweep_file_without_get_config_is_told_what_it_needs(tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("def get_sweep(arg=None):\n  return [{'seed': 0}]\n")
  with pytest.raises(sweep.SweepError, match=r"defines no get_config: a sweep file defines get_co"):
    sweep.points(str(path))


def test_a_long_name_keeps_what_varies_and_a_digest_of_the_rest():
  shared = {"config.data.source": "text_glob", "config.data.text_glob": "/home/me/corpora/**/*.txt"}
  raw = [
      {**shared, "config.data.tokenizer": "sentencepiece", "config.optimizer.lr": lr}
      for lr in (3e-3, 1e-2)
  ]
  keys = sweep.shared_keys(raw)
  assert keys == ["config.data.source", "config.data.text_glob", "config.data.tokenizer"]
  assert len(sweep.point_name(raw[0])) == 110  # every override, as short sweeps keep them
  names = [sweep.point_name(p, keys) for p in raw]
  assert [n.split("~")[0] for n in names] == ["optimizer.lr=0.003", "optimizer.lr=0.01"]
  assert all(len(n.split("~")[1]) == 8 for n in names) and names[0] != names[1]
  assert sweep.point_name({"size": "d8l1", "seed": 0}, ["seed"]) == "size=d8l1+seed=0"  # short


def test_points_split_variants_from_config_keys(sweep_file):
  pts = sweep.points(_spec(sweep_file))
  assert [p.name for p in pts] == [
      "size=d8l1+method=dp+seed=0",
      "size=d8l1+method=diloco+learners=2+outer.lr=0.5+seed=0",
  ]
  p = pts[1]
  assert p.spec == f"{sweep_file}:tiny,part=tune,size=d8l1,method=diloco,learners=2,seed=0"
  assert p.overrides == {"outer.lr": 0.5}
  config = sweep.build_config(p)
  assert (config.mode, config.outer.learners, config.outer.lr) == ("diloco", 2, 0.5)
  assert config.batch_size == 8  # the tiny global batch of 16 over 2 learners
  assert "--config.outer.lr=0.5" in p.command("/tmp/w")


@pytest.mark.parametrize(
    "variant, named", [("typo", "'outer.lrr'"), ("variant", "'methd'")], ids=["key", "variant"]
)
def test_unknown_key_fails_before_anything_runs(sweep_file, tmp_path, monkeypatch, variant, named):
  calls = []
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: calls.append(a))
  workdir = tmp_path / "w"
  with pytest.raises(sweep.SweepError) as e:
    sweep_run.run(_spec(sweep_file, variant), str(workdir), parallel=0, progress=False)
  assert "point 2" in str(e.value) and named in str(e.value)
  assert not calls and not workdir.exists()
  with pytest.raises(sweep.SweepError, match=named):  # a notebook's stage: the same error
    sweep_run.stage(_spec(sweep_file, variant), str(workdir), False, parallel=0, progress=False)


def test_a_stage_without_points_says_so_and_writes_nothing(sweep_file, tmp_path):
  workdir = tmp_path / "w"
  assert sweep_run.stage(_spec(sweep_file, "empty"), str(workdir), False, progress=False) is False
  assert sweep_run.stage(_spec(sweep_file, "empty"), str(workdir), True) is False
  assert not workdir.exists()


def test_two_points_run_then_are_skipped(sweep_file, tmp_path, monkeypatch):
  workdir = str(tmp_path / "w")
  table = sweep_run.run(_spec(sweep_file), workdir, parallel=2, progress=False)
  assert [r["status"] for r in table] == ["done", "done"]
  for r in table:
    with open(os.path.join(workdir, r["name"], "summary.json"), encoding="utf-8") as f:
      assert json.load(f)["eval_loss"] == r["eval_loss"]
  rows = _read_csv(os.path.join(workdir, "results.csv"))
  assert [r["name"] for r in rows] == [r["name"] for r in table]
  assert (
      rows[1]["learners"] == "2"
      and rows[1]["config.outer.lr"] == "0.5"
      and rows[0]["learners"] == ""
  )
  assert rows[0]["steps"] == "12" and int(rows[0]["params"]) > 0
  with open(os.path.join(workdir, "results.jsonl"), encoding="utf-8") as f:
    assert [json.loads(line)["eval_loss"] for line in f] == [r["eval_loss"] for r in table]

  calls = []
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: calls.append(a))
  again = sweep_run.run(_spec(sweep_file), workdir, parallel=0, progress=False)
  assert not calls and again == table


def test_a_failing_point_is_reported_and_the_others_go_on(sweep_file, tmp_path):
  workdir = str(tmp_path / "w")
  table = sweep_run.run(_spec(sweep_file, "bad"), workdir, parallel=0, progress=False)
  assert [r["status"] for r in table] == ["done", "failed", "done"]
  assert "/nonexistent/*.txt" in table[1]["error"] and table[1]["eval_loss"] is None
  with open(os.path.join(workdir, table[1]["name"], "error.txt"), encoding="utf-8") as f:
    assert "Traceback" in f.read()
  assert _read_csv(os.path.join(workdir, "results.csv"))[1]["status"] == "failed"


def test_main_dry_run_prints_one_command_per_point_and_runs_nothing(sweep_file, tmp_path):
  workdir = tmp_path / "w"
  argv = ["-m", "experiments.sweep", f"--config={_spec(sweep_file)}"]
  done = forked.run(argv + [f"--workdir={workdir}", "--dry_run"], dict(os.environ), REPO, 300)
  assert done.returncode == 0, done.stderr[-3000:]
  out = done.stdout.splitlines()
  assert len(out) == 2 and all("-m experiments.train" in line for line in out)
  assert out[1].endswith(
      f"--workdir={workdir}/size=d8l1+method=diloco+learners=2+outer.lr=0.5+seed=0"
  )
  assert not workdir.exists()


def test_main_fails_with_usage_error_naming_the_key(sweep_file, tmp_path):
  argv = ["-m", "experiments.sweep", f"--config={_spec(sweep_file, 'typo')}"]
  proc = forked.run(argv + [f"--workdir={tmp_path / 'w'}"], dict(os.environ), REPO, 300)
  assert proc.returncode != 0 and "outer.lrr" in proc.stderr


def test_scaling_sweep_parts_share_point_names():
  """A cell of the table is the same directory whichever part of the sweep asked for it."""
  spec = os.path.join(REPO, "configs", "sweeps", "scaling.py")
  lrs = "lrs=0.2/0.4/0.6/0.8"
  tune = {p.name for p in sweep.points(f"{spec}:part=tune")}
  table2 = {p.name for p in sweep.points(f"{spec}:part=table2,{lrs}")}
  assert len(tune) == 3 + 4 * 5
  assert "size=d24l2+method=diloco+learners=8+outer_lr=0.8+seed=0" in tune & table2
  with pytest.raises(ValueError, match="lrs"):
    sweep.points(f"{spec}:part=table")


def test_a_summary_key_that_is_also_an_override_keeps_both():
  p = sweep.Point(0, "steps=24", {"steps": 24}, "f.py:steps=24", {})
  (row,) = sweep_run.rows([p], {0: ({"steps": 12, "eval_loss": 1.5}, "")}, ("steps", "eval_loss"))
  assert row == {
      "name": "steps=24",
      "status": "done",
      "steps": 24,
      "summary.steps": 12,
      "eval_loss": 1.5,
      "eval_set": None,  # the summary has no data section
      "error": "",
  }
  (pending,) = sweep_run.rows([p], {}, ("eval_loss",))
  assert pending["status"] == "pending" and pending["eval_loss"] is None


def test_a_runs_harness_scores_sit_beside_its_loss_in_the_table():
  p = sweep.Point(0, "steps=24", {"steps": 24}, "f.py:steps=24", {})
  acc = "harness/shakespeare_line_end/acc"
  summary = {"eval_loss": 1.5, acc: 0.55, acc + "_stderr": 0.016, "harness_padding": 0.01}
  (row,) = sweep_run.rows([p], {0: (summary, "")}, ("eval_loss",))
  assert list(row)[3:6] == ["eval_loss", acc, acc + "_stderr"]
  assert (row[acc], row[acc + "_stderr"]) == (0.55, 0.016) and "harness_padding" not in row


def test_sweeps_sharing_a_workdir_keep_their_tables_apart(sweep_file, tmp_path, monkeypatch):
  workdir = str(tmp_path / "w")
  sweep_run.run(_spec(sweep_file), workdir, parallel=0, progress=False, table="first")
  calls = []
  monkeypatch.setattr(train, "train_and_evaluate", lambda *a, **k: calls.append(a))
  with pytest.raises(sweep.SweepError):
    sweep_run.run(_spec(sweep_file, "typo"), workdir, parallel=0, progress=False, table="second")
  assert sorted(os.listdir(workdir))[:2] == ["first.csv", "first.jsonl"] and not calls
  assert not os.path.exists(os.path.join(workdir, "results.csv"))


def test_export_copies_finished_summaries_without_their_workdir(tmp_path):
  src, dest = tmp_path / "runs", tmp_path / "results"
  for name, summary in (("a=1", {"eval_loss": 2.5, "workdir": "/machine/path"}), ("a=2", None)):
    (src / name).mkdir(parents=True)
    if summary is not None:
      (src / name / "summary.json").write_text(json.dumps(summary))
  assert sweep_run.export(str(src), str(dest)) == 1  # a=2 has not finished
  assert json.loads((dest / "a=1" / "summary.json").read_text()) == {"eval_loss": 2.5}
  assert not (dest / "a=2").exists()


def test_a_notebooks_stager_prefixes_tiny_and_names_the_table(sweep_file, tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(sweep_run, "stage", lambda spec, *a, **k: calls.append((spec, a, k)) or True)
  path = str(sweep_file)
  sweep_run.stager(path, "W", True, tiny=True, parallel=0)("part=tune", "tune")
  sweep_run.stager(path, "W", False)("part=seeds", "seeds")
  assert calls == [
      (f"{path}:tiny,part=tune", ("W", True), dict(parallel=0, table="tune")),
      (f"{path}:part=seeds", ("W", False), dict(table="seeds")),
  ]


def test_a_worker_whose_sweep_has_exited_runs_nothing_more(sweep_file, tmp_path):
  # A pool worker outlives a killed sweep and still reads the points queued for it: it must not
  # train them (with the code it imported then) nor write anything.
  (point,) = sweep.points(_spec(sweep_file))[:1]
  workdir = tmp_path / "runs"
  summary, err = sweep_run._worker(point, str(workdir), parent=os.getppid() + 1)
  assert summary is None and "has exited" in err and not workdir.exists()
