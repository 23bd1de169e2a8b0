"""Modes as config presets: each sets the policy knobs of the `outer` section, once, here.

Synchronous DiLoCo and Streaming DiLoCo are the synchronizer with quorum = all learners, no grace,
equal weights and a plain mean, with blocking learners; Decoupled DiLoCo changes only those knobs.
"""

import ml_collections


def dp(c: ml_collections.ConfigDict, runlocal: bool) -> None:
    """Data-parallel SPMD on one island: the outer section is unused."""
    del c, runlocal


def diloco(c: ml_collections.ConfigDict, runlocal: bool) -> None:
    """Synchronous DiLoCo: all learners, every H steps, plain mean, Nesterov outer step."""
    c.outer.update(dict(fragments=1, overlap=0, codec="fp32", quorum=0, grace_gamma=0.0,
                        weighting="equal", merge="mean", blocking=True))
    if runlocal:
        c.outer.update(dict(learners=2, inner_steps=10))


def streaming(c: ml_collections.ConfigDict, runlocal: bool) -> None:
    """Streaming DiLoCo: P strided fragments, overlap tau=1, fp4 outer gradients."""
    diloco(c, runlocal)
    c.outer.update(dict(fragments=4, overlap=1, codec="fp4"))
    if runlocal:
        c.outer.update(dict(fragments=2))


def decoupled(c: ml_collections.ConfigDict, runlocal: bool) -> None:
    """Decoupled DiLoCo: quorum K=1, adaptive grace, token weights, RDA; learners never wait.

    Merges are damped by staleness: learners in phase whose uploads of one base merge one by one
    (K=1, a grace window shorter than their spread) would otherwise add their outer gradients up.
    Outer gradients above 4x the recent median norm are clipped to it: after an outage of the
    synchronizer, learners that trained on upload the progress of many steps at once, and the
    outer momentum would carry it several times over (a loss spike from 2.5 to 17 in chaos_local).

    Paper defaults (reconstructed): P=24 balanced fragments, each synced every H=24 steps, tau=2.
    """
    c.outer.update(dict(fragments=24, fragment_kind="balanced", inner_steps=24, overlap=2,
                        codec="fp4", quorum=1, grace_gamma=0.8, weighting="tokens", merge="rda",
                        blocking=False, staleness_damping=True, clip_factor=4.0))
    if runlocal:
        c.outer.update(dict(learners=2, inner_steps=8, fragments=4))


def compare(c: ml_collections.ConfigDict, runlocal: bool) -> None:
    """dp, diloco and decoupled on one token budget (see diloco/compare.py), sized for the README.

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
    if runlocal:
        c.outer.update(dict(learners=2, inner_steps=10))


PRESETS = {"dp": dp, "diloco": diloco, "streaming": streaming, "decoupled": decoupled,
           "compare": compare}


def apply(c: ml_collections.ConfigDict, mode: str, runlocal: bool) -> None:
    """Sets c.mode and the knobs of that mode."""
    if mode not in PRESETS:
        raise ValueError(f"unknown mode {mode!r}; known: {sorted(PRESETS)}")
    c.mode = mode
    PRESETS[mode](c, runlocal)
