"""Held-out loss and bits per byte."""

import math
from typing import Any

import jax
import numpy as np

from diloco.inner import step as step_lib


def evaluate(fns: step_lib.StepFns, params: Any, data: Any) -> dict[str, float]:
  """Mean loss over the fixed validation batches, and bits per byte of the underlying text."""
  losses = [fns.eval(params, step_lib.put_batch(b, fns.mesh)) for b in data.eval_batches()]
  if not losses:
    raise ValueError("the validation set yields no batch; lower batch_size or seq_len")
  loss = float(np.mean(jax.device_get(losses)))
  return {"eval_loss": loss, "eval_bpb": loss / math.log(2) / data.bytes_per_token}
