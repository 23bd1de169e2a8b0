"""Warm starts: begin a run from the parameters of an earlier run's newest checkpoint.

The DiLoCo paper compares DiLoCo with data-parallel from one pretrained model; `init_from` does
that here. Only the parameters are taken: the inner optimizer, its learning-rate schedule, the
step counter and the data position start fresh, in every mode and runtime. A data-parallel run's
newest checkpoint holds its whole train state; a multi-learner run of the virtual runtime ends by
saving its synchronizer's global parameters alone (`save_final`: WORKDIR/checkpoints/final_params),
which is what is read from it. Evaluation and sampling of a finished run read the same way.
"""

from typing import Any

import jax
import numpy as np

from diloco import errors, paths
from diloco.inner import checkpoint

FINAL = "final_params"  # under a run's checkpoints/: a multi-learner run's final global parameters


def checkpoint_dir(path: str, what: str = "init_from") -> str:
  """`path/checkpoints` when `path` is a run's workdir, else `path` (a checkpoints directory)."""
  inner = paths.join(path, "checkpoints")
  found = inner if paths.isdir(inner) else path
  if not paths.isdir(found):
    raise errors.MissingInput(f"{what}={path!r}: no such run directory or checkpoints directory")
  return found


def save_final(workdir: str, step: int, params: Any) -> str:
  """Saves a multi-learner run's final global parameters (a params tree of host arrays) as
  WORKDIR/checkpoints/final_params/<step>, replacing a save of that step; returns its path."""
  directory = paths.join(workdir, "checkpoints", FINAL)
  if paths.isdir(paths.join(directory, str(step))):  # the same run, finished again
    paths.rmtree(paths.join(directory, str(step)))
  ckpt = checkpoint.Checkpointer(directory, every=1, keep=1, async_save=False)
  try:
    ckpt.save(step, {"params": params}, force=True)
  finally:
    ckpt.close()
  return ckpt.step_dir(step)


def load_params(path: str, abstract_state: Any) -> dict[str, Any]:
  """The newest checkpoint's parameters under `path`, as host numpy arrays (`newest`)."""
  return newest(path, abstract_state)[1]


def newest(path: str, abstract_state: Any, what: str = "init_from") -> tuple[int, dict[str, Any]]:
  """The step and parameters (host numpy arrays) of the newest checkpoint under `path`: a train
  state's, else a multi-learner run's final global parameters (`save_final`).

  `abstract_state` is the TrainState this run would build (shapes, dtypes, shardings). A train
  state is read whole, so a checkpoint of another model or inner optimizer does not fit and is
  refused with orbax's description of the first difference; `what` names `path` in messages.
  """
  directory = checkpoint_dir(path, what)
  found = _restore(directory, abstract_state, path, what)
  if found is not None:
    step, params = found[0], found[1].params
  else:
    final = paths.join(directory, FINAL)
    found = _restore(final, {"params": abstract_state.params}, path, what)
    if found is None:
      raise errors.MissingInput(f"{what}={path!r}: {directory} holds no checkpoint")
    step, params = found[0], found[1]["params"]
  params = jax.device_get(params)
  bad = [k for k, v in jax.tree_util.tree_leaves_with_path(params) if not np.isfinite(v).all()]
  if bad:
    raise errors.InputError(
        f"{what}={path!r}: the checkpoint at step {step} has non-finite "
        f"parameters in {jax.tree_util.keystr(bad[0])}"
    )
  return step, params


def _restore(directory: str, abstract: Any, path: str, what: str) -> tuple[int, Any] | None:
  """The newest intact step under `directory` restored into `abstract`, or None if none."""
  if not paths.isdir(directory):
    return None
  ckpt = checkpoint.Checkpointer(directory, every=1, async_save=False, set_aside=False)
  try:
    step = ckpt.latest_step()
    if step is None:
      return None
    try:
      return ckpt.restore(abstract)
    except (ValueError, KeyError, TypeError) as e:
      raise errors.InputError(
          f"{what}={path!r}: the checkpoint at step {step} does not fit this "
          f"run's model and optimizer (same model= and optimizer.name needed): {e}"
      ) from e
  finally:
    ckpt.close()
