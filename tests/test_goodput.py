"""Goodput simulator: hand-worked traces, limits, analytic references, bad input."""

import json
import math

import numpy as np
import pytest
from scipy import integrate, stats

from configs import goodput as goodput_config
from diloco.sim import calibration, failure_policies, goodput, intervals
from diloco.sim.cluster import Cluster, sample_trace, SECONDS_PER_YEAR, Trace

_HORIZON_1000S = 1000.0 / 86400.0  # days


def _trace(cluster, raw_t=(), fail_t=(), fail_unit=(), unit_speed=None):
  speeds = np.ones(cluster.units) if unit_speed is None else np.asarray(unit_speed, dtype=float)
  raw_t = np.asarray(raw_t, dtype=float)
  return Trace(
      cluster=cluster,
      raw_t=raw_t,
      raw_unit=np.zeros(raw_t.size, dtype=int),
      fail_t=np.asarray(fail_t, dtype=float),
      fail_unit=np.asarray(fail_unit, dtype=int),
      unit_speed=speeds,
  )


def test_absorb_rule_by_hand():
  # 0 starts [0, 10); 5 falls inside it; 12 starts [12, 22); 30 starts [30, 31).
  s, e = intervals.absorb_pauses(np.array([0.0, 5.0, 12.0, 30.0]), np.array([10.0, 10, 10, 1]))
  np.testing.assert_array_equal(s, [0, 12, 30])
  np.testing.assert_array_equal(e, [10, 22, 31])


def test_dp_by_hand():
  # Failures at 100 and 300 (105 falls in the first restart). The job ran since -3600 (the warm-up),
  # so 3700 s of progress mod 30 = 10 s are lost before 100; then 190 mod 30 = 10 s before 300.
  cluster = Cluster(chips=4, unit_chips=1, return_time_s=50.0, days=_HORIZON_1000S)
  assert cluster.warmup_s == 3600.0
  out = failure_policies.DataParallel(restart_s=10.0, checkpoint_interval_s=30.0).run(
      _trace(cluster, raw_t=[100.0, 105.0, 300.0])
  )
  assert out.uptime_s == pytest.approx(1000 - 20)
  assert out.useful_chip_s == pytest.approx(4 * (1000 - 20 - 20))
  assert out.interruptions == 3


def test_decoupled_by_hand_with_speeds():
  # Learner 0 = units {0, 1}, learner 1 = units {2, 3}, one chip each. Unit 0 (speed 0.9, the
  # slowest of learner 0) fails at 100 and returns at 150; downscale 5 s, upscale 3 s.
  cluster = Cluster(chips=4, unit_chips=1, return_time_s=50.0, days=_HORIZON_1000S)
  trace = _trace(cluster, fail_t=[100.0], fail_unit=[0], unit_speed=[0.9, 1.0, 0.95, 1.0])
  learner0 = 2 * 0.9 * 100 + 1 * 1.0 * (150 - 105) + 2 * 0.9 * (1000 - 153)
  learner1 = 2 * 0.95 * 1000
  for quorum, uptime in [(1, 1000.0), (2, 1000.0 - 5 - 3)]:
    out = failure_policies.Decoupled(downscale_s=5.0, upscale_s=3.0, learners=2, quorum=quorum).run(
        trace
    )
    assert out.useful_chip_s == pytest.approx(learner0 + learner1)
    assert out.uptime_s == pytest.approx(uptime)
    assert out.learner_uptime_s == pytest.approx((992.0, 1000.0))
    assert out.interruptions == 1


def test_no_failures_goodput_is_one_for_every_policy():
  cfg = goodput_config.get_config("tiny")
  with cfg.unlocked():
    cfg.mtbi_years, cfg.speed_std = 1e12, 0.0
  cluster = goodput.cluster_from_config(cfg)
  for policy in goodput.policies_from_config(cfg):
    result = goodput.simulate(cluster, policy, seeds=[0, 1])
    assert result.goodput == 1.0 and result.uptime == 1.0, policy


def test_one_learner_decoupled_equals_elastic_dp():
  cluster = Cluster(chips=12_000, unit_chips=4, return_time_s=600.0, speed_std=0.01, days=0.25)
  timing = dict(downscale_s=20.0, upscale_s=7.0)
  elastic, decoupled = goodput.simulate_many(
      cluster,
      [
          failure_policies.ElasticDataParallel(**timing),
          failure_policies.Decoupled(learners=1, **timing),
      ],
      seeds=range(3),
  )
  assert elastic.per_seed_goodput == decoupled.per_seed_goodput
  assert elastic.per_seed_uptime == decoupled.per_seed_uptime
  assert 0.5 < elastic.goodput < 0.99  # the cluster does fail


def test_failure_count_matches_chips_times_horizon_over_mtbi():
  # 60 days of 40k chips; units of 40 chips away 2 days, so 18% of units are down at any time and
  # the thinning of failures on down units matters.
  cluster = Cluster(chips=40_000, unit_chips=40, return_time_s=2 * 86400.0, days=60.0)
  seeds = range(4)
  raw = goodput.simulate(cluster, failure_policies.DataParallel(restart_s=1.0), seeds)
  hits = goodput.simulate(
      cluster, failure_policies.ElasticDataParallel(downscale_s=1.0, upscale_s=1.0), seeds
  )
  n_t_over_mtbi = 40_000 * 60 * 86400 / SECONDS_PER_YEAR
  up_share = 1 / (1 + 2 * 86400 / (SECONDS_PER_YEAR / 40))
  assert cluster.expected_failures() == pytest.approx(n_t_over_mtbi * up_share)
  for result, expected in [(raw, n_t_over_mtbi), (hits, n_t_over_mtbi * up_share)]:
    sigma_of_mean = math.sqrt(expected / len(seeds))  # Poisson; the thinned stream is no wider
    assert abs(result.failures - expected) < 4 * sigma_of_mean, (result.failures, expected)


def test_elastic_and_decoupled_match_the_renewal_formula():
  # Failures and returns arrive as Poisson streams of rate L each; a pause of D or U, absorbing what
  # arrives meanwhile, gives a learner of 1/M of the cluster an up share 1 / (1 + L (D + U) / M).
  cluster = Cluster(chips=120_000, unit_chips=4, return_time_s=1800.0, days=2.0)
  rate = cluster.failure_rate_per_s * (1 - cluster.down_fraction)
  d, u = 30.0, 20.0
  for m in (1, 4):
    result = goodput.simulate(
        cluster, failure_policies.Decoupled(downscale_s=d, upscale_s=u, learners=m), seeds=range(4)
    )
    up = 1 / (1 + rate * (d + u) / m)
    assert result.goodput == pytest.approx(up * (1 - cluster.down_fraction), abs=0.01), m
    if m == 1:
      assert result.uptime == pytest.approx(up, abs=0.01)


def test_dp_matches_the_renewal_formula():
  # Poisson failures at rate L, restart S, progress since the last checkpoint (every C) lost:
  # goodput = (1/L - E[X mod C]) / (1/L + S), X ~ Exp(L).
  cluster = Cluster(chips=600_000, unit_chips=4, days=1.0)
  rate, s, c = cluster.failure_rate_per_s, 20.0, 15.0
  lost = 1 / rate - c * math.exp(-rate * c) / (1 - math.exp(-rate * c))
  result = goodput.simulate(
      cluster, failure_policies.DataParallel(restart_s=s, checkpoint_interval_s=c), seeds=range(4)
  )
  assert result.goodput == pytest.approx((1 / rate - lost) / (1 / rate + s), abs=0.01)
  assert result.uptime == pytest.approx(1 / (1 + rate * s), abs=0.01)


def test_synchronous_job_runs_at_its_slowest_chip():
  # No failures: goodput = 1 + std * E[min of n standard normals], by numerical integration.
  n, std = 120_000, 0.01
  cluster = Cluster(chips=n, unit_chips=4, speed_std=std, mtbi_years=1e12)
  density = lambda x: x * n * stats.norm.pdf(x) * stats.norm.sf(x) ** (n - 1)
  expected_min = integrate.quad(density, -8, 0, limit=200)[0]
  result = goodput.simulate(cluster, failure_policies.DataParallel(restart_s=0.0), seeds=range(5))
  assert result.goodput == pytest.approx(1 + std * expected_min, abs=0.002)
  assert -4.8 < expected_min < -4.2


def test_quorum_one_uptime_is_at_least_every_learner():
  cluster = Cluster(chips=12_000, unit_chips=4, return_time_s=600.0, mtbi_years=0.02, days=0.25)
  out = {}
  for k in (1, 2, 4):
    out[k] = goodput.simulate(
        cluster,
        failure_policies.Decoupled(downscale_s=60.0, upscale_s=60.0, learners=4, quorum=k),
        seeds=[0],
    )
  learners = out[1].learner_uptime
  assert max(learners) < 0.9  # learners are down a good share of the time
  assert out[1].uptime >= max(learners)
  assert out[4].uptime <= min(learners)
  assert out[1].uptime >= out[2].uptime >= out[4].uptime
  assert out[1].goodput == out[2].goodput == out[4].goodput  # learners never wait for the quorum


def test_bad_input_fails_clearly():
  with pytest.raises(ValueError, match="chips must be an integer >= 1"):
    Cluster(chips=0)
  with pytest.raises(ValueError, match="multiple of unit_chips"):
    Cluster(chips=10, unit_chips=4)
  with pytest.raises(ValueError, match="restart_s must be a non-negative"):
    failure_policies.DataParallel(restart_s=-1.0)
  with pytest.raises(ValueError, match="return_time_s must be a non-negative"):
    Cluster(chips=8, return_time_s=-5.0)
  with pytest.raises(ValueError, match="quorum must be an integer in"):
    failure_policies.Decoupled(downscale_s=1.0, upscale_s=1.0, learners=2, quorum=3)
  with pytest.raises(ValueError, match=r"learners \(3\) exceeds the number of failure units \(2"):
    failure_policies.Decoupled(downscale_s=1.0, upscale_s=1.0, learners=3).run(
        sample_trace(Cluster(chips=8, unit_chips=4), 0)
    )
  with pytest.raises(ValueError, match="unknown policy 'sync'"):
    goodput.make_policy(
        "sync", restart_s=1.0, checkpoint_interval_s=0.0, downscale_s=1.0, upscale_s=1.0
    )
  cfg = goodput_config.get_config("tiny")
  with pytest.raises(AttributeError):
    cfg.chipz = 3  # locked: a misspelt override fails


def test_run_writes_rows_and_published_points(tmp_path, capsys):
  cfg = goodput_config.get_config("tiny")
  for override in goodput_config.get_sweep():
    assert set(override) <= set(cfg.keys())
  rows = goodput.run(cfg, str(tmp_path))
  saved = json.loads((tmp_path / "goodput.json").read_text())
  assert saved == json.loads(json.dumps(rows))
  assert [(r["policy"], r["learners"]) for r in saved] == [
      ("dp", 1),
      ("elastic_dp", 1),
      ("decoupled", 2),
      ("decoupled", 4),
      ("decoupled", 8),
      ("decoupled", 16),
  ]
  for r in saved:
    assert {"goodput", "goodput_ci", "uptime", "uptime_ci", "chips"} <= set(r)
    assert r["published"] is None  # a tiny cluster is not the published one
  assert "parameters: unit_chips=4" in capsys.readouterr().out
  big = Cluster(chips=calibration.PUBLISHED_CHIPS)
  assert calibration.published("decoupled", 8, big) == 0.88
  assert calibration.published("decoupled", 3, big) is None
