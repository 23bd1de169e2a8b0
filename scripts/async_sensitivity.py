"""How far the Async Local-SGD table's final eval loss moves when the outer learning rate moves by
a rounding-sized amount: one point of `configs/sweeps/async_regime.py` (toy=1) trained again at
outer lr x (1 + eps), from the same pretrained start.

  python scripts/async_sensitivity.py --method=sync --init_from=runs/async_toy/stage=pretrain
  python scripts/async_sensitivity.py --method=dn --init_from=runs/async_toy/stage=pretrain

It prints one JSON line: the point, the lr, the final eval loss and the parameters' sha256; compare
it with the same point's checked-in summary (notebooks/results/async_toy/). At equal speeds
Delayed Nesterov reduces to synchronous DiLoCo in exact arithmetic (tests/test_restart_window.py);
its float rounding differs (two subtractions for one), and this measures what such a difference
grows to over the run.
"""

import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

from absl import app, flags

from configs.sweeps import async_regime
from diloco import train

METHOD = flags.DEFINE_string("method", "sync", "the point's method (configs/sweeps/async.py)")
HETERO = flags.DEFINE_string("hetero", "none", "the point's heterogeneity level")
LR = flags.DEFINE_float("outer_lr", 0.4, "the point's outer learning rate")
EPS = flags.DEFINE_float("eps", 1e-6, "relative change of the outer learning rate")
INIT = flags.DEFINE_string("init_from", None, "the pretraining run's workdir", required=True)


def main(argv):
  del argv
  if not os.path.isfile(os.path.join(INIT.value, "summary.json")):
    raise SystemExit(f"--init_from={INIT.value!r}: no finished pretraining run (summary.json)")
  point = f"toy=1,method={METHOD.value},hetero={HETERO.value},outer_lr={LR.value}"
  c = async_regime.get_config(point)
  c.outer.lr = LR.value * (1 + EPS.value)
  c.init_from = os.path.abspath(INIT.value)
  with tempfile.TemporaryDirectory() as workdir:
    s = train.train_and_evaluate(c, workdir)
  out = dict(point=point, outer_lr=c.outer.lr, eval_loss=s["eval_loss"])
  print(json.dumps(out | {"params_sha256": s["params_sha256"]}))


if __name__ == "__main__":
  app.run(main)
