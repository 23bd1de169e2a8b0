"""The fault layer (diloco/chaos/faults.py): each kind's effect at a time, worked out by hand."""

import math

import numpy as np
import pytest

from diloco.chaos import faults, schedule as chaos
from diloco.outer import protocol
from diloco.outer.codecs import compression

SCHEDULE = chaos.parse("""
    delay learner 0 at t=10s for 20s +2s
    delay learner 0 at t=15s for 5s +0.5s
    partition learner 0 at t=40s for 10s hold
    partition learner 0 at t=45s for 10s drop
    straggle learner 1 at t=0s for 100s x3
    straggle learner 1 at t=50s for 10s x2
    crash learner 2 at t=5s for 10s
    crash learner 2 at t=12s for 10s
    corrupt learner 0 at t=20s up
    poison learner 0 at t=30s inf
    corrupt learner 1 at t=20s down
    sync_crash at t=1s for 1s
    """)


def _upload(m: int) -> protocol.Upload:
  delta = {"w": compression.encode(np.arange(1, 9, dtype=np.float32), "fp32")}
  return protocol.Upload(
      learner=m,
      fragment=0,
      base_version=3,
      delta=delta,
      steps=4,
      tokens=64,
      time=0.0,
      sent_time=0.0,
      step_time=1.0,
  )


def _send(m: int) -> protocol.Send:
  values = {"w": np.ones(8, np.float32)}
  return protocol.Send(learner=m, fragment=0, version=4, values=values)


def test_delays_add_and_partitions_hold_or_drop():
  layer = faults.FaultLayer(SCHEDULE)
  assert layer.arrival(0, 5.0, 1.0) == (6.0, None)  # nothing active: only the transfer
  assert layer.arrival(0, 12.0, 1.0) == (15.0, None)  # 12 + 1 + 2
  assert layer.arrival(0, 16.0, 1.0) == (19.5, None)  # both delays: 16 + 1 + 2.5
  assert layer.arrival(0, 41.0, 1.0) == (50.0, None)  # held to the end of the hold, 40+10
  arrival, dropped = layer.arrival(0, 46.0, 1.0)  # the drop wins over the hold
  assert arrival is None and dropped.mode == "drop" and dropped.end_s == 55.0
  assert layer.partition_end(0, 46.0, "hold") == 50.0
  assert layer.partition_end(0, 46.0, "drop") == 55.0
  assert layer.partition_end(0, 56.0, "drop") is None
  assert layer.arrival(1, 46.0, 1.0) == (47.0, None)  # another learner's link is healthy


def test_stragglers_multiply_and_crashes_overlap():
  layer = faults.FaultLayer(SCHEDULE)
  assert layer.stretch(1, 10.0, 0.5) == 1.5
  assert layer.stretch(1, 55.0, 0.5) == 3.0  # x3 x2
  assert layer.stretch(1, 100.0, 0.5) == 0.5  # the window is [0, 100)
  assert layer.stretch(0, 55.0) == 1.0
  assert layer.down_until(2, 13.0) == 22.0  # inside both crashes: until the later end
  assert layer.down_until(2, 4.0) is None
  assert layer.crash(2, 13.0).time_s == 5.0
  assert layer.crash(2, 13.0, since=6.0).time_s == 12.0  # one that began after `since`
  assert layer.crash(2, 16.0, since=13.0) is None
  assert layer.crash(2, 30.0) is None


def test_taints_arm_at_their_time_and_act_once():
  layer = faults.FaultLayer(SCHEDULE)
  rng = np.random.default_rng(0)
  up = _upload(0)
  same, f = layer.taint_up(up, 19.0, rng)  # the corrupt fault's time has not come
  assert f is None and same is up
  bad, f = layer.taint_up(up, 35.0, rng)  # the older armed fault first: corrupt up
  assert (f.kind, faults.taint_name(f)) == ("corrupt", "corrupt_up")
  assert bad.checksum == up.checksum and not bad.checksum_ok()  # flipped after the checksum
  bad, f = layer.taint_up(up, 35.0, rng)
  assert faults.taint_name(f) == "poison_inf" and bad.checksum_ok()  # at the source
  # +inf at every 2nd of 8 values (0, 2, 4, 6), then -inf at every 2nd from 1 (1, 3, 5, 7)
  assert np.isinf(compression.decode(bad.delta["w"])).sum() == 8
  assert layer.taint_up(up, 35.0, rng)[1] is None  # each acts once
  assert layer.taint_up(_upload(1), 35.0, rng)[1] is None  # learner 1 has only a down fault
  send = _send(1)
  bad, f = layer.taint_down(send, 21.0, rng)
  assert faults.taint_name(f) == "corrupt_down" and not bad.checksum_ok()
  assert layer.unused == 0


def test_a_layer_built_unarmed_arms_at_the_runtimes_call():
  layer = faults.FaultLayer(SCHEDULE, armed=False)
  rng = np.random.default_rng(0)
  assert layer.taint_up(_upload(0), 35.0, rng)[1] is None and layer.unused == 0
  poison = next(f for f in SCHEDULE if f.kind == "poison")
  layer.arm(poison)
  assert layer.unused == 1
  assert faults.taint_name(layer.taint_up(_upload(0), 35.0, rng)[1]) == "poison_inf"
  with pytest.raises(ValueError, match="only .* are armed"):
    layer.arm(SCHEDULE[0])


def test_a_synchronizer_crash_is_no_learners():
  layer = faults.FaultLayer(SCHEDULE)
  assert all(layer.crash(m, 1.5) is None for m in range(3))
  assert not math.isinf(layer.stretch(0, 1.5))
