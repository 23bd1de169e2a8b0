"""A finished run read back (experiments.evaluate and experiments.sample): its own final
evaluation reproduced, any text evaluated, text sampled per seed (a workdir that holds no run:
tests/test_bad_input.py)."""

import json
import math
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import shakespeare
from diloco import metrics, train
from diloco.data import pipeline
from diloco.inner import warm_start
from diloco.outer import fragments
from diloco.recovery import workdir as workdir_lib
from diloco.runners import finished_run


def _finished(tmp_path_factory, arg: str) -> tuple[str, dict]:
  workdir = str(tmp_path_factory.mktemp(arg.replace(",", "_").replace("=", "_")))
  config = shakespeare.get_config(arg)
  with config.unlocked():
    config.progress_bar = False
  return workdir, train.train_and_evaluate(config, workdir)


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
  """A finished runlocal dp run (40 steps of the tiny model)."""
  return _finished(tmp_path_factory, "runlocal")


@pytest.fixture(scope="module")
def decoupled_run(tmp_path_factory):
  """A finished runlocal Decoupled DiLoCo run (2 learners, virtual runtime)."""
  return _finished(tmp_path_factory, "runlocal,mode=decoupled")


@pytest.mark.parametrize("which", ["dp_run", "decoupled_run"])
def test_evaluate_reproduces_the_runs_final_evaluation(which, request):
  workdir, summary = request.getfixturevalue(which)
  run = finished_run.open_run(workdir)
  row = finished_run.evaluate(run)
  assert run.step == 40 and row["sequences"] == 64  # runlocal: data.final_eval_sequences
  assert row["eval_sha256"] == summary["data"]["final_eval_sha256"]
  assert row["eval_loss"] == pytest.approx(summary["eval_loss"], rel=1e-6)
  assert row["eval_bpb"] == pytest.approx(summary["eval_bpb"], rel=1e-6)
  # The parameters read are the run's final ones, bit for bit.
  assert metrics.params_sha256(fragments.flatten(run.params)) == summary["params_sha256"]


def test_a_decoupled_run_saves_its_final_global_parameters_for_init_from(decoupled_run):
  workdir, summary = decoupled_run
  assert os.listdir(os.path.join(workdir, "checkpoints", warm_start.FINAL)) == ["40"]
  run = finished_run.open_run(workdir)
  params = warm_start.load_params(workdir, run.island.abstract_state())
  assert metrics.params_sha256(fragments.flatten(params)) == summary["params_sha256"]


def test_a_glob_of_the_validation_text_scores_as_the_validation_split(dp_run, tmp_path):
  workdir, summary = dp_run
  run = finished_run.open_run(workdir)
  val = pipeline.load_splits(run.config.data).val.tokens  # bytes: the byte tokenizer
  (tmp_path / "val.txt").write_bytes(np.asarray(val).tobytes())
  (tmp_path / "other.txt").write_bytes(b"To be, or not to be, that is the question.\n" * 30)
  same = finished_run.evaluate(run, str(tmp_path / "val.txt"))
  assert same["eval_loss"] == pytest.approx(summary["eval_loss"], rel=1e-6)
  other = finished_run.evaluate(run, str(tmp_path / "other.txt"))
  assert math.isfinite(other["eval_bpb"]) and other["eval_bpb"] > 0
  assert other["eval_bpb"] == pytest.approx(other["eval_loss"] / math.log(2))  # 1 byte a token
  assert other["eval_loss"] != pytest.approx(same["eval_loss"], rel=1e-3)
  with pytest.raises(finished_run.InputError, match="cannot fill one sequence of seq_len=32"):
    (tmp_path / "short.txt").write_bytes(b"x" * 20)
    finished_run.evaluate(run, str(tmp_path / "short.txt"))


def test_sample_is_the_same_text_for_a_seed_and_another_for_another(dp_run):
  run = finished_run.open_run(dp_run[0])
  args = dict(prompt="ROMEO:", tokens=80, temperature=0.8, top_k=40)  # 6 + 80 > max_len 64
  ids0, text0 = finished_run.sample(run, **args, seed=0)
  again, text_again = finished_run.sample(run, **args, seed=0)
  ids1, _ = finished_run.sample(run, **args, seed=1)
  assert ids0.shape == (80,) and text_again == text0 and np.array_equal(ids0, again)
  assert len(text0.encode("utf-8", errors="surrogateescape")) >= 80
  assert not np.array_equal(ids0, ids1)
  # Temperature 0 is greedy: the first token is the argmax of the model's logits on the prompt.
  greedy, _ = finished_run.sample(run, "ROMEO:", 1, temperature=0.0, top_k=0, seed=5)
  model = nnx.merge(run.island.fns.graphdef, jax.device_put(run.params))
  logits = model(np.frombuffer(b"ROMEO:", np.uint8).astype(np.int32)[None])
  assert greedy[0] == int(np.argmax(logits[0, -1]))


def test_a_compare_workdir_names_its_runs(tmp_path):
  (tmp_path / "config.json").write_text(
      json.dumps({"mode": "compare", "compare": {"modes": "dp,decoupled"}})
  )
  assert finished_run.run_dirs(str(tmp_path)) == [str(tmp_path / "dp"), str(tmp_path / "decoupled")]
  with pytest.raises(workdir_lib.WorkdirError, match="pick one of .*dp, .*decoupled"):
    finished_run.open_run(str(tmp_path))
