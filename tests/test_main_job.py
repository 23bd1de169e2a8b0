"""The README's main job is in the regime the issue names, its tuning sweep runs exactly its runs,
and the regime study's sweep lists its cells and picks each method's rate."""

import json
import os

import pytest

from configs import shakespeare
from configs.sweeps import main_job, regime
from diloco.config import checks, presets, resolve, shape_check
from diloco.sweeps import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_main_job_is_in_the_papers_regime():
  config = checks.prepare(shakespeare.get_config("mode=compare"))
  runs = resolve.compare_runs(config)
  assert list(runs) == ["dp", "diloco", "decoupled"]
  tokens = {m: r.steps * r.batch_size * r.outer.learners * r.seq_len for m, r in runs.items()}
  tokens["dp"] = runs["dp"].steps * runs["dp"].batch_size * runs["dp"].seq_len
  assert len(set(tokens.values())) == 1  # equal tokens (bytes: the byte tokenizer)
  for mode in ("diloco", "decoupled"):
    r = runs[mode]
    assert 20 <= r.outer.inner_steps <= 50 and r.steps // r.outer.inner_steps >= 100
    assert r.batch_size * r.seq_len >= 1024  # bytes per learner step
  assert tokens["dp"] / shape_check.param_count(config) >= 20  # bytes per parameter
  assert runs["decoupled"].sim.speeds.split(",")[-1] == "3"
  lrs = presets.inner_lrs(config.compare.inner_lrs)
  assert {m: runs[m].optimizer.lr for m in runs} == lrs  # each method at its own tuned rate
  assert {lr for m, lr in lrs.items()} <= set(main_job.LRS)  # ... chosen from the sweep's grid


def test_a_tuning_point_is_the_main_jobs_run_at_that_rate():
  point = main_job.get_config("method=diloco,lr=0.02")
  config = shakespeare.get_config("mode=compare")
  config.compare.inner_lrs, config.progress_bar = "diloco=0.02", False
  run = resolve.compare_runs(checks.prepare(config))["diloco"]
  differ = {k for k in run.to_dict() if point.to_dict()[k] != run.to_dict()[k]}
  assert differ == {"compare"}  # compare.modes only: what the other compared runs are


def test_compare_inner_lrs_are_checked():
  config = shakespeare.get_config("mode=compare")
  config.compare.inner_lrs = "dp=1e-2,streaming=2e-2,diloco=fast"
  with pytest.raises(checks.ConfigError, match="compare.inner_lrs.*'diloco=fast'"):
    checks.prepare(config)
  config.compare.inner_lrs = "dp=1e-2,streaming=2e-2"
  with pytest.raises(checks.ConfigError, match=r"not compared: \['streaming'\]"):
    checks.prepare(config)


def test_regime_cells_and_winners(tmp_path):
  spec = os.path.join(REPO, "configs", "sweeps", "regime.py")
  tune = sweep.points(f"{spec}:part=tune")
  assert len(tune) == 5 * 3 + 7 * 3  # 5 distinct data-parallel runs, 7 DiLoCo cells, 3 rates
  for cell, (t, b, h) in regime.CELLS.items():
    c = regime.get_config(f"steps={t},batch={b},H={h},method=diloco")
    dp = regime.get_config(f"steps={t},batch={b},method=dp")
    assert c.batch_size * 4 == dp.batch_size and c.steps == dp.steps  # the same tokens
  # The centre: 20 outer steps, 1 KB per learner step.
  assert regime.CELLS["centre"][0] // regime.CELLS["centre"][2] == 20
  rows = [
      {**regime.point("tpp17", m, lr, 0), "status": "done", "eval_loss": loss}
      for m, lr, loss in [("dp", 0.01, 2.0), ("dp", 0.02, 1.9), ("diloco", 0.04, 2.1)]
  ]
  assert regime.winners(rows, "tpp17") == {"dp": 0.02, "diloco": 0.04}
  (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  seeds = sweep.points(f"{spec}:part=seeds,winners={tmp_path / 'results.jsonl'}")
  assert [p.values for p in seeds] == [
      {"steps": 120, "batch": 16, "method": "dp", "lr": 0.02, "seed": 1},
      {"steps": 120, "batch": 16, "method": "diloco", "lr": 0.04, "seed": 1, "H": 6},
  ]
