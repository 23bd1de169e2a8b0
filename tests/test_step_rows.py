"""What a run's metric rows carry beside the loss: the objective's auxiliary terms."""

import os

from configs import shakespeare
from diloco import metrics, train


def test_aux_terms_are_the_routing_stats_and_the_output_z_loss():
  step = {"loss": 2.0, "lr": 1e-3, "moe_dropped": 0.25, "z_loss": 4.5, "grad_norm": 1.0}
  assert metrics.aux_terms(step) == {"moe_dropped": 0.25, "z_loss": 4.5}


def test_a_run_with_an_output_z_loss_logs_it(tmp_path):
  """The learners' rows of a multi-learner run (mode=dp writes its rows through the same
  `aux_terms`)."""
  config = shakespeare.get_config("runlocal,mode=decoupled")
  config.model.z_loss, config.steps, config.progress_bar = 1e-4, 10, False
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(config, workdir)
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  logged = [v for r in rows for k, v in r.items() if k.endswith("z_loss")]
  # log Z of 256 near-uniform logits is about ln 256 = 5.5 at the start: z_loss ~ 30, positive.
  assert logged and all(v > 0 for v in logged)
