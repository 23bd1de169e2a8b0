"""Bandwidth model: hand-worked timelines, ring all-reduce bytes, limits, published figures."""

import json

import pytest

from configs import bandwidth as bandwidth_config
from diloco.outer.codecs import compression
from diloco.sim import bandwidth, bandwidth_reference, bandwidth_report
from diloco.sim.timeline import required_bandwidth, utilization, Workload


def test_data_parallel_bytes_per_step_are_the_ring_all_reduce():
  work = Workload(model_params=1.2e9, layers=24, step_time_s=1.0)
  for m, codec, value_bytes in [(8, "bf16", 2), (2, "fp32", 4), (4, "bf16", 2)]:
    plan = bandwidth.DataParallel(learners=m, codec=codec).plan(work)
    assert plan.period == 1
    assert plan.bits_per_period() / 8 == pytest.approx(2 * (m - 1) / m * 1.2e9 * value_bytes)
  plan = bandwidth.DataParallel(learners=1).plan(work)
  assert plan.bits_per_period() == 0 and required_bandwidth(work, plan, 0.9) == 0.0


def test_codec_bytes_come_from_compression():
  work = Workload(model_params=24 * 1000, layers=24, step_time_s=1.0)
  # fp4: ceil(1000/256) = 4 fp32 scales + 500 bytes of nibbles per layer.
  assert bandwidth.layer_bits(work, "fp4")[0] == 8 * (4 * 4 + 500)
  assert bandwidth.layer_bits(work, "int8")[0] == 8 * compression.encoded_nbytes("int8", 1000)


def test_data_parallel_timeline_by_hand():
  # Two layers, step 0.3 s: forward 0.05 s per layer, backward 0.1 s per layer. Each layer's
  # all-reduce takes d = 0.15 s. Layer 1 is sent at the end of its backward (r), layer 0 is ready
  # at r + 0.1 but the link is busy until r + d, so it arrives at r + 2d; the next forward starts
  # then, and layer 1's next backward ends 0.2 s later: a step every 2d + 0.2 = 0.5 s.
  work = Workload(model_params=2000, layers=2, step_time_s=0.3)
  plan = bandwidth.DataParallel(learners=2, codec="fp32").plan(work)
  bits = 1000 * 4 * 8  # one layer, fp32, ring factor 1 for two learners
  assert plan.up_bits.tolist() == [bits, bits]
  assert utilization(work, plan, bits / 0.15 / 1e9) == pytest.approx(0.3 / 0.5)
  # For a target u <= 0.75 that gives d = (0.3/u - 0.2) / 2 >= 0.1. Above, d < 0.1: layer 0 is
  # sent when ready, at r + 0.1, so a step takes 0.3 + d and d = 0.3/u - 0.3.
  for u, d in [(0.6, (0.3 / 0.6 - 0.2) / 2), (0.9, 0.3 / 0.9 - 0.3)]:
    assert required_bandwidth(work, plan, u) == pytest.approx(bits / d / 1e9, rel=1e-9)


def test_diloco_timeline_by_hand():
  # Every H steps the L layers go back to back on the link (d each, d > backward per layer b); the
  # next forward waits for the last one: exposed = L d - (L - 1) b per period.
  work = Workload(model_params=4e6, layers=4, step_time_s=0.3)
  h, b = 10, 0.2 / 4
  plan = bandwidth.DiLoCo(learners=2, inner_steps=h, codec="bf16").plan(work)
  bits = 1e6 * 16
  for d in (0.08, 1.0):
    exposed = 4 * d - 3 * b
    assert utilization(work, plan, bits / d / 1e9) == pytest.approx(h * 0.3 / (h * 0.3 + exposed))


def test_streaming_with_one_fragment_and_no_overlap_is_diloco():
  work = Workload(model_params=1e9, layers=24, step_time_s=0.1)
  diloco = bandwidth.DiLoCo(learners=4, inner_steps=50, codec="int8").plan(work)
  streaming = bandwidth.StreamingDiLoCo(
      learners=4, inner_steps=50, fragments=1, overlap=0, codec="int8"
  ).plan(work)
  for gbps in (0.3, 3.0, 30.0):
    assert utilization(work, streaming, gbps) == pytest.approx(
        utilization(work, diloco, gbps), rel=1e-12
    )
  # Eight fragments with overlap need a third of the bandwidth here.
  more = bandwidth.StreamingDiLoCo(
      learners=4, inner_steps=50, fragments=8, overlap=1, codec="int8"
  ).plan(work)
  assert required_bandwidth(work, more, 0.9) < required_bandwidth(work, streaming, 0.9) / 2.5


def test_decoupled_one_fragment_per_step_is_throughput_bound():
  # One layer leaves and one arrives every step; with overlap 2 the round trip fits, so the link
  # only has to carry one layer per step each way: utilization = t / (bits / bandwidth).
  work = Workload(model_params=4e8, layers=4, step_time_s=1.0)
  plan = bandwidth.DecoupledDiLoCo(
      learners=8, inner_steps=4, fragments=4, overlap=2, codec="fp4"
  ).plan(work)
  bits = 8 * compression.encoded_nbytes("fp4", 10**8)
  for u in (0.5, 0.8):
    assert required_bandwidth(work, plan, u) == pytest.approx(u * bits / 1.0 / 1e9, rel=1e-6)


def test_table4_within_a_quarter_and_one_grid_step():
  rows = bandwidth_reference.table4_rows()
  assert len(rows) == 15
  for r in rows:
    if r["target"] < 0.99:
      assert 0.75 < r["ratio"] < 1.25, r
    assert 0 <= r["grid_steps_off"] <= 1, r
  assert bandwidth_reference.snap_up(86.85) == pytest.approx((86.851, 36), rel=1e-4)
  assert bandwidth_reference.grid_index(569.0) == 46


def test_blog_setting_gives_the_blog_figures():
  got = bandwidth_reference.blog_pair()
  assert got["data_parallel"] == pytest.approx(198.0, rel=0.02)
  assert got["decoupled"] == pytest.approx(0.84, rel=0.02)


def test_bad_input_fails_clearly():
  with pytest.raises(ValueError, match="unknown codec 'fp8'"):
    bandwidth.DataParallel(learners=2, codec="fp8")
  with pytest.raises(ValueError, match=r"fragments \(30\) exceeds layers \(24\)"):
    bandwidth.StreamingDiLoCo(learners=2, inner_steps=100, fragments=30, overlap=1).plan(
        Workload(model_params=1e9, layers=24, step_time_s=0.1)
    )
  with pytest.raises(ValueError, match="step_time_s must be a positive"):
    Workload(model_params=1e9, layers=24, step_time_s=-0.1)
  with pytest.raises(ValueError, match="learners must be an integer >= 1"):
    bandwidth.DiLoCo(learners=0, inner_steps=100)
  with pytest.raises(ValueError, match="overlap must be an integer >= 0"):
    bandwidth.DecoupledDiLoCo(learners=8, inner_steps=24, fragments=24, overlap=-1)
  with pytest.raises(ValueError, match="unknown method 'ring'"):
    bandwidth.make_method("ring", learners=2)
  work = Workload(model_params=1e9, layers=24, step_time_s=0.1)
  with pytest.raises(ValueError, match="target utilization must be in"):
    required_bandwidth(work, bandwidth.DataParallel(learners=2).plan(work), 1.5)


def test_run_writes_gbit_per_s_per_method_and_target(tmp_path, capsys):
  cfg = bandwidth_config.get_config("nocompare")
  with cfg.unlocked():
    cfg.targets = (0.5, 0.9)
  out = bandwidth_report.run(cfg, str(tmp_path))
  saved = json.loads((tmp_path / "bandwidth.json").read_text())
  assert set(saved["gbit_per_s"]) == {"data_parallel", "diloco", "streaming", "decoupled"}
  assert saved["gbit_per_s"]["data_parallel"]["90"] == pytest.approx(
      out["gbit_per_s"]["data_parallel"]["90"]
  )
  assert saved["gbit_per_s"]["diloco"]["50"] < saved["gbit_per_s"]["data_parallel"]["50"] / 10
  assert "table4" not in saved
  assert "data_parallel" in capsys.readouterr().out
  with pytest.raises(AttributeError):
    cfg.fragmentz = 3  # locked: a misspelt override fails
