"""Tokens per second of M learners stacked (inner/stacked.py) against the same learners stepped
one by one, in the same run, on the same devices.

  python scripts/bench_stacked.py                 # small 8x64 M=4, then tiny 2x64 M=8

For each case it times, interleaved (best of --repeats):
  steps:  one round of M learner steps: M single jitted steps, the stacked step ('vmap' and 'map'),
          and one learner stepping M times the batch (an upper bound: what any stacking of
          separate learners could at best reach, since their weights differ);
  runs:   a whole virtual-runtime run (`mode=diloco`, and `mode=decoupled` with the last learner
          3x slower) with `outer.stack_learners` off and on (`outer.stack_step` auto).
Its last line is the tiny/M=8 `mode=diloco` run ratio: `stacked_vs_sequential=X`.
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

import jax
import numpy as np
from absl import app, flags, logging

from configs import shakespeare
from diloco import timing, train
from diloco.config import build, variants
from diloco.inner import sharding, stacked, step as step_lib
from diloco.models import transformer

_CASES = flags.DEFINE_list("cases", ["small:8:4", "tiny:2:8"], "model:batch_per_learner:M")
_SEQ = flags.DEFINE_integer("seq", 64, "Sequence length (bytes).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Interleaved repeats; the best counts.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "Rounds of M steps per timed call.")
_RUN_STEPS = flags.DEFINE_integer("run_steps", 40, "Inner steps per learner of a timed run.")


def _model(name: str) -> transformer.ModelConfig:
  return transformer.ModelConfig(**{**variants.model_config(name).to_dict(), "max_len": _SEQ.value})


def _batch(b: int, rng) -> dict[str, np.ndarray]:
  tokens = rng.integers(0, 256, (b, _SEQ.value + 1)).astype(np.int32)
  return {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}


def time_steps(name: str, b: int, m: int) -> dict[str, float]:
  """Seconds per round of m learner steps, by way of stepping them."""
  model, opt = _model(name), step_lib.OptimizerConfig()
  device, rng, n = jax.devices()[:1], np.random.default_rng(0), _ROUNDS.value
  mesh = sharding.make_island_mesh(device)
  single = step_lib.build_step_fns(model, opt, mesh)
  states = [single.init(jax.random.key(i)) for i in range(m)]
  batch = step_lib.put_batch(_batch(b, rng), mesh)
  big = [single.init(jax.random.key(0)), step_lib.put_batch(_batch(b * m, rng), mesh)]

  def sequential():
    for _ in range(n):
      for i in range(m):
        states[i], _ = single.train(states[i], batch)
    jax.block_until_ready(states)

  def bound():
    for _ in range(n):
      big[0], _ = single.train(*big)
    jax.block_until_ready(big[0])

  contenders = {"sequential": sequential, "one learner, M x batch": bound}
  for kind in stacked.STEPS:
    fns = stacked.build_stacked_fns(model, opt, sharding.make_stacked_mesh(device, 1), m, kind)
    stack = [fns.zeros()]
    batch_M = jax.device_put(
        {k: np.stack([v] * m) for k, v in _batch(b, rng).items()}, fns.batch_sharding
    )
    mask = np.ones(m, bool)

    def run(fns=fns, stack=stack, batch_M=batch_M, mask=mask):
      for _ in range(n):
        stack[0], _ = fns.train(stack[0], batch_M, mask)
      jax.block_until_ready(stack[0])

    contenders[f"stacked[{kind}]"] = run
  seconds = timing.best_seconds(list(contenders.values()), _REPEATS.value)
  return {k: s / n for k, s in zip(contenders, seconds)}


def _run_config(name: str, b: int, m: int, mode: str, stack: bool):
  c = shakespeare.get_config(f"mode={mode},model={name}")
  c.update_from_flattened_dict(
      {
          "progress_bar": False,
          "outer.learners": m,
          "batch_size": b,
          "seq_len": _SEQ.value,
          "steps": _RUN_STEPS.value,
          "eval_every": 1 << 30,
          "data.eval_sequences": 64,
          "data.final_eval_sequences": 64,
          "outer.stack_learners": "on" if stack else "off",
      }
  )
  if mode == "decoupled":
    c.outer.update(dict(fragments=4, inner_steps=8))
    c.sim.speeds = ",".join(["1"] * (m - 1) + ["3"])
  else:
    c.outer.inner_steps = 10
  return c


def time_runs(name: str, b: int, m: int, mode: str) -> dict[str, float]:
  """Learner tokens per wall second of a whole run, learners sequential and stacked."""
  configs = {"sequential": _run_config(name, b, m, mode, False)}
  configs["stacked"] = _run_config(name, b, m, mode, True)
  rates = {k: 0.0 for k in configs}
  with tempfile.TemporaryDirectory() as tmp:
    for repeat in range(_REPEATS.value + 1):  # the first compiles
      for k, c in configs.items():
        summary = train.train_and_evaluate(c, os.path.join(tmp, f"{k}{repeat}"))
        if repeat:
          rates[k] = max(rates[k], summary["tokens"] / summary["wall_s"])
  return rates


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  devices = jax.devices()
  print(f"devices: {len(devices)} x {devices[0].device_kind} ({jax.default_backend()})")
  ratio = None
  for case in _CASES.value:
    name, b, m = case.split(":")
    b, m = int(b), int(m)
    tokens = m * b * _SEQ.value
    steps = time_steps(name, b, m)
    print(f"{name} {b}x{_SEQ.value} bytes per learner, M={m}: one round of M steps")
    for k, s in steps.items():
      print(
          f"  {k:24s} {s * 1e3:8.2f} ms  {tokens / s:10,.0f} tokens/s"
          f"  x{steps['sequential'] / s:.2f}"
      )
    for mode in ("diloco", "decoupled"):
      rates = time_runs(name, b, m, mode)
      r = rates["stacked"] / rates["sequential"]
      print(
          f"  run mode={mode}: sequential {rates['sequential']:,.0f} tokens/s,"
          f" stacked {rates['stacked']:,.0f} tokens/s, x{r:.2f}"
      )
      if mode == "diloco":
        ratio = r
    print(f"{name}/M={m}: stacked_vs_sequential={ratio:.2f}", flush=True)
  print(f"stacked_vs_sequential={ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
