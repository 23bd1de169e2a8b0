"""Poisoned uploads followed from the synchronizer's log records (chaos/stats.py PoisonFates)."""

import types

from diloco.chaos.stats import ChaosStats, PoisonFates


def _up(m, p, base, steps, tokens):
  return types.SimpleNamespace(learner=m, fragment=p, base_version=base, steps=steps, tokens=tokens)


def _merge(p, version, learners, staleness, steps, tokens):
  return {
      "event": "merge",
      "fragment": p,
      "version": version,
      "learners": learners,
      "staleness": staleness,
      "steps": steps,
      "tokens": tokens,
  }


def test_each_poisoned_upload_meets_one_fate():
  stats = ChaosStats()
  fates = PoisonFates(stats)
  fates.entered(_up(0, 1, 4, 30, 960), "poison_nan")
  fates.entered(_up(1, 1, 4, 30, 960), "poison_huge")
  fates.entered(_up(2, 0, 7, 30, 960), "poison_inf")
  fates.entered(_up(3, 0, 2, 30, 960), "poison_nan")
  # version 5 of fragment 1 merged learner 0's upload on base 5 - 1 - 0 = 4 with its progress:
  # the poisoned one; learner 1's merged upload had 31 steps: a newer one replaced it
  fates.follow(_merge(1, 5, [0, 1], [0, 0], [30, 31], [960, 992]))
  # learner 2's round rejected it at merge time; learner 3's refusal on arrival is another upload's
  fates.follow(
      {"event": "reject", "code": "non_finite", "learner": 2, "fragment": 0, "base_version": 7}
  )
  fates.follow({"event": "reject", "code": "stale", "learner": 3, "fragment": 0, "base_version": 2})
  fates.finish()
  assert stats.tainted == {
      "poison_nan": {"merged": 1, "pending at the end": 1},
      "poison_huge": {"superseded": 1},
      "poison_inf": {"rejected (non_finite)": 1},
  }
  assert fates.pending == {}
