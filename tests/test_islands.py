"""Many islands on the tiny model: the DiLoCo sanity identities, Streaming DiLoCo's schedule, and
the outputs of every mode.

Runs go through `train.train_and_evaluate`; multi-learner runs are given their parts by
`build.local_learners` with a recording subclass of the synchronizer, and thin wrappers around
`Learner.upload`/`Learner.receive` and `evaluation.evaluate` watch them without changing what
they do. Compiled step functions are shared between the runs of this module (they
are pure functions of the model, optimizer and mesh), which only saves compile time.
"""

import json
import math
import os

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco import data as data_lib, metrics, train
from diloco.config import build
from diloco.inner import evaluation, island as island_lib, step as step_lib
from diloco.outer import fragments
from diloco.outer.codecs import compression
from diloco.outer.learner.learner import Learner
from diloco.outer.sync.synchronizer import Synchronizer
from test_train import SUMMARY_KEYS  # the keys every run's summary has

MULTI_KEYS = SUMMARY_KEYS | {
    "learners",
    "outer_steps",
    "bytes_sent",
    "bytes_received",
    "bytes_per_token",
    "dp_bytes_per_token",
    "runtime",
    "sim_time_s",
    "goodput",
    "uptime",
    "merges",
    "mean_quorum",
    "mean_staleness",
}
BATCH, SEQ, STEPS = 8, 32, 40  # runlocal


def _config(arg: str, **overrides):
  """shakespeare.get_config(arg) with dotted-key overrides (`outer__lr=1.0` is outer.lr)."""
  c = shakespeare.get_config(arg)
  with c.unlocked():
    c.progress_bar = False
  c.update_from_flattened_dict({k.replace("__", "."): v for k, v in overrides.items()})
  return c


class Run:
  """What one train_and_evaluate call did, as seen from outside."""

  def __init__(self, config, workdir: str):
    self.sync: Synchronizer | None = None
    self.evaluated: dict[str, np.ndarray] = {}  # the params of the last evaluation
    self.uploads: list[tuple[int, int, int]] = []  # (learner, fragment, learner's step)
    self.receives: list[tuple[int, int, int, bool]] = []  # (learner, fragment, version, ==)
    run = self

    class Recording(Synchronizer):

      def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.initial = {k: v.copy() for k, v in self.global_params().items()}
        run.sync = self

    upload, receive, evaluate = Learner.upload, Learner.receive, evaluation.evaluate

    def recorded_upload(learner, p, *args, **kwargs):
      run.uploads.append((learner.index, p, learner.steps))
      return upload(learner, p, *args, **kwargs)

    def recorded_receive(learner, send, rebase=False):
      receive(learner, send, rebase)
      p, g = send.fragment, run.sync.globals[send.fragment]
      held = learner._read(p)
      same = run.sync.versions[p] == send.version and all(
          np.array_equal(held[k].view(np.uint32), g[k].view(np.uint32)) for k in g
      )
      run.receives.append((learner.index, p, send.version, same))

    def recorded_evaluate(fns, params, data, final=False):
      run.evaluated = _host(params)
      return evaluate(fns, params, data, final)

    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(Learner, "upload", recorded_upload)
      mp.setattr(Learner, "receive", recorded_receive)
      mp.setattr(evaluation, "evaluate", recorded_evaluate)
      options = (
          {}
          if config.mode == "dp"
          else {  # the builder makes the recording one
              "parts": build.local_learners(config, sync_cls=Recording)
          }
      )
      self.summary = train.train_and_evaluate(config, workdir, **options)
    self.config = config
    self.rows = metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
    self.merges = [r for r in self.rows if r.get("event") == "merge"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One runlocal run of each mode."""
  out = {}
  for mode in ("dp", "diloco", "streaming", "decoupled"):
    out[mode] = Run(_config(f"runlocal,mode={mode}"), str(tmp_path_factory.mktemp(mode)))
  return out


@pytest.fixture(scope="module")
def initial_eval_loss():
  """Eval loss of the initial parameters, on the validation batches every run uses."""
  isl = island_lib.build_island(_config("runlocal"), jax.devices())
  return evaluation.evaluate(isl.fns, isl.init_state().params, isl.data)["eval_loss"]


def _host(params) -> dict[str, np.ndarray]:
  """Path-keyed host copies of a params tree."""
  return {k: np.array(v) for k, v in fragments.flatten(jax.device_get(params)).items()}


def _max_abs_diff(a: dict, b: dict) -> float:
  assert sorted(a) == sorted(b)
  return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def _assert_bits(a: dict, b: dict) -> None:
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k].view(np.uint32), b[k].view(np.uint32), err_msg=k)


# ---- DiLoCo's sanity identities ----


def test_one_learner_h1_outer_sgd_lr1_is_plain_training(runs, tmp_path):
  """M=1, H=1, outer SGD lr 1, fp32, τ=0 against mode=dp (same seed, shard = whole split).

  Each merge sets Θ ← Θ − (Θ − θ) in float32, which is θ except when the subtraction rounds
  (Θ and θ more than a factor 2 apart, e.g. near zero), so the two runs agree to float32 rounding
  carried through 40 AdamW steps, not bit for bit: measured max |Δ| 2.4e-7 on parameters that
  moved by 0.2; the bound below is 2e-6.
  """
  one = Run(
      _config(
          "runlocal,mode=diloco,learners=1",
          outer__inner_steps=1,
          outer__optimizer="sgd",
          outer__lr=1.0,
      ),
      str(tmp_path),
  )
  assert one.summary["merges"] == STEPS and one.summary["steps"] == STEPS
  dp = runs["dp"].evaluated
  moved = _max_abs_diff(dp, one.sync.initial)
  diff = _max_abs_diff(dp, one.sync.global_params())
  assert moved > 0.1
  assert diff < 2e-6, diff
  assert one.summary["eval_loss"] == pytest.approx(runs["dp"].summary["eval_loss"], abs=1e-5)


def test_h1_inner_sgd_is_data_parallel_with_the_averaged_gradient(tmp_path):
  """M=2, H=1, inner SGD (no clipping, no warmup, constant lr), outer SGD lr 1: each round is
  Θ ← Θ − lr·mean_m ∇L_m(Θ), i.e. one SGD step on the concatenation of the learners' batches."""
  steps, lr = 3, 0.5
  overrides = dict(
      optimizer__name="sgd",
      optimizer__lr=lr,
      optimizer__warmup_steps=0,
      optimizer__decay_steps=0,
      optimizer__clip_norm=0.0,
  )
  cfg = _config(
      "runlocal,mode=diloco",
      outer__inner_steps=1,
      outer__optimizer="sgd",
      outer__lr=1.0,
      steps=steps,
      **overrides,
  )
  run = Run(cfg, str(tmp_path))
  assert run.summary["merges"] == steps

  # Reference: one island over all devices, batch 16 = learner 0's 8 rows then learner 1's 8.
  ref_cfg = _config("runlocal,mode=dp", batch_size=2 * BATCH, **overrides)
  ref = island_lib.build_island(ref_cfg, jax.devices())
  splits = data_lib.load_splits(cfg.data)
  streams = [
      data_lib.make_datasets(
          splits,
          cfg.data,
          seed=cfg.seed,
          global_batch_size=BATCH,
          seq_len=SEQ,
          shard_index=m,
          num_shards=2,
      ).train_iter
      for m in range(2)
  ]
  batches = [[next(s) for s in streams] for _ in range(steps)]

  def train_on(rows) -> dict[str, np.ndarray]:
    """`steps` SGD steps of the reference island from the run's initial parameters."""
    state = ref.init_state()  # a fresh state each time: train donates its input
    like = fragments.flatten(state.params)
    params = {k: jax.device_put(run.sync.initial[k], like[k].sharding) for k in like}
    state = state._replace(params=fragments.unflatten(params, like=state.params))
    for b in batches:
      both = {k: np.concatenate([b[i][k] for i in rows]) for k in b[0]}
      state, _ = ref.fns.train(state, step_lib.put_batch(both, ref.fns.mesh))
    return _host(state.params)

  want = train_on([0, 1])
  wrong = train_on([0, 0])  # learner 0's batch twice
  got = run.sync.global_params()
  # Float32: mean of two per-learner mean gradients vs one mean over 16 rows, and Θ − lr·g
  # formed as Θ − (Θ − θ_m): a few ulps of the parameters (measured 2.4e-7).
  assert _max_abs_diff(got, want) < 1e-6
  assert _max_abs_diff(want, run.sync.initial) > 0.1  # the parameters did move (0.15)
  assert _max_abs_diff(got, wrong) > 0.01  # and learner 1's data mattered (0.076)


# ---- Streaming DiLoCo ----


def test_streaming_with_one_fragment_and_no_overlap_is_diloco(tmp_path):
  """Streaming DiLoCo with P=1, τ=0 (and DiLoCo with Streaming's fp4 codec) are the same run."""
  streaming = Run(
      _config("runlocal,mode=streaming", steps=20, outer__fragments=1, outer__overlap=0),
      str(tmp_path / "streaming"),
  )
  diloco = Run(
      _config("runlocal,mode=diloco", steps=20, outer__codec="fp4"), str(tmp_path / "diloco")
  )
  assert streaming.summary["merges"] == diloco.summary["merges"] == 2 * 20 // 10 // 2
  _assert_bits(streaming.sync.global_params(), diloco.sync.global_params())
  assert streaming.merges == diloco.merges
  for key in ("eval_loss", "bytes_sent", "bytes_received", "sim_time_s"):
    assert streaming.summary[key] == diloco.summary[key], key


def test_streaming_syncs_every_parameter_once_per_h_steps(runs):
  run = runs["streaming"]
  h, p_count = run.config.outer.inner_steps, run.config.outer.fragments
  assert (h, p_count) == (10, 2)
  frag = run.sync.frag
  # The fragments partition the parameters.
  assert sorted(frag.all_paths) == sorted(run.sync.initial)
  assert sum(len(g) for g in frag.paths) == len(run.sync.initial)
  assert sum(v.size for v in run.sync.initial.values()) == run.summary["params"]
  # Each learner sends fragment p at steps p·H/P + kH: in every window of H steps, each once.
  for m in range(2):
    sent = [(p, t) for (mm, p, t) in run.uploads if mm == m]
    assert sorted(t for p, t in sent if p == 0) == [10, 20, 30, 40]
    assert sorted(t for p, t in sent if p == 1) == [5, 15, 25, 35]
    for k in range(STEPS // h):
      window = [p for p, t in sent if k * h < t <= (k + 1) * h]
      assert sorted(window) == list(range(p_count))
  # The merge log: each fragment merged STEPS/H times, by both learners.
  for p in range(p_count):
    rows = [r for r in run.merges if r["fragment"] == p]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert all(r["learners"] == [0, 1] for r in rows)


def test_after_a_sync_learners_hold_the_synchronizers_fragment_bitwise(runs):
  """α=0: a received fragment overwrites the local one under `outer.delivery=replace`; with fp4
  uplink and downlink too. (Decoupled DiLoCo's preset rebases, keeping what a merge lacks:
  tests/test_delivery.py works that by hand.)"""
  assert runs["decoupled"].config.outer.delivery == "rebase"
  for mode in ("diloco", "streaming"):
    run = runs[mode]
    assert run.config.outer.delivery == "replace", mode
    assert len(run.receives) == 2 * run.summary["merges"], mode
    assert all(same for *_, same in run.receives), mode


# ---- outputs of every mode ----


def _fragment_nbytes(run: Run, p: int, codec: str) -> int:
  return sum(
      compression.encoded_nbytes(codec, run.sync.globals[p][k].size) for k in run.sync.frag.paths[p]
  )


@pytest.mark.parametrize("mode", ["dp", "diloco", "streaming", "decoupled"])
def test_every_mode_writes_a_valid_summary(runs, initial_eval_loss, mode):
  run = runs[mode]
  s = _read_summary(run)
  assert s["mode"] == mode
  assert (MULTI_KEYS if mode != "dp" else SUMMARY_KEYS) <= set(s)
  assert s["eval_loss"] < initial_eval_loss - 1.0, (s["eval_loss"], initial_eval_loss)
  assert s["eval_bpb"] == pytest.approx(s["eval_loss"] / math.log(2))  # byte tokens
  assert s["params"] == 28832
  if mode == "dp":
    assert s["tokens"] == STEPS * BATCH * SEQ
    return
  m = run.config.outer.learners
  assert s["learners"] == m == 2 and s["runtime"] == "virtual"
  assert s["tokens"] == STEPS * m * BATCH * SEQ
  assert s["merges"] == s["outer_steps"] == len(run.merges) > 0
  codec = run.config.outer.codec
  up = {p: _fragment_nbytes(run, p, codec) for p in range(run.config.outer.fragments)}
  # Every upload reached a merge (no rejects): the bytes sent are Σ over merges of quorum × size,
  # and also Σ over the uploads the learners made.
  assert s["bytes_sent"] == sum(r["quorum"] * up[r["fragment"]] for r in run.merges)
  assert s["bytes_sent"] == sum(up[p] for _, p, _ in run.uploads)
  assert s["bytes_received"] == sum(m * up[r["fragment"]] for r in run.merges)
  assert s["bytes_per_token"] == pytest.approx(
      (s["bytes_sent"] + s["bytes_received"]) / s["tokens"]
  )
  # Ring all-reduce, M=2: 2·M·(2(M−1)/M·4N) / (M·B·L) = N/32 bytes per token.
  assert s["dp_bytes_per_token"] == pytest.approx(28832 / 32)
  assert s["mean_quorum"] == pytest.approx(np.mean([r["quorum"] for r in run.merges]))
  assert s["mean_staleness"] == pytest.approx(
      np.mean([x for r in run.merges for x in r["staleness"]])
  )
  assert s["sim_time_s"] > 0 and 0 < s["goodput"] <= 1 and 0 <= s["uptime"] <= 1


@pytest.mark.parametrize("mode", ["dp", "decoupled"])
def test_evaluation_rows_say_which_model_and_which_is_final(runs, mode):
  """One final evaluation, the last row, the summary's; a decoupled run's evaluation due at the
  last step runs before the last merges (same step, earlier simulated time): not final."""
  run = runs[mode]
  evals = [r for r in run.rows if "eval_loss" in r]
  assert {r["model"] for r in evals} == {"global"}
  assert [r["final"] for r in evals] == [False] * (len(evals) - 1) + [True]
  assert evals[-1] is run.rows[-1] and evals[-1]["eval_loss"] == run.summary["eval_loss"]
  if mode == "decoupled":
    before, final = evals[-2:]
    assert before["step"] == final["step"] == STEPS
    merged_after = [r for r in run.merges if r["time"] > before["sim_time_s"]]
    assert merged_after and final["sim_time_s"] > before["sim_time_s"]
    assert before["eval_loss"] != final["eval_loss"]


def _read_summary(run: Run) -> dict:
  with open(os.path.join(run.summary["workdir"], metrics.SUMMARY_FILE), encoding="utf-8") as f:
    return json.load(f)


def test_upload_bytes_by_hand(runs):
  """DiLoCo fp32: 2 learners × 40/10 rounds × 28,832 params × 4 bytes; Streaming fp4: per leaf,
  one float32 scale per 256 values plus half a byte per value."""
  assert runs["diloco"].summary["bytes_sent"] == 2 * 4 * 28832 * 4 == 922624
  fp4_all = sum(
      compression.encoded_nbytes("fp4", v.size) for v in runs["streaming"].sync.initial.values()
  )
  # Each learner sends every fragment 4 times: the whole model 4 times at fp4.
  assert runs["streaming"].summary["bytes_sent"] == 2 * 4 * fp4_all
  assert fp4_all < 28832 * 4 // 7
  assert math.isclose(runs["diloco"].summary["dp_bytes_per_token"], 901.0)
