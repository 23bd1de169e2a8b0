"""Stacked learners (inner/stacked.py, outer/learner/stacked_learner.py): waves step only the learners
with a queued step, rows are read and written in place, and stacked runs of every mode match
sequential ones.

Tolerance. A stacked step computes each learner's step with batched matmuls (vmap) or inside a
loop (map); XLA may order float32 reductions differently there than in the single step, so values
can differ in the last bit (6e-8 relative) per operation. Over the 40 AdamW steps of a runlocal run
these differences stay below 1e-5 in every parameter (measured: at most 4.8e-7), the bound the run
comparisons assert. They use the fp32 codec: with fp4 (streaming, decoupled) a last-bit difference
can move a value across a rounding threshold, a jump of one fp4 level, which no float tolerance
bounds; the merge log does not depend on values and must match exactly with any codec.
"""

import os

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import metrics, train
from diloco.config import build, variants
from diloco.inner import sharding, stacked, step as step_lib
from diloco.models import transformer
from diloco.outer import fragments

MODEL = transformer.ModelConfig(**{**variants.model_config("tiny").to_dict(), "max_len": 32})
OPT = step_lib.OptimizerConfig(warmup_steps=2, decay_steps=10)
ATOL = 1e-5


def _batch(seed: int, b: int = 2) -> dict[str, np.ndarray]:
  tokens = np.random.default_rng(seed).integers(0, 256, (b, 33)).astype(np.int32)
  return {"inputs_BxL": tokens[:, :-1], "targets_BxL": tokens[:, 1:]}


def _single_steps(seed: int, batches: list[dict]) -> step_lib.TrainState:
  fns = step_lib.build_step_fns(MODEL, OPT, sharding.make_island_mesh(jax.devices()[:1]))
  state = fns.init(jax.random.key(seed))
  for b in batches:
    state, _ = fns.train(state, step_lib.put_batch(b, fns.mesh))
  return jax.device_get(state)


def _stack(kind: str, devices: int, size: int = 4) -> stacked.Stack:
  mesh = sharding.make_stacked_mesh(jax.devices()[:devices], devices)
  stack = stacked.Stack(stacked.build_stacked_fns(MODEL, OPT, mesh, size, kind))
  init = step_lib.build_step_fns(MODEL, OPT, sharding.make_island_mesh(jax.devices()[:1])).init
  for i in range(size):
    stack.set_state(i, init(jax.random.key(i)))
  return stack


def _close(a, b, atol=ATOL) -> None:
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=0, atol=atol)


@pytest.mark.parametrize("kind,devices", [("vmap", 1), ("map", 1), ("vmap", 4)])
def test_a_wave_steps_only_the_learners_with_a_queued_step(kind, devices):
  """Learner 0 queues 2 steps, learner 1 one, 2 and 3 none. Reading learner 1 runs one wave
  (learner 0's first step rides along); reading learner 0 runs the second. 3 steps in 2 waves of
  4 slots: occupancy 3/8. Learners 2 and 3 keep their states bit for bit."""
  stack = _stack(kind, devices)
  before = [stack.get_state(i) for i in range(4)]
  m0 = [stack.enqueue(0, _batch(0)), stack.enqueue(0, _batch(1))]
  m1 = stack.enqueue(1, _batch(2))
  assert stack.waves == 0  # queued only
  stack.read(1, ["embed/embedding"])
  assert (stack.waves, stack.steps) == (1, 2)
  assert float(m1["loss"]) > 0 and stack.waves == 1  # its metrics were computed in that wave
  assert np.isfinite(float(m0[1]["loss"])) and stack.waves == 2  # asking runs the queued step
  assert stack.occupancy == 3 / 8
  for i in (2, 3):
    for x, y in zip(jax.tree.leaves(stack.get_state(i)), jax.tree.leaves(before[i])):
      np.testing.assert_array_equal(x, y)
  _close(stack.get_state(0), _single_steps(0, [_batch(0), _batch(1)]))
  _close(stack.get_state(1), _single_steps(1, [_batch(2)]))
  assert int(stack.get_state(0).step) == 2 and int(stack.get_state(2).step) == 0


def test_rows_are_written_in_place_and_alone():
  """Writing learner 2's embedding (4 learners, one per device) reuses every device's buffer:
  row 2's is donated and written in place, the others are not touched; only row 2 changes."""
  stack = _stack("vmap", 4)
  old = stack._params_by_path()["embed/embedding"]
  pointers = [s.data.unsafe_buffer_pointer() for s in old.addressable_shards]
  others = {i: stack.read(i, ["embed/embedding"])["embed/embedding"] for i in (0, 1, 3)}
  value = np.full(others[0].shape, 0.5, np.float32)
  stack.write(2, {"embed/embedding": value})
  assert [s.data.is_deleted() for s in old.addressable_shards] == [False, False, True, False]
  new = stack._params_by_path()["embed/embedding"]
  assert [s.data.unsafe_buffer_pointer() for s in new.addressable_shards] == pointers
  np.testing.assert_array_equal(stack.read(2, ["embed/embedding"])["embed/embedding"], value)
  for i, v in others.items():
    np.testing.assert_array_equal(stack.read(i, ["embed/embedding"])["embed/embedding"], v)


def test_stack_paths_are_the_fragment_paths():
  stack = _stack("vmap", 1, size=2)
  assert list(stack._params_by_path()) == fragments.leaf_paths(stack.state.params)


def test_bad_stacked_step_kind_fails_naming_the_key():
  c = shakespeare.get_config("runlocal,mode=diloco")
  c.outer.stack_step = "pmap"
  with pytest.raises(ValueError, match="outer.stack_step='pmap'"):
    build.stack_step(c)


CRASH = "crash learner 1 at t=9s for 6s"


def _run(mode: str, workdir: str, stack: bool, kind: str = "auto", codec: str = ""):
  c = shakespeare.get_config(f"runlocal,mode={mode},chaos={CRASH}")
  c.update_from_flattened_dict(
      {
          "progress_bar": False,
          "outer.learners": 4,
          "sim.speeds": "1,1,1,3",
          "outer.stack_learners": "on" if stack else "off",
          "outer.stack_step": kind,
          "deploy.devices_per_learner": 1,  # a row of the stack per device
          # No synchronizer checkpoints (the chaos preset's, every P merges): nothing here
          # restores the synchronizer, and its saves were 2 of a run's 10 s (warm).
          "outer.sync_checkpoint_every": 0,
      }
  )
  if codec:
    c.outer.codec = codec
  parts = build.local_learners(c, stacked_learners=stack)
  summary = train.train_and_evaluate(c, workdir, parts=parts)
  rows = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
  log = [
      {k: r[k] for k in ("time", "fragment", "learners", "quorum", "version", "staleness")}
      for r in rows
      if r.get("event") == "merge"
  ]
  return summary, parts.syncs[-1].global_params(), log


@pytest.mark.parametrize(
    "mode,kinds", [("diloco", stacked.STEPS), ("streaming", ("vmap",)), ("decoupled", ("vmap",))]
)
def test_stacked_runs_match_sequential_ones(mode, kinds, tmp_path):
  """4 learners at speeds 1,1,1,3, learner 1 crashing at t=9 s and rejoining from its checkpoint:
  the same merge log and, with the fp32 codec, the same global parameters within ATOL."""
  seq = _run(mode, str(tmp_path / "seq"), False, codec="fp32")
  assert seq[0]["chaos"]["crashes"] == 1 and seq[0]["rejoins"] == 1 and seq[2]
  for kind in kinds:
    got = _run(mode, str(tmp_path / kind), True, kind, codec="fp32")
    assert got[0]["stacked"]["step"] == kind and got[0]["stacked"]["waves"] > 0
    assert got[2] == seq[2]
    _close(got[1], seq[1])
    assert got[0]["rejoins"] == 1 and got[0]["chaos"]["steps_lost"] == seq[0]["chaos"]["steps_lost"]


def test_with_fp4_the_merge_log_still_matches(tmp_path):
  seq = _run("decoupled", str(tmp_path / "seq"), False)
  got = _run("decoupled", str(tmp_path / "stacked"), True)
  assert got[2] == seq[2] and len(got[2]) > 10


def test_a_scanned_models_blocks_are_read_and_written_by_their_views():
  """The learners' stack of a scanned model ([M, layers, ...] leaves): learner 1's block 1 of
  attn/out written through its view changes that layer of that row alone."""
  scanned = transformer.ModelConfig(**{**vars(MODEL), "scan_layers": True})
  mesh = sharding.make_stacked_mesh(jax.devices()[:1], 1)
  stack = stacked.Stack(stacked.build_stacked_fns(scanned, OPT, mesh, 2, "vmap"))
  init = step_lib.build_step_fns(scanned, OPT, sharding.make_island_mesh(jax.devices()[:1])).init
  for i in range(2):
    stack.set_state(i, init(jax.random.key(i)))
  paths = ["blocks/0/attn/out", "blocks/1/attn/out", "embed/embedding"]
  before = [stack.read(i, paths) for i in (0, 1)]
  value = np.full(before[1]["blocks/1/attn/out"].shape, 0.25, np.float32)
  stack.write(1, {"blocks/1/attn/out": value})
  after = [stack.read(i, paths) for i in (0, 1)]
  np.testing.assert_array_equal(after[1]["blocks/1/attn/out"], value)
  for k in paths:
    np.testing.assert_array_equal(after[0][k], before[0][k])
    if k != "blocks/1/attn/out":
      np.testing.assert_array_equal(after[1][k], before[1][k])
  stored = jax.device_get(stack.state.params["layers"]["attn"]["out"])  # [M, layers, H, Dh, D]
  np.testing.assert_array_equal(stored[1, 1], value)
