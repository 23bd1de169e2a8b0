"""A fragment's merge round (diloco/outer/sync/rounds.py): quorum, grace window, merge, by hand."""

import types

import numpy as np
import pytest

from diloco.outer import policies
from diloco.outer.sync import rounds
from diloco.outer.protocol import SetTimer


def _emas(step_s: float, sync_s: float):
  step, quorum, sync = (policies.Ema(0.9) for _ in range(3))
  step.update(step_s)
  sync.update(sync_s)
  return step, quorum, sync


def test_quorum_opens_the_grace_window_and_the_whole_group_cuts_it_short():
  # K=2 of 3 live learners, grace 0.8 x (2 x step 1.0 - time to quorum - round trip 0.1).
  policy = types.SimpleNamespace(quorum=policies.MinQuorum(2), grace=policies.AdaptiveGrace(0.8, 2))
  emas = _emas(1.0, 0.1)
  rnd, group = rounds.Round(first_upload_s=10.0), {0, 1, 2}
  rnd.pending[0] = "up0"
  assert rounds.advance(rnd, group, policy, 10.0, *emas) is None  # 1 of 2
  rnd.pending[1] = "up1"
  timer = rounds.advance(rnd, group, policy, 10.5, *emas)
  # time to quorum 0.5 s (the EMA's first sample): grace 0.8 x (2 - 0.5 - 0.1) = 1.12 s
  assert emas[1].get() == 0.5 and rnd.quorum_s == 10.5
  assert isinstance(timer, SetTimer) and timer.time == pytest.approx(11.62)
  assert rnd.deadline_s == pytest.approx(11.62)
  assert rounds.advance(rnd, group, policy, 11.0, *emas) is None  # inside the window
  rnd.pending[2] = "up2"
  assert rounds.advance(rnd, group, policy, 11.2, *emas) == rounds.MERGE  # everyone is in
  assert emas[1].get() == 0.5  # the quorum is counted once per round


def test_without_a_grace_window_the_quorum_merges_at_once():
  policy = types.SimpleNamespace(quorum=policies.AllLive(), grace=policies.NoGrace())
  rnd, group = rounds.Round(first_upload_s=0.0), {0, 1}
  rnd.pending[1] = "up1"
  assert rounds.advance(rnd, group, policy, 1.0, *_emas(1.0, 0.0)) is None
  assert rounds.advance(rnd, group - {0}, policy, 1.0, *_emas(1.0, 0.0)) == rounds.MERGE
  assert rounds.advance(rounds.Round(), set(), policy, 1.0, *_emas(1.0, 0.0)) is None  # empty


def test_merge_record_normalises_weights_and_keeps_only_merged_clips():
  ups = [types.SimpleNamespace(learner=m, steps=s, tokens=64 * s, time=t)
         for m, s, t in ((0, 3, 11.5), (2, 1, 11.75))]  # fmt: skip
  record = rounds.merge_record(1, 12.0, 5, 11.5, ups, np.array([3.0, 1.0]), [0, 2], {2, 4})
  assert record["weights"] == [0.75, 0.25] and record["grace_s"] == 0.5
  assert record["arrived"] == [11.5, 11.75]
  assert record["learners"] == [0, 2] and record["clipped"] == [2]
  assert (record["version"], record["quorum"], record["tokens"]) == (5, 2, [192, 64])
  assert rounds.merge_record(0, 1.0, 1, None, ups, np.ones(2), [0, 0], set())["grace_s"] == 0.0
