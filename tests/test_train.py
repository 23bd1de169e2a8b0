"""End to end: the main, outputs, resume, config errors and the NaN guard."""

import json
import os

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.inner import checkpoint, island as island_lib
from diloco.rpc import forked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY_KEYS = {
    "mode",
    "steps",
    "tokens",
    "params",
    "flops_per_token",
    "eval_loss",
    "eval_bpb",
    "wall_s",
    "tokens_per_s",
    "tokens_per_s_per_chip",
    "mfu",
    "peak_source",
}
ROW_KEYS = {
    "step",
    "tokens",
    "loss",
    "lr",
    "tokens_per_s",
    "tokens_per_s_per_chip",
    "mfu",
    "wall_s",
}


def _run_main(*args):
  return forked.run(["-m", "experiments.train", *args], dict(os.environ), REPO, timeout=600)


def test_runlocal_through_the_main_writes_valid_outputs(tmp_path):
  proc = _run_main("--config=configs/shakespeare.py:runlocal", f"--workdir={tmp_path}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "eval_bpb" in proc.stdout and str(tmp_path) in proc.stdout
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert SUMMARY_KEYS <= set(summary)
  assert summary["mode"] == "dp" and summary["steps"] == 40 and summary["tokens"] == 40 * 8 * 32
  assert summary["eval_loss"] < summary["first_loss"]
  assert summary["eval_bpb"] == pytest.approx(summary["eval_loss"] / np.log(2))
  # MFU against this CPU's measured matmul peak: the run's FLOP/s over it
  run_flops = summary["tokens_per_s"] * summary["flops_per_token"]
  assert summary["mfu"] == pytest.approx(run_flops / summary["peak_flops_per_s"])
  assert 0 < summary["mfu"] < 1 and "cpu float32 matmul measured" in summary["peak_source"]
  rows = metrics.read_jsonl(tmp_path / "metrics.jsonl")
  train_rows = [r for r in rows if "loss" in r]
  eval_rows = [r for r in rows if "eval_loss" in r]
  assert all(ROW_KEYS <= set(r) for r in train_rows)
  assert [r["step"] for r in train_rows] == list(range(5, 41, 5))
  assert [r["step"] for r in eval_rows] == [20, 40]
  assert {"eval_loss", "eval_bpb"} <= set(eval_rows[-1])
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(tmp_path / "tb"))


def test_unknown_override_key_fails_clearly(tmp_path):
  proc = _run_main(
      "--config=configs/shakespeare.py:runlocal",
      f"--workdir={tmp_path}",
      "--config.optimizer.lrr=0.1",
  )
  assert proc.returncode == 2  # config_cli.USAGE_ERROR: one line, no traceback
  assert proc.stderr.strip().splitlines() == [
      "error: --config.optimizer.lrr: unknown config key 'optimizer.lrr'; did you mean "
      "'optimizer.lr'? (python -m experiments.config lists every key)"
  ]
  assert not (tmp_path / "summary.json").exists()


def test_unknown_variant_fails_clearly():
  with pytest.raises(ValueError, match="unknown config variant 'modle'"):
    shakespeare.get_config("modle=tiny")
  with pytest.raises(ValueError, match="not a int"):
    shakespeare.get_config("steps=many")
  config = shakespeare.get_config("runlocal")
  with pytest.raises(AttributeError, match="lrr"):
    config.optimizer.lrr = 0.1


def _final_params(config, workdir):
  isl = island_lib.build_island(config, jax.devices())
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), config.checkpoint_every)
  step, state = ckpt.restore(isl.abstract_state())
  ckpt.close()
  return step, jax.device_get(state.params)


def test_resume_reproduces_the_uninterrupted_run_exactly(tmp_path):
  config = shakespeare.get_config("runlocal")
  full = train.train_and_evaluate(config, str(tmp_path / "full"))

  with config.unlocked():
    config.stop_after_steps = 25  # preempted after step 25; the checkpoint of step 20 is older
  part = train.train_and_evaluate(config, str(tmp_path / "split"))
  assert part["steps"] == 25 and not part["finished"]
  with config.unlocked():
    config.stop_after_steps = 0
  rest = train.train_and_evaluate(config, str(tmp_path / "split"))
  assert rest["resumed_from_step"] == 25 and rest["finished"]

  step_a, params_a = _final_params(config, str(tmp_path / "full"))
  step_b, params_b = _final_params(config, str(tmp_path / "split"))
  assert step_a == step_b == 40
  jax.tree.map(np.testing.assert_array_equal, params_a, params_b)
  assert rest["eval_loss"] == full["eval_loss"]
  rows_a = [r for r in metrics.read_jsonl(tmp_path / "full" / "metrics.jsonl") if "loss" in r]
  rows_b = [r for r in metrics.read_jsonl(tmp_path / "split" / "metrics.jsonl") if "loss" in r]
  assert [(r["step"], r["loss"]) for r in rows_a] == [(r["step"], r["loss"]) for r in rows_b]


def test_non_finite_loss_stops_the_run_with_a_clear_message(tmp_path):
  config = shakespeare.get_config("runlocal")
  config.optimizer.lr = 1e6
  config.optimizer.clip_norm = 0.0
  with pytest.raises(FloatingPointError, match=r"loss is (nan|inf) at step \d+"):
    train.train_and_evaluate(config, str(tmp_path))
  assert not (tmp_path / "summary.json").exists()


def test_compare_mode_prints_a_table_and_draws_the_plot(tmp_path, capsys):
  config = shakespeare.get_config("runlocal,mode=compare")
  assert config.sim.speeds == "1,3"  # runlocal: 2 learners, the last 3x slower
  summary = train.train_and_evaluate(config, str(tmp_path))
  runs = summary["runs"]
  assert list(runs) == ["dp", "diloco", "decoupled"]
  assert len({r["tokens"] for r in runs.values()}) == 1  # one token budget
  assert runs["dp"]["sim_time_s"] == 40 * 3.0  # 40 steps at the slowest island's pace
  # Synchronous DiLoCo waits for the slow learner; Decoupled DiLoCo does not.
  assert runs["decoupled"]["sim_time_s"] < 0.75 * runs["diloco"]["sim_time_s"]
  assert runs["decoupled"]["goodput"] > runs["diloco"]["goodput"]
  out = capsys.readouterr().out
  for mode in runs:
    assert mode in out and mode in summary["table"]
  png = tmp_path / "compare.png"
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
  assert json.loads((tmp_path / "summary.json").read_text())["mode"] == "compare"
  # The held-out Shakespeare task beside the loss (eval.harness_tasks, runlocal: 100 items), with
  # its standard error, scored on the final global model of each run: for Decoupled DiLoCo the
  # number the synchronizer's final global parameters give, read back from its workdir.
  acc = "harness/shakespeare_line_end/acc"
  assert "shakespeare_line_end acc" in summary["table"].splitlines()[0]
  from diloco.harness import model as harness_model, tasks
  from diloco.runners import finished_run

  for mode, r in runs.items():
    assert f"{r[acc]:.3f} ±{r[acc + '_stderr']:.3f}" in summary["table"]
    rows = [x for x in metrics.read_jsonl(str(tmp_path / mode / "metrics.jsonl")) if acc in x]
    assert [x["final"] for x in rows] == [True]  # harness_every=0: the final evaluation only
  run = finished_run.open_run(str(tmp_path / "decoupled"))
  lm = harness_model.JaxLM.from_run(run)
  again = tasks.scores(tasks.run(lm, tasks.resolve(config.eval.harness_tasks), limit=100))
  assert again["shakespeare_line_end"]["value"] == runs["decoupled"][acc]


@pytest.mark.parametrize("delivery", ["replace", "rebase"])
def test_a_learners_non_finite_loss_stops_a_multi_learner_run(delivery, tmp_path):
  config = shakespeare.get_config("runlocal,mode=decoupled")
  config.optimizer.lr = 1e6
  config.optimizer.clip_norm = 0.0
  config.outer.delivery = delivery  # (under rebase the NaN reaches an upload before a log row)
  stop = r"learner \d: (loss is (nan|inf)|fragment \d+ is not finite) at step \d+"
  with pytest.raises(FloatingPointError, match=stop):
    train.train_and_evaluate(config, str(tmp_path))
  assert not (tmp_path / "summary.json").exists()
