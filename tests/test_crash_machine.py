"""The crash-and-rejoin machine (diloco/recovery/crash_machine.py), driven by hand."""

import pytest

from diloco.recovery import crash_machine
from diloco.recovery.crash_machine import CrashMachine, Peer


def test_a_restored_learner_moves_to_the_leading_learners_phase():
  # H = 10, restored at 37, the leader at 64 (phase 4): 37 + (64 - 37) mod 10 = 44, phase 4.
  peers = [Peer(52, (2, 7)), Peer(64, (4, 9))]
  assert crash_machine.resume_step(37, 10, peers, lockstep=False) == 44
  assert crash_machine.resume_step(44, 10, peers, lockstep=False) == 44  # already in phase
  assert crash_machine.resume_step(37, 10, [], lockstep=False) == 37  # nobody to follow


def test_where_lockstep_rounds_wait_it_redoes_them_from_the_leaders_last_merge():
  # The leader at 64 last received a fragment 4 steps ago: its last merge point is step 60.
  peers = [Peer(52, (2, 7)), Peer(64, (4, 9))]
  assert crash_machine.resume_step(37, 10, peers, lockstep=True) == 60
  assert crash_machine.resume_step(62, 10, peers, lockstep=True) == 62  # its checkpoint is later


def test_crash_recover_rejoin_records_what_was_lost_and_when():
  machine = CrashMachine(learners=3, lockstep=False)
  record = machine.crash(1, now=10.0, back=15.0, steps_lost=3, wall=2.5)
  assert record == {
      "learner": 1,
      "time": 10.0,
      "back": 15.0,
      "rejoined": None,
      "restored_step": None,
      "steps_lost": 3,
      "wall": 2.5,
  }
  assert machine.steps_lost == [0, 3, 0] and machine.is_rejoining(1)
  assert (
      machine.recover(1, restored_step=30, steps=30, inner_steps=10, peers=[Peer(47, (7,))]) == 37
  )
  assert record["restored_step"] == 30 and record["steps_lost"] == 3  # known at the crash
  # It crashes again before its rejoin completed: the first record says so, the second counts.
  again = machine.crash(1, now=16.0, back=20.0)
  assert record["crashed_again"] == 16.0 and machine.crashes == [record, again]
  # Steps lost known only at recovery (the threads runtime): counter at the crash - restored.
  assert (
      machine.recover(1, restored_step=None, steps=0, inner_steps=10, peers=[], steps_at_crash=41)
      == 0
  )
  assert again["steps_lost"] == 41 and machine.steps_lost == [0, 44, 0]
  done = machine.rejoined(1, now=21.5, holds_global_exactly=True)
  assert done is again and done["rejoined"] == 21.5 and not machine.is_rejoining(1)
  with pytest.raises(KeyError):
    machine.rejoined(1, now=22.0)


def test_a_rejoin_is_complete_once_it_holds_what_its_join_was_answered_with():
  assert not crash_machine.rejoin_complete([3, 4], None)  # no answer yet
  assert not crash_machine.rejoin_complete([3, 4], [3, 5])
  assert crash_machine.rejoin_complete([3, 6], [3, 5])
