"""Warm starts: begin a run from the parameters of an earlier run's newest checkpoint.

The DiLoCo paper compares DiLoCo with data-parallel from one pretrained model; `init_from` does
that here. Only the parameters are taken: the inner optimizer, its learning-rate schedule, the
step counter and the data position start fresh, in every mode and runtime.
"""

import os
from typing import Any

import jax
import numpy as np

from diloco.inner import checkpoint


def checkpoint_dir(path: str) -> str:
  """`path/checkpoints` when `path` is a run's workdir, else `path` (a checkpoints directory)."""
  inner = os.path.join(path, "checkpoints")
  found = inner if os.path.isdir(inner) else path
  if not os.path.isdir(found):
    raise FileNotFoundError(f"init_from={path!r}: no such run directory or checkpoints directory")
  return found


def load_params(path: str, abstract_state: Any) -> dict[str, Any]:
  """The newest checkpoint's parameters under `path`, as host numpy arrays.

  `abstract_state` is the TrainState this run would build (shapes, dtypes, shardings). The whole
  state is read, so a checkpoint of another model or inner optimizer does not fit and is refused
  with orbax's description of the first difference.
  """
  directory = checkpoint_dir(path)
  ckpt = checkpoint.Checkpointer(directory, every=1, async_save=False, set_aside=False)
  try:
    step = ckpt.latest_step()
    if step is None:
      raise FileNotFoundError(f"init_from={path!r}: {directory} holds no checkpoint")
    try:
      _, state = ckpt.restore(abstract_state)
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(
          f"init_from={path!r}: the checkpoint at step {step} does not fit this "
          f"run's model and optimizer (same model= and optimizer.name needed): {e}"
      ) from e
  finally:
    ckpt.close()
  params = jax.device_get(state.params)
  bad = [k for k, v in jax.tree_util.tree_leaves_with_path(params) if not np.isfinite(v).all()]
  if bad:
    raise ValueError(
        f"init_from={path!r}: the checkpoint at step {step} has non-finite "
        f"parameters in {jax.tree_util.keystr(bad[0])}"
    )
  return params
