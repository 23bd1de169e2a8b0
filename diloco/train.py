"""train_and_evaluate(config, workdir): the one entry every main, test and notebook calls.

A mode is a choice made here, once: one table maps each mode to its runner (its preset is data in
diloco/config/presets.py, applied when the config is resolved). A run starts only once its config
is resolved and checked whole (`prepare`), and only in a workdir that holds nothing or the same run.
"""

import json
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
from absl import logging

from diloco import paths
from diloco import data as data_lib, metrics
from diloco.config import bounds, checks, deploy as deploy_lib, keys
from diloco.data.corpus import mixture, splits as corpus_splits
from diloco.plan import peak
from diloco.recovery import workdir as workdir_lib
from diloco.rpc import multihost
from diloco.runners import compare, dp, islands

Runner = Callable[[ml_collections.ConfigDict, str], dict[str, Any]]


def _compare(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  return compare.run(config, workdir, train=train_and_evaluate)


MODES: dict[str, Runner] = {
    "dp": dp.run,
    "diloco": islands.run,
    "streaming": islands.run,
    "decoupled": islands.run,
    "compare": _compare,
}


prepare = checks.prepare  # resolve, then check every key (checks.ConfigError names them all)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, restart: bool = False, **runner_options: Any
) -> dict[str, Any]:
  """Runs the configured mode in `workdir`, writes summary.json and returns the summary.

  The config is resolved and checked first (`prepare`); a workdir that holds a run of another
  config is refused (`restart`: moved aside to WORKDIR.old-N) before anything is written.
  `runner_options` go to the mode's runner: `parts=` (from `config.build.local_learners`) lets
  a test or notebook watch a multi-learner run's synchronizer.
  """
  config = prepare(config)
  run = MODES[config.mode]
  if "deploy" in config:
    deploy_lib.check_platform(config.deploy, jax.default_backend())
  local = jax.default_backend() == "cpu" and not config.get("distributed", False)
  limit = bounds.local_memory() if local else (bounds.LARGEST_POD_BYTES, bounds.POD)
  if local:
    problems = bounds.problems(config, limit)  # this machine holds the step
    if problems:
      raise checks.ConfigError(problems, config)
  distributed = config.get("distributed", False)
  if distributed and not jax.distributed.is_initialized():  # (experiments.train's --coordinator
    multihost.initialize(True)  # does it)
  if config.data.source == "corpus":  # a bad corpus is named before the workdir is touched
    corpus_splits.fetch_own(
        config.data, *_readers(config), jax.process_index(), jax.process_count()
    )
  hold = workdir_lib.Hold(workdir)
  reserve = None
  fresh = not paths.exists(workdir)  # removed again if the run stops before writing anything
  if not distributed:  # one run at a time in a workdir: a second is refused naming the first
    hold.acquire()
  finished = False
  try:
    decision = workdir_lib.claim(
        workdir, json.loads(config.to_json()), restart, ignore=keys.INVOCATION
    )
    if decision == "restarted" and not distributed:  # the old run moved aside, hold and all
      hold.release()
      hold.acquire()
    if distributed:
      if jax.process_index() == 0:  # the island's processes share the workdir: one holds it
        hold.acquire()
    with data_lib.reuse_splits():  # the runner's islands and the summary read the data once
      # the vocabulary, learners against documents and the logits' bytes, before any write
      problems = bounds.data_problems(config, data_lib.load_splits(config.data), limit)
      if problems:
        raise checks.ConfigError(problems, config)
      workdir_lib.write_config(workdir, config.to_json(indent=2))
      reserve = _reserve(workdir) if jax.process_index() == 0 else None
      try:
        summary = run(config, workdir, **runner_options)
      except BaseException:
        _release(reserve)  # (before unclaim, which frees only a workdir with nothing else in it)
        if decision != "resume" and jax.process_index() == 0:  # a new run that wrote nothing
          workdir_lib.unclaim(workdir)
        raise
      if config.mode != "compare":  # each compared run's summary has its own
        summary["data"] = data_summary(config, summary.pop("corpus_tokens", None))
        summary.update(utilisation(summary))
    summary["workdir"] = paths.absolute(workdir)
    if jax.process_index() == 0:
      _release(reserve)
      _write_summary(workdir, summary)
    finished = True
    return summary
  finally:
    _release(reserve)
    hold.release()
    if fresh and not finished and jax.process_index() == 0:
      workdir_lib.remove_if_empty(workdir)


def _readers(config: ml_collections.ConfigDict) -> tuple[list[int], int]:
  """The learners whose data this process reads, and how many learners share the data."""
  if config.mode in ("dp", "compare"):  # (compare: its data-parallel run reads every shard)
    return [0], 1
  return list(range(config.outer.learners)), config.outer.learners


RESERVE_FILE, RESERVE_BYTES = "summary.reserve", 256 * 1024


def _reserve(workdir: str) -> str | None:
  """RESERVE_BYTES held in a local workdir from the start of a run until its summary is written:
  a disk that the run's checkpoints filled still has room for summary.json. (An orbax step's
  size varied from 0.52 to 0.92 MiB between runs of one config; on a 1 MiB disk the summary
  failed to fit in 1 of 8 runs.) None in a bucket, or when the disk cannot hold it."""
  if paths.is_url(workdir):
    return None
  path = paths.join(workdir, RESERVE_FILE)
  try:
    with open(path, "wb") as f:
      f.write(bytes(RESERVE_BYTES))
  except OSError:
    paths.remove(path)
    return None
  return path


def _release(reserve: str | None) -> None:
  if reserve is not None:
    paths.remove(reserve)


def _write_summary(workdir: str, summary: dict[str, Any]) -> None:
  """summary.json; on a storage failure (a full disk) one clear message, and the summary (with
  summary_write_failed, so the main exits EXIT_SAVE_FAILED) is still returned."""
  try:
    metrics.write_summary(workdir, summary)
  except OSError as e:
    logging.error(
        "could not write %s/summary.json (%s); the summary is printed instead", workdir, e
    )
    summary["summary_write_failed"] = str(e)


def utilisation(summary: dict[str, Any]) -> dict[str, Any]:
  """tokens/s per chip and MFU of a run's summary over the devices it used (plan/peak.py)."""
  rate, per_token = summary.get("tokens_per_s"), summary.get("flops_per_token")
  if not rate or not per_token or rate != rate:  # nothing trained (resumed at the end): none
    return {}
  return peak.utilisation(rate, per_token, jax.devices())


def data_summary(config: ml_collections.ConfigDict, corpus_tokens=None) -> dict[str, Any]:
  """summary.json's `data`: the source, tokenizer, splits and evaluation set of a resolved config;
  with `corpus_tokens` (the tokens the run's readers gave from each corpus), its `mixture`."""
  splits = data_lib.load_splits(config.data)
  out = data_lib.describe(splits, config.data, seq_len=config.seq_len)
  if corpus_tokens is not None:
    names, shares = [t.directory for t in splits.train], [t.weight for t in splits.train]
    out["mixture"] = mixture.contributions(names, shares, [corpus_tokens])
  return out


def format_summary(summary: dict[str, Any]) -> str:
  """A few lines for the terminal."""
  keys = (
      "mode",
      "steps",
      "tokens",
      "tokens_per_s",
      "mfu",
      "eval_loss",
      "eval_bpb",
      "eval_accuracy",
      "wall_s",
      "params",
      "plot",
  )
  lines = [f"  {k:>14}: {_fmt(summary[k])}" for k in keys if k in summary]
  for k, v in summary.items():  # eval.harness_tasks: each task's headline and its standard error
    if k.startswith("harness/") and not k.endswith("_stderr"):
      name = k.removeprefix("harness/").replace("/", " ")
      lines.append(f"  {name:>14}: {v:.4f} ±{summary.get(k + '_stderr', float('nan')):.4f}")
  lines.append(f"  {'outputs':>14}: {summary['workdir']} (summary.json, metrics.jsonl, tb/)")
  return "\n".join(["summary:"] + lines)


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:,.4f}" if abs(v) < 100 else f"{v:,.0f}"
  if isinstance(v, int):
    return f"{v:,}"
  return json.dumps(v) if not isinstance(v, str) else v
