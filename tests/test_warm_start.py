"""Warm starts (`init_from`): params from an earlier run's checkpoint, everything else fresh."""

import os

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.config import build
from diloco.inner import checkpoint, island as island_lib, warm_start
from diloco.outer import fragments


def _config(arg, **overrides):
  """shakespeare.get_config(arg) with dotted-key overrides (`model__num_layers=3`)."""
  config = shakespeare.get_config(arg)
  config.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
  return config


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A finished runlocal dp run (40 steps): its workdir and final params."""
  workdir = str(tmp_path_factory.mktemp("source"))
  config = _config("runlocal")
  summary = train.train_and_evaluate(config, workdir)
  isl = island_lib.build_island(config, jax.devices())
  ckpt = checkpoint.Checkpointer(warm_start.checkpoint_dir(workdir), every=1)
  step, state = ckpt.restore(isl.abstract_state())
  ckpt.close()
  assert step == 40
  return workdir, summary, fragments.flatten(jax.device_get(state.params))


def _assert_bits(a, b):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(
        np.asarray(a[k]).view(np.uint32), np.asarray(b[k]).view(np.uint32), err_msg=k
    )


def test_an_island_starts_from_the_checkpoints_params_with_a_fresh_optimizer(source):
  workdir, _, params = source
  isl = island_lib.build_island(_config("runlocal", init_from=workdir), jax.devices()[:2])
  state = isl.init_state()
  _assert_bits(fragments.flatten(jax.device_get(state.params)), params)
  assert int(state.step) == 0
  mu = jax.tree.leaves(jax.device_get(state.opt_state[1][0].mu))  # (clip, adamw) chain
  assert mu and all(not np.any(m) for m in mu)
  # The warm start is not consumed: a second fresh state (a learner rejoining) has it again.
  _assert_bits(fragments.flatten(jax.device_get(isl.init_state().params)), params)


@pytest.fixture(scope="module")
def warm_diloco(source, tmp_path_factory):
  """A runlocal DiLoCo run warm-started from `source`: its parts, summary and workdir."""
  config = _config("runlocal,mode=diloco", init_from=source[0])
  parts, tmp_path = build.local_learners(config), tmp_path_factory.mktemp("warm")
  return parts, train.train_and_evaluate(config, str(tmp_path), parts=parts), tmp_path


def test_diloco_starts_its_synchronizer_and_learners_from_the_checkpoint(source, warm_diloco):
  workdir, cold, params = source
  parts, warm, tmp_path = warm_diloco
  _assert_bits(parts.params0, params)  # what the synchronizer starts from
  # The learners start from the model the source run took 40 steps to reach: at step 5 their
  # training losses are already below the source run's at step 5, and its final eval loss.
  first = lambda rows: {r["loss"] for r in rows if r.get("step") == 5 and "loss" in r}
  warm_losses = first(metrics.read_jsonl(tmp_path / "metrics.jsonl"))
  (cold_loss,) = first(metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  assert len(warm_losses) == 2 and max(warm_losses) < cold_loss - 0.5, (warm_losses, cold_loss)
  assert warm["eval_loss"] < cold["eval_loss"]


def test_a_checkpoint_of_another_model_is_refused_by_name(source):
  workdir, _, _ = source
  with pytest.raises(ValueError, match=r"init_from=.*does not fit this run's model"):
    island_lib.build_island(
        _config("runlocal", init_from=workdir, model__num_layers=3), jax.devices()[:1]
    )


def test_a_missing_or_empty_directory_is_refused(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such run directory"):
    warm_start.checkpoint_dir(str(tmp_path / "nope"))
  with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
    island_lib.build_island(_config("runlocal", init_from=str(tmp_path)), jax.devices()[:1])


def test_a_loop_models_checkpoint_loads_into_the_scanned_model_and_back(source, tmp_path):
  workdir, _, params = source
  scanned = island_lib.build_island(_config("runlocal", model__scan_layers=True), jax.devices()[:1])
  ckpt = checkpoint.Checkpointer(warm_start.checkpoint_dir(workdir), every=1, set_aside=False)
  step, state = ckpt.restore(scanned.abstract_state())  # saved per block, read stacked
  ckpt.close()
  assert step == 40 and "layers" in state.params and "blocks" not in state.params
  _assert_bits(fragments.flatten(jax.device_get(state.params)), params)
  mu = state.opt_state[1][0].mu["layers"]["attn"]["out"]  # the optimizer's state is stacked too
  assert mu.shape[0] == 2 and np.any(np.asarray(mu))
  # ...and a scanned model's checkpoint loads into the loop's
  back = checkpoint.Checkpointer(str(tmp_path), every=1, async_save=False)
  back.save(40, state, force=True)
  loop = island_lib.build_island(_config("runlocal"), jax.devices()[:1])
  step, state = back.restore(loop.abstract_state())
  back.close()
  assert sorted(state.params["blocks"]) == [0, 1]
  _assert_bits(fragments.flatten(jax.device_get(state.params)), params)
  np.testing.assert_array_equal(state.opt_state[1][0].mu["blocks"][1]["attn"]["out"], mu[1])


def test_diloco_runs_the_scanned_model_as_the_loops(source, warm_diloco, tmp_path):
  workdir, _, params = source
  config = _config("runlocal,mode=diloco", init_from=workdir, model__scan_layers=True)
  parts = build.local_learners(config)
  scanned = train.train_and_evaluate(config, str(tmp_path), parts=parts)
  _assert_bits(parts.params0, params)  # the synchronizer sees the blocks one by one
  # the same run as the loop's but for the order of float operations inside the scan
  assert scanned["eval_loss"] == pytest.approx(warm_diloco[1]["eval_loss"], rel=1e-4)
  assert scanned["eval_loss"] != warm_diloco[1]["eval_loss"]  # (it did run the scan)
