"""JSON Lines that survive a crash mid-write (issue 49, point 6): a torn last line is dropped
when read and cut off before the next append; a run resumes over one."""

import json

import pytest

from configs import shakespeare
from diloco import jsonl, metrics, train


def test_a_torn_last_line_is_dropped_and_cut_before_the_next_row(tmp_path):
  path = str(tmp_path / "rows.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
  assert jsonl.read(path) == [{"step": 1}, {"step": 2}]
  jsonl.append(path, {"step": 3})
  assert open(path).read() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'
  # A whole row that lost only its newline is kept, and the next one starts on its own line.
  with open(path, "a") as f:
    f.write('{"step": 4}')
  assert jsonl.read(path)[-1] == {"step": 4}
  jsonl.append(path, {"step": 5})
  assert [r["step"] for r in jsonl.read(path)] == [1, 2, 3, 4, 5]


def test_a_bad_line_before_the_last_names_the_file_and_line(tmp_path):
  path = str(tmp_path / "rows.jsonl")
  with open(path, "w") as f:
    f.write('{"step": 1}\n{"st\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"rows.jsonl, line 2"):
    jsonl.read(path)


def test_a_run_resumes_over_a_torn_metrics_line(tmp_path):
  """Before, _truncate_after raised JSONDecodeError and the run could not resume."""
  config = shakespeare.get_config("runlocal")
  with config.unlocked():
    config.update_from_flattened_dict({"checkpoint_every": 10, "stop_after_steps": 20})
  workdir = str(tmp_path / "run")
  first = train.train_and_evaluate(config, workdir)
  assert not first["finished"]
  path = f"{workdir}/{metrics.METRICS_FILE}"
  with open(path, "a") as f:
    f.write('{"step": 21, "loss": 2.')  # a crash during a write
  with config.unlocked():
    config.stop_after_steps = 0
  summary = train.train_and_evaluate(config, workdir)
  assert summary["finished"] and summary["resumed_from_step"] == 20
  rows = [json.loads(line) for line in open(path)]  # every line whole again
  assert rows and all("step" in r for r in rows)
