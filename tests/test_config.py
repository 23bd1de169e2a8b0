"""A run is what its command says: one resolved config whichever way a value comes in, every check
before anything runs, keys that say what they mean, workdirs that keep finished runs."""

import json
import os
import subprocess
import sys

import proc_helpers
import pytest
from absl import flags
from ml_collections import config_flags

from configs import digits, shakespeare
from diloco import train
from diloco.config import base, checks, domains, keys, presets, resolve, variants
from diloco.recovery import workdir as workdir_lib
from diloco.sweeps import sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("dp", "diloco", "streaming", "decoupled", "compare")


def _from_flags(*argv: str):
  """The config experiments.train would get from this command line (absl + config_flags)."""
  fv, argv0 = flags.FlagValues(), sys.argv
  sys.argv = ["prog", *argv]  # config_flags reads the override flags off sys.argv
  try:
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
    fv(["prog", *argv])
  finally:
    sys.argv = argv0
  return resolve.resolve(fv.config)


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_given_by_flag_is_the_mode_given_by_variant(mode):
  by_variant = shakespeare.get_config(f"mode={mode}")
  by_flag = _from_flags("--config=configs/shakespeare.py", f"--config.mode={mode}")
  assert by_flag.to_json() == by_variant.to_json()
  if mode == "decoupled":  # the preset's 12 outer keys, not the synchronous defaults
    o = by_flag.outer
    assert (o.quorum, o.fragments, o.codec, o.merge, o.weighting) == (1, 24, "fp4", "rda", "tokens")
    assert (o.grace_gamma, o.overlap, o.blocking) == (0.8, 2, False)


def test_steps_by_flag_moves_the_schedule_as_steps_by_variant_does():
  from diloco.inner import island, step

  by_variant = shakespeare.get_config("steps=1000")
  by_flag = _from_flags("--config=configs/shakespeare.py", "--config.steps=1000")
  assert by_flag.optimizer.decay_steps == by_variant.optimizer.decay_steps == 980  # 1000 - 20
  lr_v = step.lr_schedule(island.optimizer_config(by_variant))
  lr_f = step.lr_schedule(island.optimizer_config(by_flag))
  # warmup 20 to 1e-2, cosine to 0.1 x at step 1000: half way (step 510) at 0.55 x
  for s in (0, 10, 20, 510, 999, 1000):
    assert float(lr_f(s)) == float(lr_v(s))
  assert float(lr_f(510)) == pytest.approx(0.55e-2, rel=1e-6)


def test_derived_keys_follow_their_sources_and_an_explicit_value_wins():
  c = shakespeare.get_config("mode=decoupled,chaos=light")
  assert (c.outer.learner_checkpoint_every, c.outer.sync_checkpoint_every) == (24, 24)  # H, P
  assert c.outer.max_staleness == 16  # 4 M
  c.outer.inner_steps, c.outer.learners = 12, 8
  resolve.resolve(c)
  assert (c.outer.learner_checkpoint_every, c.outer.max_staleness) == (12, 32)
  c.outer.max_staleness = 5  # given: kept whatever else changes
  c.outer.learners = 2
  assert resolve.resolve(c).outer.max_staleness == 5
  with c.unlocked():
    c.runlocal = True
  resolve.resolve(c)  # runlocal after the fact shrinks what was not given
  assert (c.steps, c.model.size, c.model.d_model, c.outer.inner_steps) == (40, "tiny", 32, 12)


def test_runlocal_keeps_a_model_given_explicitly():
  c = shakespeare.get_config("runlocal,model=small")
  assert (c.model.size, c.model.d_model, c.steps) == ("small", 128, 40)
  assert shakespeare.get_config("model=small,runlocal").to_json() == c.to_json()
  assert shakespeare.get_config("runlocal").model.d_model == 32
  (point,) = sweep.points("configs/sweeps/toy_never_written.py", _module({"runlocal": True}))
  assert (point.config.model.size, point.config.model.d_model) == ("small", 128)


def _module(point: dict):
  """A sweep file of one point over shakespeare's variants."""
  import types

  m = types.ModuleType("toy_sweep")
  m.get_config = shakespeare.get_config
  m.get_sweep = lambda arg=None: [{**point, "model": "small"}]
  return m


def test_a_sweep_variant_that_changes_nothing_is_refused_before_any_point_runs():
  import types

  m = types.ModuleType("toy_sweep")
  m.get_config = lambda arg=None: shakespeare.get_config(  # reads `lr` and ignores `wd`
      ",".join(t for t in (arg or "").split(",") if not t.startswith(("lr=", "wd=")))
  )
  m.get_sweep = lambda arg=None: [{"mode": "dp", "wd": 0.1}]
  with pytest.raises(sweep.SweepError, match=r"point 0 \(mode=dp\+wd=0.1\): variant 'wd' changes"):
    sweep.points("toy.py", m)


def test_every_bad_key_is_named_at_once_before_anything_runs(tmp_path):
  c = shakespeare.get_config("mode=decoupled,model=tiny")
  c.optimizer.lr = -1e-3
  c.data.text_glob = "/data/*.txt"  # without data.source=text_glob it would train on Shakespeare
  with pytest.raises(checks.ConfigError) as e:
    train.train_and_evaluate(c, str(tmp_path / "run"))
  assert str(e.value).splitlines() == [
      "4 problems in the config:",
      "  optimizer.lr=-0.001: must be a positive number (a negative rate ascends the loss)",
      "  data.text_glob='/data/*.txt': only used with data.source='text_glob' (it is "
      "'shakespeare'): set both",
      "  seq_len=128: exceeds model.max_len=64: raise it or shorten seq_len",
      "  outer.fragments=24: the model has 14 parameter tensors (balanced: 24 fragments but only "
      "14 leaves); lower it",
  ]
  assert not (tmp_path / "run").exists()
  c.optimizer.lr, c.data.text_glob = 1e-3, ""
  with pytest.raises(checks.ConfigError) as e:
    checks.prepare(c)
  assert str(e.value).splitlines()[1:] == [
      "  seq_len=128: exceeds model.max_len=64: raise it or shorten seq_len",
      "  outer.fragments=24: the model has 14 parameter tensors (balanced: 24 fragments but only "
      "14 leaves); lower it",
  ]


def test_a_sweep_of_a_tiny_decoupled_model_fails_its_check_not_its_run(tmp_path):
  import types

  m = types.ModuleType("toy_sweep")
  m.get_config = shakespeare.get_config
  m.get_sweep = lambda arg=None: [
      {"mode": "decoupled", "model": "tiny", "config.seed": s} for s in (0, 1)
  ]
  with pytest.raises(sweep.SweepError, match=r"point 0 .*\n  seq_len=128: exceeds model.max_len"):
    sweep.points("toy.py", m)


def test_compare_refuses_a_policy_key_its_runs_would_overwrite():
  c = shakespeare.get_config("mode=compare")
  c.outer.merge = "rda"
  with pytest.raises(checks.ConfigError, match="outer.merge='rda': mode=compare runs each mode"):
    checks.prepare(c)


def test_every_key_has_a_meaning_and_the_listing_prints_it():
  from experiments import config as config_main

  for c in (shakespeare.get_config("mode=decoupled"), digits.get_config("runlocal")):
    paths = [p for p, _ in keys.leaves(c)]
    assert len(paths) > 140
    assert [p for p in paths if not keys.MEANINGS.get(p)] == []
    lines = config_main.listing(c)
    assert len(lines) == len(paths)
  line = next(
      l
      for l in config_main.listing(shakespeare.get_config("mode=decoupled"))
      if l.startswith("outer.quorum ")
  )
  assert "= 1" in line and "[preset]" in line and "# K: merge once K learners uploaded" in line


def test_a_key_declared_in_one_place_is_resolved_listed_and_checked():
  # One declaration: default 0.1, 0.2 under decoupled's preset, 0.05 under runlocal, 0.3 with
  # charles2025, a domain of [0, 1]. Nothing else names the key.
  from experiments import config as config_main

  def declared(arg: str):
    c = base.base_config()
    c.extra = keys.section(
        "extra",
        share=(
            keys.Auto(0.1, runlocal=0.05, recipes={"charles2025": 0.3}, decoupled=0.2),
            "a share of something",
            domains.unit(),
        ),
    )
    variants.apply(c, arg, shakespeare.VARIANTS)
    return resolve.resolve(c)

  got = {a: declared(a).extra.share for a in ("mode=dp", "mode=decoupled", "runlocal")}
  assert got == {"mode=dp": 0.1, "mode=decoupled": 0.2, "runlocal": 0.05}
  assert declared("recipe=charles2025").extra.share == 0.3
  line = next(l for l in config_main.listing(declared("mode=decoupled")) if l.startswith("extra"))
  assert (
      "= 0.2" in line and "[preset]" in line and "# a share of something; must be in [0, 1]" in line
  )
  c = declared("mode=decoupled")
  c.extra.share = 1.5
  assert ("extra.share", "must be in [0, 1]") in checks.problems_of(c)
  with pytest.raises(checks.ConfigError, match=r"extra.share=1.5: must be in \[0, 1\]"):
    checks.check(c)


def test_a_mode_preset_is_read_from_the_declarations():
  c = shakespeare.get_config("mode=decoupled")
  preset = presets.mode_preset(c, "decoupled")
  assert preset["outer.fragments"] == 24 and preset["outer.merge"] == "rda"
  assert preset["outer.lr"] == 0.2 and preset["outer.merge_clock"] == "period"
  assert "outer.learners" not in preset
  assert "outer.inner_steps" not in presets.policy_keys(c)  # compare keeps its own H
  assert {"outer.merge", "outer.quorum", "outer.codec"} <= set(presets.policy_keys(c))
  with pytest.raises(ValueError, match="as declared"):
    presets.mode_preset(c.copy_and_resolve_references(), "decoupled")


def test_loading_a_config_file_imports_no_training_stack():
  code = (
      "import sys; from configs import shakespeare, digits; shakespeare.get_config('mode=decoupled');"
      "digits.get_config(); heavy = ('jax', 'flax', 'orbax', 'grain', 'optax', 'diloco.train');"
      "print([m for m in sys.modules if m in heavy or m.split('.')[0] in heavy[:5]])"
  )
  out = subprocess.run(
      [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
  ).stdout
  assert out.strip() == "[]"


def _finished_run(workdir, config) -> None:
  """What a finished run leaves (its resolved config.json and a summary), without training."""
  workdir_lib.write_config(str(workdir), config.to_json(indent=2))
  (workdir / "summary.json").write_text(json.dumps({"finished": True, "eval_loss": 1.5}))


def test_a_workdir_holding_another_run_is_refused_before_anything_is_written(tmp_path):
  run = tmp_path / "run"
  _finished_run(run, shakespeare.get_config("runlocal"))
  before = {p: (run / p).read_bytes() for p in os.listdir(run)}
  other = shakespeare.get_config("runlocal,mode=decoupled")
  other.optimizer.lr = 3e-3
  with pytest.raises(workdir_lib.WorkdirError) as e:
    train.train_and_evaluate(other, str(run))
  lines = str(e.value).splitlines()
  assert 'mode: "dp" -> "decoupled"' in [l.strip() for l in lines]
  assert "optimizer.lr: 0.01 -> 0.003" in [l.strip() for l in lines]
  assert "--restart" in lines[-1]
  assert {p: (run / p).read_bytes() for p in os.listdir(run)} == before
  c = shakespeare.get_config("runlocal")
  c.data.tokenizer = "sentencepiece"  # failed inside orbax, after config.json was overwritten
  with pytest.raises(workdir_lib.WorkdirError, match='data.tokenizer: "byte" -> "sentencepiece"'):
    train.train_and_evaluate(c, str(run))
  assert {p: (run / p).read_bytes() for p in os.listdir(run)} == before


def test_restart_moves_the_finished_run_aside(tmp_path):
  run = tmp_path / "run"
  _finished_run(run, shakespeare.get_config("runlocal"))
  c = shakespeare.get_config("runlocal")
  c.steps = 2
  summary = train.train_and_evaluate(c, str(run), restart=True)
  assert summary["finished"] and summary["steps"] == 2
  old = tmp_path / "run.old-1"
  assert json.loads((old / "summary.json").read_text()) == {"finished": True, "eval_loss": 1.5}
  assert json.loads((run / "config.json").read_text())["steps"] == 2


def test_a_config_keeps_its_presets_and_explicit_keys_through_pickling():
  import pickle

  c = shakespeare.get_config("mode=decoupled,steps=100")
  d = pickle.loads(pickle.dumps(c))  # how a sweep's worker process receives a point's config
  with d.unlocked():
    d.runlocal = True
  resolve.resolve(d)
  assert (d.steps, d.optimizer.decay_steps, d.outer.fragments, d.model.d_model) == (100, 95, 4, 32)


# ---- sizes against what can exist (issue 49, point 7) ----


def test_a_batch_whose_logits_cannot_exist_is_refused_before_anything_is_written(tmp_path):
  """Before: config.json was written, the run died allocating 7.28 TiB, and the corrected
  command was then refused by the workdir (batch_size: 1000000000000 -> 8) until --restart."""
  config = shakespeare.get_config("runlocal")
  sweep.set_from_text(config, "batch_size", "1000000000000")
  workdir = tmp_path / "run"
  with pytest.raises(checks.ConfigError, match=r"batch_size=1000000000000: .* GiB, more than"):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
  # Off this machine's CPU, the bound is the largest machine there is: a whole v5p pod's HBM.
  config = shakespeare.get_config("runlocal")
  sweep.set_from_text(config, "distributed", "True")
  sweep.set_from_text(config, "batch_size", "1000000000")
  # a billion sequences of 32 bytes: 30 TiB of logits, within a pod (774 TiB), so allowed
  assert not any("v5p pod" in why for _, why in checks.problems_of(resolve.resolve(config)))
  sweep.set_from_text(config, "batch_size", "100000000000")
  assert any("v5p pod" in why for _, why in checks.problems_of(resolve.resolve(config)))


def test_more_learners_than_documents_is_refused_before_anything_is_written(tmp_path):
  config = shakespeare.get_config("runlocal,mode=decoupled")
  sweep.set_from_text(config, "outer.learners", "100000")
  with pytest.raises(checks.ConfigError, match=r"outer.learners=100000: .* 38 documents"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "config.json").exists()


def test_a_value_of_the_wrong_type_exits_2_with_one_line(tmp_path):
  out = proc_helpers.train(tmp_path / "run", "--config.batch_size=abc", timeout=120)
  assert out.returncode == 2, out.stderr
  assert out.stderr.strip().splitlines()[-1] == (
      "error: flag --config.batch_size=abc: invalid literal for int() with base 10: 'abc'"
  )
  assert not (tmp_path / "run").exists()


def test_sizes_from_35m_up_default_to_bf16_remat_and_fsdp_over_the_island():
  from diloco.config import resolve
  from diloco.inner import sharding

  def keys(arg, **given):
    c = shakespeare.get_config(arg)
    for k, v in given.items():
      section, name = k.split(".")
      c[section][name] = v
    c = resolve.resolve(c)
    return c.model.dtype, c.model.remat, c.mesh.data, c.mesh.fsdp

  assert keys("") == ("float32", "none", -1, 1)  # small: today's numbers
  assert keys("runlocal") == ("float32", "none", -1, 1)
  assert keys("model=35m") == ("bfloat16", "block", -1, -1)
  assert keys("model=8b") == ("bfloat16", "block", -1, -1)
  # what a user gives wins
  assert keys("model=180m", **{"model.dtype": "float32", "mesh.fsdp": 2}) == (
      "float32",
      "block",
      -1,
      2,
  )
  assert keys("model=1b", **{"mesh.data": 2}) == ("bfloat16", "block", 2, -1)
  # data=-1 with fsdp=-1: the fsdp axis takes every device of the island
  assert sharding.island_shape(8, -1, -1) == ((1, 8), ("data", "fsdp"))
  assert sharding.island_shape(8, 2, -1) == ((2, 4), ("data", "fsdp"))
