"""The outer step of one fragment, computed whole into new arrays before anything is committed.

The synchronizer commits a merge only when this returns its results: the new global values, the
outer optimizer state, the residual and the encoded downlink update, all finite. Otherwise it gets
the reason and leaves its state as it was (a round rejected as `non_finite_merge`).
"""

import functools
import sys
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax

from diloco.outer import merging, optimizers, parallel
from diloco.outer.codecs import compression, encode_apply, kernels


def outer_step(
    tx: optax.GradientTransformation,
    merged: Mapping[str, np.ndarray],
    opt_state: Any,
    old: Mapping[str, np.ndarray],
    residual: Mapping[str, np.ndarray],
    codec: str,
    fast: bool = True,
    share: float = 1.0,
) -> tuple[dict, Any, dict, dict] | str:
  """(new globals, new optimizer state, new residual, encoded update), or why not (a str).

  `share` < 1: that share of an outer step (`optimizers.fractional_step`, its own path; 1 is
  the step as before, bit for bit).

  Nothing passed in is modified: the momentum is written to new arrays, and the update plus the
  old residual is a new array that becomes the new residual (raw - decoded). ``fast=False`` runs
  the reference, the contract the fast path keeps bit for bit: optax op by op, then the codec's
  `encode` and `add_decoded`.
  """
  try:
    with np.errstate(over="ignore", invalid="ignore"):
      fused = _fused(tx, merged, opt_state, old, residual, codec) if fast and share == 1 else None
      if fused is not None:
        return fused
      if share != 1:
        raw, state = optimizers.fractional_step(tx, merged, opt_state, residual, share)
      elif fast:
        raw, state = optimizers.host_step(tx, merged, opt_state, old, residual, in_place=False)
      else:
        raw, state = optimizers.reference_step(tx, merged, opt_state, old, residual)
      encoded = compression.encode_tree(raw, codec)  # refuses NaN/Inf (but fp32 and bf16)
      new, finite = {}, True
      for k in old:
        new[k], ok = compression.add_decoded(old[k], encoded[k], raw[k], check=True)
        finite &= ok
  except (ArithmeticError, ValueError) as e:
    return f"the merge failed: {e}"
  # With SGD, a non-finite momentum makes the update, hence the residual, non-finite.
  if not finite or not (isinstance(tx, optimizers.SGD) or _finite_state(state)):
    return "the new global values or outer optimizer state are not finite (float32 overflow)"
  return new, state, raw, encoded


def _fused(tx, merged, opt_state, old, residual, codec) -> tuple[dict, Any, dict, dict] | None:
  """`outer_step`'s results for an `SGD` and an int8 or fp4 downlink, the step, encoding and
  application done chunk by chunk while in cache (fp4: one compiled loop, `kernels`), over
  (tensor, span) tasks on `parallel.THREADS` threads: the same bits as the three passes. None
  when it does not apply or a value is not finite (then the passes run and say why)."""
  if not isinstance(tx, optimizers.SGD) or codec not in encode_apply.FUSED:
    return None
  if any(np.asarray(old[k]).dtype != np.float32 for k in old):
    return None
  tensors, state = optimizers.sgd_tensors(tx, merged, opt_state, residual, in_place=False)
  raw = {k: np.empty(np.shape(merged[k]), np.float32) for k in tensors}
  if codec == "fp4" and sys.byteorder == "little":  # one compiled loop (the wire is little-endian)
    jobs = {k: kernels.SgdFp4(tx, *tensors[k], np.asarray(old[k]), raw[k]) for k in tensors}
    run = lambda task: jobs[task[0]].span(task[1], task[2])
  else:
    jobs = {k: encode_apply.EncodeApply(raw[k], np.asarray(old[k]), codec) for k in tensors}

    def run(task: tuple[str, int, int]) -> bool | None:
      k, c0, c1 = task
      fill = functools.partial(kernels.sgd_span, tx, *tensors[k], raw[k].reshape(-1))
      return jobs[k].span(c0, c1, fill)

  finite = parallel.run(run, [(k, *s) for k in tensors for s in jobs[k].spans()])
  if None in finite or not all(finite):
    return None
  results = {k: job.result() for k, job in jobs.items()}
  return {k: results[k][1] for k in old}, state, raw, {k: e for k, (e, _) in results.items()}


def _finite_state(state: Any) -> bool:
  leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
  return all(merging.all_finite(x) for x in leaves if np.issubdtype(x.dtype, np.floating))
