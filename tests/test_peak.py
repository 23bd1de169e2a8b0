"""Peak FLOP/s per device and MFU (diloco/plan/peak.py), worked out by hand."""

import json
import types

import pytest

from diloco.plan import peak


def _devices(platform, kind, n):
  return [types.SimpleNamespace(platform=platform, device_kind=kind)] * n


def test_mfu_of_a_tpu_slice_and_a_gpu_by_hand():
  # 4 v5p chips at 459 TFLOP/s; 1,000 tokens/s of 459 GFLOP each is 459 TFLOP/s: a quarter
  u = peak.utilisation(1000.0, 459e9, _devices("tpu", "TPU v5p", 4))
  assert u["mfu"] == pytest.approx(0.25) and u["tokens_per_s_per_chip"] == 250.0
  assert u["peak_flops_per_s"] == 4 * 459e12 and "v5p dense bf16" in u["peak_source"]
  assert peak.device_peak(_devices("tpu", "TPU v5 lite", 1)[0]).flops_per_s == 197e12
  assert peak.device_peak(_devices("tpu", "TPU v6 lite", 1)[0]).flops_per_s == 918e12
  # 2,000 tokens/s of 98.94 GFLOP each on one H200 (989.4 TFLOP/s): a fifth
  h200 = peak.utilisation(2000.0, 98.94e9, _devices("gpu", "NVIDIA H200", 1))
  assert h200["mfu"] == pytest.approx(0.2)
  unknown = peak.utilisation(10.0, 1e9, _devices("gpu", "Some GPU", 2))
  assert unknown["mfu"] is None and "no peak FLOP/s known" in unknown["peak_source"]


def test_a_cpu_peak_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  calls = []
  monkeypatch.setattr(peak, "measure_cpu_matmul", lambda: calls.append(1) or 5e10)
  first = peak.cpu_peak()
  assert first.flops_per_s == 5e10 and calls == [1]
  path = tmp_path / "diloco" / "peak_flops.json"
  cached = json.loads(path.read_text())
  (key,) = cached
  assert f"{__import__('os').cpu_count()} cores" in key
  path.write_text(json.dumps({key: 2e10}))  # the next call reads this, measures nothing
  assert peak.cpu_peak().flops_per_s == 2e10 and calls == [1]
  # every CPU device of a run shares the host: its peak counts once whatever the device count
  u = peak.utilisation(1e3, 1e6, _devices("cpu", "cpu", 8))
  assert u["mfu"] == pytest.approx(1e9 / 2e10) and u["tokens_per_s_per_chip"] == 1e3


def test_the_measured_matmul_is_a_plausible_rate():
  flops = peak.measure_cpu_matmul(n=256, reps=2)
  assert 1e8 < flops < 1e14  # 0.1 GFLOP/s to 100 TFLOP/s: a CPU, not a unit mistake
