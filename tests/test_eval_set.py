"""One evaluation set per run config: every mode, batch and number of learners scores the same
records, and the same parameters get the same loss whichever island scores them."""

import jax
import pytest

from configs import shakespeare
from diloco import train
from diloco.config import build, checks
from diloco.inner import evaluation, island as island_lib


def _config(arg: str, batch: int):
  config = checks.prepare(shakespeare.get_config(f"runlocal,{arg}"))
  with config.unlocked():
    config.batch_size = batch
    config.data.eval_sequences, config.data.final_eval_sequences = 48, 100
  return config


def test_dp_and_eight_learners_with_other_batches_score_the_same_bytes_and_loss():
  dp = _config("mode=dp", batch=16)  # one island of 8 devices, 16 sequences a step
  m8 = _config("mode=diloco,learners=8", batch=2)  # learner 0: 1 device, 2 sequences a step
  dp_island = island_lib.build_island(dp, jax.devices())
  m8_island = island_lib.build_island(m8, build.learner_devices(m8)[0])
  assert dp_island.fns.mesh.devices.size == 8 and m8_island.fns.mesh.devices.size == 1
  sets = dp_island.data.eval_set, m8_island.data.eval_set
  assert sets[0].sha256() == sets[1].sha256()
  assert sets[0].sha256(final=True) == sets[1].sha256(final=True)
  assert [len(s.records(final=True)) for s in sets] == [100, 100]
  # Chunks of 64: [64, 36 + 28 pads] on one device; on 8 devices the same (64 divides by 8).
  assert [b["weights_B"].sum() for b in sets[1].batches(final=True)] == [64, 36]
  params = dp_island.init_state().params
  on_m8 = jax.device_put(jax.device_get(params), m8_island.fns.state_shardings.params)
  for final in (False, True):
    a = evaluation.evaluate(dp_island.fns, params, dp_island.data, final)
    b = evaluation.evaluate(m8_island.fns, on_m8, m8_island.data, final)
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-6)
  # What the summaries record.
  described = [train.data_summary(c) for c in (dp, m8)]
  assert described[0] == described[1]
  assert described[0]["final_eval_sha256"] == sets[0].sha256(final=True)
  assert described[0]["final_eval_bytes"] == 100 * dp.seq_len  # the byte tokenizer


def test_padding_does_not_change_the_loss():
  """A chunk size that leaves a padded tail scores what one chunk of every record scores."""
  config = _config("mode=dp", batch=16)
  island = island_lib.build_island(config, jax.devices()[:1])
  params = island.init_state().params
  whole = evaluation.evaluate(island.fns, params, island.data)  # 48 sequences in one chunk
  with config.unlocked():
    config.data.eval_batch_size = 20  # chunks of 20, 20 and 8 + 12 pads
  padded = island_lib.build_island(config, jax.devices()[:1])
  assert len(padded.data.eval_set.batches()) == 3
  again = evaluation.evaluate(padded.fns, params, padded.data)
  assert again["eval_loss"] == pytest.approx(whole["eval_loss"], rel=1e-6)


def test_study_tables_refuse_rows_scored_on_different_sets():
  from diloco.sweeps import eval_sets
  from experiments.studies import ablation_table, scaling_table

  row = dict(status="done", size="s", method="dp", seed=0, eval_loss=1.0, eval_set="a" * 64)
  other = {**row, "name": "method=dp+seed=1", "seed": 1, "eval_set": "b" * 64}
  assert scaling_table.cells([row, {**row, "seed": 1}], {}) == {("s", "dp"): [1.0, 1.0]}
  with pytest.raises(ValueError, match="different evaluation sets .*bbbbbbbbbbbb: method=dp"):
    scaling_table.cells([row, other], {})
  with pytest.raises(ValueError, match="not recorded"):  # an old summary beside a new one
    ablation_table.cells([{**row, "name": "x"}, {**other, "eval_set": None}])
  assert eval_sets.summary_set({"data": {"final_eval_sha256": "c"}}) == "c"
