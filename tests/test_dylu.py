"""DyLU (measured dynamic local updates), merges sent to their contributors only, error feedback
in a learner's checkpoint, and the outer section's checks at config time; numbers by hand."""

import os

import numpy as np
import pytest

from configs import shakespeare
from configs.sweeps import ablations
from diloco import train
from diloco.config import build, checks
from diloco.outer import fragments, optimizers, policies
from diloco.outer.codecs import compression
from diloco.outer.protocol import Join, Send, Upload
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.sweeps import sweep

F32 = np.float32
PARAMS = {"blocks": {0: {"w": np.array([1.0, 2.0], F32)}}}
FRAG = fragments.strided(PARAMS, 1)
W = "blocks/0/w"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dylu_steps_scale_with_measured_speed():
  d = policies.Dylu(inner_steps=20, decay=0.5)
  assert d.steps_for(0, {0}) == 0  # not measured: keeps its schedule
  for m, t in ((0, 1.0), (1, 2.0), (2, 3.0)):
    d.observe(m, t)
  live = {0, 1, 2}
  # H_m = floor(20 * fastest / t_m): 20, 10, floor(6.67) = 6.
  assert [d.steps_for(m, live) for m in range(3)] == [20, 10, 6]
  d.observe(1, 1.0)  # EMA 0.5 * 2 + 0.5 * 1 = 1.5: floor(20 / 1.5) = 13
  assert d.steps_for(1, live) == 13
  # Learner 0 gone: the fastest live one is learner 1 (1.5 s): learner 2 gets floor(20 * 1.5 / 3).
  assert d.steps_for(2, {1, 2}) == 10
  d.observe(2, 0.0)  # not a measurement
  assert d.steps_for(2, {1, 2}) == 10
  with pytest.raises(ValueError, match="inner_steps >= 1"):
    policies.Dylu(0, 0.5)


def _up(m: int, base: int, delta: float, step_time: float) -> Upload:
  enc = compression.encode_tree({W: np.full(2, delta, F32)}, "fp32")
  return Upload(m, 0, base, enc, 4, 32, 1.0, 0.5, step_time)


def _async_sync(dylu_steps: int) -> Synchronizer:
  policy = policies.Policy(
      policies.MinQuorum(1),
      policies.NoGrace(),
      policies.EqualWeights(),
      policies.Mean(),
      ema_decay=0.5,
      broadcast="contributors",
      dylu_inner_steps=dylu_steps,
  )
  sync = Synchronizer(PARAMS, FRAG, policy, optimizers.sgd(1.0))
  for m in range(2):
    sync.handle(Join(m, 0.0, (0,)))
  return sync


def test_a_merge_goes_to_its_contributors_only_with_their_dylu_steps():
  sync = _async_sync(dylu_steps=20)
  sends = [a for a in sync.handle(_up(0, 0, 0.5, step_time=1.0)) if isinstance(a, Send)]
  # Learner 0 alone merged (quorum 1): only it is sent version 1 (SGD lr 1: [1, 2] - 0.5), with
  # H_0 = 20 (it is the only one measured, so the fastest).
  assert [(s.learner, s.version, s.inner_steps) for s in sends] == [(0, 1, 20)]
  np.testing.assert_array_equal(sync.global_params()[W], [0.5, 1.5])
  # Learner 1 (4 s a step) uploads against version 0: one merge stale; it gets the full values
  # of version 2 (it holds 0, not 1) and H_1 = floor(20 * 1 / 4) = 5.
  sends = [a for a in sync.handle(_up(1, 0, 0.25, step_time=4.0)) if isinstance(a, Send)]
  assert [(s.learner, s.version, s.inner_steps) for s in sends] == [(1, 2, 5)]
  assert sends[0].update is None and sends[0].checksum_ok()
  np.testing.assert_array_equal(sends[0].values[W], [0.25, 1.25])
  tampered = Send(1, 0, 2, values=sends[0].values, checksum=sends[0].checksum, inner_steps=50)
  assert not tampered.checksum_ok()  # the step count is under the checksum


def test_without_dylu_sends_carry_no_step_count_and_all_learners_get_them():
  sync = _async_sync(dylu_steps=0)
  assert [s.inner_steps for s in sync.handle(_up(0, 0, 0.5, 1.0)) if isinstance(s, Send)] == [0]
  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), policies.EqualWeights(), policies.Mean()
  )
  everyone = Synchronizer(PARAMS, FRAG, policy, optimizers.sgd(1.0))
  for m in range(2):
    everyone.handle(Join(m, 0.0, (0,)))
  sends = [a for a in everyone.handle(_up(0, 0, 0.5, 1.0)) if isinstance(a, Send)]
  assert [s.learner for s in sends] == [0, 1]
  with pytest.raises(ValueError, match="unknown outer.broadcast 'some'"):
    policies.Policy(policies.MinQuorum(1), policies.NoGrace(), None, None, broadcast="some")


def _config(arg: str, **outer):
  c = shakespeare.get_config(arg)
  with c.unlocked():
    c.outer.update(outer)
  return c


def test_a_learner_follows_the_step_count_it_is_sent_and_keeps_residuals_in_checkpoints():
  config = _config("mode=decoupled,runlocal", codec="2bit", error_feedback=True)
  parts = build.local_learners(config)
  learner = parts.make_learner(0)
  assert learner.uplink.codec == "2bit" and learner.uplink.error_feedback
  sync = parts.make_sync()
  for a in sync.handle(Join(0, 0.0, tuple(learner.versions))):
    if isinstance(a, Send):
      learner.receive(a)
  rng = np.random.default_rng(0)
  trained = {
      k: v - F32(0.01) * rng.standard_normal(v.shape).astype(F32)
      for k, v in learner.global_copy[0].items()
  }
  learner._write(trained)  # as if it had trained: Δ = Θ - θ is the noise
  up = learner.upload(0, 0.0, 0.0, 1.0)
  assert any(
      np.abs(r).max() > 0 for r in learner.uplink.residuals[0].values()
  )  # 2-bit dropped some
  saved = learner.checkpoint_state()
  keys = [k for k in saved["host"] if k.startswith("residual.0.")]
  assert len(keys) == len(parts.frag.paths[0])
  other = parts.make_learner(0)
  other.load_checkpoint_state(saved)
  for i, k in enumerate(parts.frag.paths[0]):
    np.testing.assert_array_equal(other.uplink.residuals[0][k], learner.uplink.residuals[0][k])
  assert set(saved["host"]) == set(other.checkpoint_like()["host"])
  # A Send with inner_steps replaces the schedule: H = 3 with 4 fragments (offsets 0, 0, 1, 2).
  send = Send(0, 1, learner.versions[1] + 1, values=learner.global_copy[1], inner_steps=3)
  learner.receive(send)
  assert learner.schedule.inner_steps == 3 and parts.schedule.inner_steps == 8
  assert up.fragment == 0


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("codec", "3bit", "outer.codec='3bit': unknown codec"),
        ("downlink_codec", "fp5", "outer.downlink_codec='fp5': unknown codec"),
        ("fp4_rounding", "up", "outer.fp4_rounding='up': unknown rounding"),
        ("broadcast", "few", "outer.broadcast='few'"),
    ],
)
def test_bad_outer_values_fail_before_a_run_naming_the_key(tmp_path, key, value, message):
  config = _config("mode=decoupled,runlocal", **{key: value})
  with pytest.raises(ValueError, match=message):
    checks.prepare(config)
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")  # nothing was started


def test_dylu_needs_an_asynchronous_quorum():
  config = _config("mode=diloco,runlocal", dylu=True)
  with pytest.raises(ValueError, match="outer.dylu with outer.quorum=0 and blocking learners"):
    checks.prepare(config)
  checks.prepare(_config("mode=diloco,runlocal", dylu=True, quorum=1))


def test_a_sweep_with_a_bad_codec_fails_before_any_point_runs(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text(
      "from configs import shakespeare\n"
      "def get_config(arg=None):\n"
      "  return shakespeare.get_config('mode=decoupled,runlocal')\n"
      "def get_sweep(arg=None):\n"
      "  return [{'config.outer.codec': 'fp4'}, {'config.outer.codec': 'q3'}]\n"
  )
  with pytest.raises(sweep.SweepError, match=r"(?s)point 1 .*outer.codec='q3': unknown codec"):
    sweep.points(str(path))


def test_the_study_sweeps_list_their_cells():
  names = [sweep.point_name(p) for p in ablations.get_sweep("part=all")]
  assert len(names) == len(set(names)) == 24  # the baseline once, though every part has it
  assert not any("seed=1" in n for n in names)
  two = ablations.get_sweep("part=all,seeds=2")
  assert len(two) == 43  # 16 deciding cells and the 3 outer-lr checks get seed 1
  async_sweep = sweep.load_module(os.path.join(ROOT, "configs", "sweeps", "async.py"))
  assert len(async_sweep.get_sweep(None)) == 20
  assert len(async_sweep.get_sweep("seeds=2")) == 32  # sync, async, dn_dylu x 4 levels
