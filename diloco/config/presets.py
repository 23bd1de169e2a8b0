"""Modes as config presets: each sets the policy knobs of the `outer` section, once, here.

Synchronous DiLoCo and Streaming DiLoCo are the synchronizer with quorum = all learners, no grace,
equal weights and a plain mean, with blocking learners; Decoupled DiLoCo changes only those knobs.
Each preset is `preset(c, runlocal, learners)`: `learners` > 0 is the `learners=N` variant (M);
0 keeps the config's M, or 2 under `runlocal`. diloco/train.py maps each mode to its preset and
runner in one table.
"""

import ml_collections


def _learners(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  c.outer.learners = learners or (2 if runlocal else c.outer.learners)


def dp(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  """Data-parallel SPMD on one island: the outer section is unused (but for M in mode=compare)."""
  del runlocal
  c.outer.learners = learners or c.outer.learners


def diloco(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  """Synchronous DiLoCo: all learners, every H steps, plain mean, Nesterov outer step."""
  c.outer.update(dict(fragments=1, overlap=0, codec="fp32", blocking=True))  # lockstep
  c.outer.update(dict(quorum=0, grace_gamma=0.0, weighting="equal", merge="mean"))  # all, mean
  _learners(c, runlocal, learners)
  if runlocal:
    c.outer.inner_steps = 10


def streaming(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  """Streaming DiLoCo: P strided fragments, overlap tau=1, fp4 outer gradients."""
  diloco(c, runlocal, learners)
  c.outer.update(dict(fragments=4, overlap=1, codec="fp4"))
  if runlocal:
    c.outer.update(dict(fragments=2))


def decoupled(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  """Decoupled DiLoCo: quorum K=1, adaptive grace, token weights, RDA; learners never wait.

  Merges are damped by staleness: learners in phase whose uploads of one base merge one by one
  (K=1, a grace window shorter than their spread) would otherwise add their outer gradients up.
  Outer gradients above 4x the recent median norm are clipped to it: after an outage of the
  synchronizer, learners that trained on upload the progress of many steps at once, and the
  outer momentum would carry it several times over (a loss spike from 2.5 to 17 in chaos_local).

  Paper defaults (reconstructed): P=24 balanced fragments, each synced every H=24 steps, tau=2.
  """
  c.outer.update(dict(fragments=24, fragment_kind="balanced", inner_steps=24, overlap=2))
  c.outer.update(dict(codec="fp4", quorum=1, grace_gamma=0.8, weighting="tokens", merge="rda"))
  c.outer.update(dict(blocking=False, staleness_damping=True, clip_factor=4.0))
  _learners(c, runlocal, learners)
  if runlocal:
    c.outer.update(dict(inner_steps=8, fragments=4))


def compare(c: ml_collections.ConfigDict, runlocal: bool, learners: int) -> None:
  """dp, diloco and decoupled on one token budget, the last learner 3x slower, sized for the
  README (what each compared run changes after its own preset: `compare_overrides`).

  The budget fits the README's 5 minutes on 2 CPU cores: 150 inner steps of 16x64 bytes per
  learner (614,400 bytes per run). Sequences of 64 bytes learned more per byte than 128 here
  (BENCHMARKS.md has the sweep). With so few steps, synchronous DiLoCo syncs every H=10 steps
  (15 outer steps) rather than 50.
  """
  c.seq_len, c.batch_size, c.steps = 64, 16, 150
  c.optimizer.lr = 5e-3  # here 5e-3 beat 1e-2 (dp and diloco) and 3e-3 (diloco)
  c.optimizer.decay_steps = c.steps - c.optimizer.warmup_steps
  c.eval_every = 50
  c.outer.inner_steps = 10
  _learners(c, runlocal, learners)
  c.sim.speeds = ",".join(["1"] * (c.outer.learners - 1) + ["3"])
  if runlocal:
    c.compare.decoupled_fragments, c.compare.decoupled_inner_steps = 4, 8


def compare_overrides(config: ml_collections.ConfigDict, mode: str) -> dict:
  """What a run of mode=compare changes after its mode's preset (flattened keys).

  Every run keeps the comparison's learners, H, budget, model and data; data-parallel trains one
  island over all devices with M x the batch (same steps and tokens); Decoupled DiLoCo uses its
  own fragments and H from the `compare` section.
  """
  o, cmp = config.outer, config.compare
  per_mode = {
      "dp": {"batch_size": config.batch_size * o.learners},
      "decoupled": {
          "outer.fragments": cmp.decoupled_fragments,
          "outer.inner_steps": cmp.decoupled_inner_steps,
      },
  }
  return {"outer.inner_steps": o.inner_steps, **per_mode.get(mode, {})}
