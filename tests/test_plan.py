"""experiments.plan: a tiny learner compiled by the real TPU compiler (libtpu, compile-only
devices) on this CPU machine; the figures, the refusals, and the launchers' preflight."""

import json
import os
import subprocess
import sys

import pytest

from configs import shakespeare
from diloco.config import checks
from diloco.launch import preflight
from diloco.models import transformer
from diloco.plan import devices, make, peak, tpu
from diloco.sweeps import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(
    not devices.libtpu_available(), reason="libtpu is not installed (pip install -e '.[dev]')"
)
# A tiny decoder (d 64, 2 layers, SwiGLU 256, vocabulary 256) on a v5p-8 (2x2x1, 4 chips); batch
# 64 x 32. Matmuls are most of its FLOPs at this shape (with d 32 and sequences of 64, attention's
# full score matrix and the elementwise work were 24% more than 6N plus causal attention).
TINY = (
    "--config.model.d_model=64",
    "--config.model.d_ff=256",
    "--config.batch_size=64",
    "--config.seq_len=32",
    "--config.data.eval_batch_size=8",
)


def _config(*flags: str, variants: str = ""):
  c = shakespeare.get_config(",".join(("model=tiny", variants)).strip(","))
  for flag in (*TINY, *flags):
    key, _, raw = flag[len("--config.") :].partition("=")
    sweep.set_from_text(c, key, raw)
  return c


@pytest.fixture(scope="module")
def tiny():
  return make.make_plan(_config(), "v5p-8")


def test_a_tiny_plan_reports_memory_and_flops(tiny):
  train, evaluate = tiny.programs
  assert (train.name, evaluate.name) == ("train step", "eval step")
  assert train.argument_bytes > 0 and train.temp_bytes > 0 and train.output_bytes > 0
  # The donated state comes back in place: every output byte but the metrics' scalars is aliased.
  assert 0 < train.output_bytes - train.alias_bytes < 0.01 * train.output_bytes
  assert evaluate.argument_bytes > 0 and evaluate.alias_bytes == 0
  assert tiny.fits and tiny.peak_bytes < 0.01 * tiny.chip.hbm_bytes
  assert (tiny.pod.chips, tiny.shape, tiny.chip.generation) == (4, (2, 2, 1), "v5p")
  assert dict(tiny.learner.fns.mesh.shape) == {"data": 4, "fsdp": 1}
  # 6 FLOPs per weight and token plus causal attention: within 10% of what the TPU compiler
  # counts for the step on one chip (64 x 32 tokens over 4 chips).
  model = transformer.flops_per_token(tiny.learner.model_cfg, 32) * 64 * 32 / 4
  assert tiny.model_flops_per_chip == pytest.approx(model)
  assert train.flops == pytest.approx(model, rel=0.10)
  # The roofline is the larger of the compute and HBM times; a step at an MFU is never faster.
  assert tiny.roofline_s == max(max(train.flops, model) / 459e12, train.hbm_bytes / 2765e9)
  at_mfu = model / (0.462 * 459e12)
  assert tiny.step_s == pytest.approx(at_mfu)
  assert tiny.tokens_per_s_per_chip == pytest.approx(512 / max(at_mfu, tiny.roofline_s))


def test_the_peak_grows_with_batch_and_sequence(tiny):
  longer = make.make_plan(_config("--config.seq_len=64"), "v5p-8")
  wider = make.make_plan(_config("--config.batch_size=256"), "v5p-8")
  assert longer.train.temp_bytes > tiny.train.temp_bytes
  assert wider.train.temp_bytes > tiny.train.temp_bytes
  assert longer.peak_bytes > tiny.peak_bytes and wider.peak_bytes > tiny.peak_bytes
  assert wider.train.flops == pytest.approx(4 * tiny.train.flops, rel=0.05)


def _cached_rate(monkeypatch, tmp_path, bytes_per_s: float, uplink: str, rule: str) -> None:
  """This machine's merge rate for (uplink, rule), as if measured: `bytes_per_s`."""
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  key = f"{peak.machine_key()} / uplink {uplink} / {rule}"
  (tmp_path / "diloco").mkdir()
  (tmp_path / "diloco" / "sync_merge_rate.json").write_text(json.dumps({key: bytes_per_s}))


def test_a_decoupled_plan_compiles_the_receive_of_its_largest_fragment(monkeypatch, tmp_path):
  # scanned, as the large presets are: the fragment's blocks are views of the stacked leaves
  config = _config(
      "--config.outer.fragments=2",
      "--config.mesh.fsdp=4",
      "--config.model.scan_layers=True",
      variants="mode=decoupled",
  )
  # The synchronizer's merge rate on this machine, as the cache holds it: made very low, one
  # byte of uploads merged per second, so that one shard cannot keep up.
  _cached_rate(monkeypatch, tmp_path, 1.0, "fp4", "rda")
  plan = make.make_plan(config, "v5p-8")
  assert [p.name for p in plan.programs] == [
      "train step",
      "eval step",
      f"receive fragment {plan.fragment}",
  ]
  load = plan.sync
  assert load.rate.bytes_per_s == 1.0 and load.params == plan.learner.param_count
  assert (load.learners, load.fragments, load.inner_steps) == (plan.learners, 2, 24), load
  assert load.uploads_per_s == pytest.approx(plan.learners * 2 / (24 * plan.predicted_step_s))
  assert not load.keeps_up and load.shards_needed > 1
  refused = make.refusal(plan, config)
  assert isinstance(refused, make.SyncCannotKeepUp) and plan.fits
  message = str(refused)
  assert "cannot keep up" in message and "outer.sync_shards=1: " in message
  for key in ("outer.inner_steps=", "outer.fragments=2", "outer.codec='fp4'"):
    assert key in message, key
  receive = plan.programs[2]
  # The fragment's shards arrive beside the parameters (donated, so the result reuses them).
  assert receive.argument_bytes > plan.fragment_bytes > 0
  assert receive.alias_bytes > 0
  text = make.summary(plan, config)
  for needle in (
      "bandwidth per learner between M=",
      "decoupled",
      "goodput of M=",
      "receive fragment",
      "synchronizer: state",
      "CANNOT KEEP UP",
  ):
    assert needle in text


# A vocabulary of 8M (a SentencePiece size, never trained by a plan) on one 16 GB v5e chip: the
# float32 embedding and its two AdamW moments alone are 6 GiB, the logits of 8 x 32 tokens 8 GiB.
MISFIT = (
    "--config.batch_size=8",
    "--config.data.tokenizer=sentencepiece",
    "--config.data.sp_vocab_size=8000000",
)


def test_a_plan_that_does_not_fit_is_refused_naming_its_keys():
  config = _config(*MISFIT)
  plan = make.make_plan(config, "v5e-1")
  refused = make.refusal(plan, config)
  assert not plan.fits and isinstance(refused, checks.ConfigError)
  message = str(refused)
  assert "v5e-1: the learner needs" in message and "of HBM" in message
  for key in ("model.remat=", "model.dtype=", "batch_size=", "seq_len=", "data.sp_vocab_size="):
    assert key in message, key
  assert make.refusal(make.make_plan(_config(), "v5e-1"), _config()) is None  # the tiny one fits


def test_bad_input_is_refused_before_anything_is_compiled(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match="v4, v5litepod, v5p, v6e"):
    make.make_plan(_config(), "v3-8")
  with pytest.raises(ValueError, match="GENERATION one of"):
    make.make_plan(_config(), "tpu-64")
  with pytest.raises(
      checks.ConfigError,
      match=r"mesh.data=-1, mesh.fsdp=3, mesh.expert=1 do not tile the 4 chips of v5p-8",
  ):
    make.make_plan(_config("--config.mesh.fsdp=3"), "v5p-8")
  # d_model 64 does not divide over fsdp=128: named with its axis before anything is compiled.
  with pytest.raises(checks.ConfigError, match="mesh axis 'fsdp' of size 128"):
    make.make_plan(_config("--config.mesh.fsdp=128"), "v5p-256")
  with pytest.raises(checks.ConfigError, match="plans cover decoder"):
    make.make_plan(_config("--config.data.source=digits"), "v5p-8")
  assert os.listdir(tmp_path) == []


def test_the_topology_table():
  shapes = {
      "v5p-8": (2, 2, 1),
      "v5p-64": (2, 4, 4),
      "v5p-128": (4, 4, 4),
      "v4-16": (2, 2, 2),
      "v5e-8": (2, 4),
      "v5litepod-256": (16, 16),
      "v6e-32": (4, 8),
  }
  for name, shape in shapes.items():
    pod = tpu.parse(name)
    assert tpu.default_topology(pod) == shape, name
  assert tpu.host_bounds(tpu.parse("v6e-8"), (2, 4)) == (2, 4, 1)
  assert tpu.host_bounds(tpu.parse("v6e-16"), (4, 4)) == (2, 2, 1)
  assert [c.peak_bf16_flops for c in tpu.CHIPS.values()] == [275e12, 197e12, 459e12, 918e12]


def _script(*args: str, env=None) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, *args],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
      env=env,
  )


LAUNCH = (
    "--config.outer.learners=2",
    "--config.deploy.port=6000",
    "--config.deploy.tpu.project=proj",
    "--config.deploy.tpu.zone=z1",
    "--config.deploy.tpu.accelerator_type=v5p-8",
    "--config.deploy.tpu.sync_host=10.0.0.2",
    "--config.deploy.xpk.cluster=c1",
    "--config.outer.fragments=2",
    *TINY,
)


def test_the_gcloud_dry_run_plans_first_and_a_misfit_creates_nothing():
  spec = "--config=configs/shakespeare.py:mode=decoupled,model=tiny"
  out = _script("scripts/tpu/commands.py", spec, *LAUNCH)
  assert out.returncode == 0, out.stderr
  plan_lines = [l for l in out.stderr.splitlines() if l.startswith("# plan: ")]
  assert plan_lines[0].startswith("# plan: slice: v5p-8, 4 chips") and "fits" in out.stderr
  assert "tar -czf" in out.stdout.splitlines()[0]  # the commands follow on stdout
  # 80M ids: the replicated embedding with its AdamW state is 57 GiB on each v5p chip.
  misfit = (*MISFIT[:2], "--config.data.sp_vocab_size=80000000")
  big = _script("scripts/tpu/xpk.py", spec, *LAUNCH, *misfit)
  assert big.returncode == 2 and big.stdout == "", big.stderr
  assert "the learner needs" in big.stderr and "data.sp_vocab_size=80000000" in big.stderr
  ray = _script(
      "-m",
      "experiments.launch_ray",
      spec,
      *LAUNCH,
      *misfit,
      "--config.deploy.tpu.topology=2x2x1",
      "--learners=2",
      "--workdir=/nonexistent/never-made",
      "--tpu",
  )
  assert ray.returncode == 2 and "the learner needs" in ray.stderr, ray.stderr
  assert not os.path.exists("/nonexistent")


def test_a_launch_without_libtpu_goes_on_and_noplan_says_so(monkeypatch, capsys):
  config = _config(*LAUNCH[: -len(TINY)])
  assert preflight.preflight(config, "v5p-8", enabled=False) is False
  assert "plan skipped (--noplan)" in capsys.readouterr().err
  monkeypatch.setattr(devices, "libtpu_available", lambda: False)
  assert preflight.preflight(config, "v5p-8") is False
  assert "pip install -e '.[tpu]'" in capsys.readouterr().err
