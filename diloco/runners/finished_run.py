"""A finished run, read back from its workdir: evaluated on any text, or sampled from.

Everything comes from WORKDIR/config.json (the model, tokenizer, data, batch and sequence length)
and the newest parameters `diloco/inner/warm_start.py` reads (a data-parallel run's newest
checkpoint, a multi-learner run's final global parameters). The held-out set is the one the run's
own evaluation used: the same batches of the same size (learner 0's batch in multi-learner
modes), so its loss is the run's final `eval_loss`. Nothing is written into the workdir.
"""

import dataclasses
import json
import math
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import errors, paths
from diloco.config import build
from diloco.data import batching, pipeline, sources
from diloco.data.corpus import stream
from diloco.inner import evaluation, island as island_lib, sampling, warm_start
from diloco.recovery import workdir as workdir_lib

COMPARE = "compare"  # its runs live in WORKDIR/<mode>/


InputError = errors.InputError  # a flag the finished run cannot take (a glob without text)


@dataclasses.dataclass
class FinishedRun:
  """A run's config, an island like the one its final evaluation ran on, and its parameters."""

  workdir: str
  config: ml_collections.ConfigDict
  island: island_lib.Island
  tokenizer: Any  # diloco.data.tokenizers.Tokenizer; None for images
  step: int
  params: Any  # host arrays


@dataclasses.dataclass
class _Held:
  """What `evaluation.evaluate` reads of a dataset."""

  eval_set: batching.EvalSet
  bytes_per_token: float


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """WORKDIR/config.json, or a WorkdirError saying that no run was here."""
  path = paths.join(workdir, workdir_lib.CONFIG)
  paths.require_bucket(workdir, f"workdir {workdir}")
  if not paths.isfile(path):
    raise workdir_lib.WorkdirError(
        f"workdir {workdir} holds no run (no {workdir_lib.CONFIG}); pass the --workdir of a run "
        "that `python -m experiments.train` wrote"
    )
  try:
    return ml_collections.ConfigDict(json.loads(paths.read_text(path)))
  except ValueError as e:  # (json's JSONDecodeError)
    raise workdir_lib.WorkdirError(f"{path} is not a run's config ({e})") from e


def run_dirs(workdir: str) -> list[str]:
  """The workdirs of the runs under `workdir`: itself, or each mode's after mode=compare."""
  config = read_config(workdir)
  if config.mode != COMPARE:
    return [workdir]
  return [paths.join(workdir, m) for m in config.compare.modes.split(",")]


def open_run(workdir: str, sequences: int | None = None) -> FinishedRun:
  """The run in `workdir` (not a mode=compare directory: one of its modes' sub-directories).

  `sequences` replaces the run's `data.final_eval_sequences` (0: the whole split).
  """
  config = read_config(workdir)
  if config.mode == COMPARE:
    subs = ", ".join(run_dirs(workdir))
    raise workdir_lib.WorkdirError(f"workdir {workdir} holds mode=compare: pick one of {subs}")
  cfg, devices = config.copy_and_resolve_references(), jax.devices()
  cfg.init_from = ""  # this run's parameters replace the warm start's
  if sequences is not None:
    cfg.data.final_eval_sequences = sequences
  cfg.batch_size = build.eval_batch_size(cfg)  # the final evaluation's island: learner 0's
  if cfg.mode != "dp":
    devices = build.learner_devices(cfg)[0]
  splits = pipeline.load_splits(cfg.data)
  isl = island_lib.build_island(cfg, devices, splits=splits)
  try:
    step, params = warm_start.newest(workdir, isl.abstract_state(), what="--workdir")
  except FileNotFoundError as e:
    raise workdir_lib.WorkdirError(f"{e}{_why_no_params(workdir)}") from e
  try:
    tokenizer = None if isl.data.image_shape else splits.tokenizer
  except ValueError as e:  # a corpus's tokenizer file moved or changed since it was prepared
    raise InputError(f"--workdir={workdir}: {e}") from e
  return FinishedRun(workdir, cfg, isl, tokenizer, step, params)


def _why_no_params(workdir: str) -> str:
  """What summary.json says about a run that left no parameters."""
  try:
    summary = json.loads(paths.read_text(paths.join(workdir, "summary.json")))
  except (OSError, ValueError):
    return " (and no summary.json: the run has not finished)"
  if not summary.get("finished", True):
    return f" (summary.json: stopped by {summary.get('stopped_by')}; run its command again)"
  return ""


def evaluate(run: FinishedRun, text_glob: str = "") -> dict[str, Any]:
  """Loss and bits per byte (or accuracy) of the run's parameters on the records of its final
  evaluation (those its summary's eval_* scored), or on the text files of `text_glob` through the
  run's tokenizer, sampled the same way; with the set's size and sha256."""
  fns = run.island.fns
  params = jax.device_put(run.params, fns.state_shardings.params)
  data = _text(run, text_glob) if text_glob else run.island.data
  scores = evaluation.evaluate(fns, params, data, final=True)
  sequences = len(data.eval_set.records(final=True))
  return {
      "run": run.workdir,
      "step": run.step,
      "data": text_glob or "validation split",
      "sequences": sequences,
      **({"tokens": sequences * run.config.seq_len} if data.bytes_per_token else {}),
      **scores,
      "eval_sha256": data.eval_set.sha256(final=True),
  }


def _text(run: FinishedRun, text_glob: str) -> _Held:
  """The glob's files, tokenized and packed as the run's validation text, sampled like it."""
  if run.tokenizer is None:
    raise InputError(f"--text_glob: {run.workdir} is a run on images, not text")
  cfg = run.config
  try:
    files = sources.read_text_files(text_glob, "--text_glob")
  except ValueError as e:
    raise InputError(str(e)) from e
  tokens = [run.tokenizer.encode(t) for _, t in files]
  packed_documents = run.island.data.packed  # a corpus run's model: documents joined by an id
  if packed_documents:
    tokens = [np.append(t, run.tokenizer.eod_id).astype(t.dtype) for t in tokens]
  corpus = sources.TokenCorpus.from_documents(
      [p for p, _ in files], tokens, [len(t) for _, t in files]
  )
  try:
    if packed_documents:
      packed = stream.PackedDocuments(corpus.tokens, cfg.seq_len, run.tokenizer.eod_id)
    else:
      packed = sources.PackedTokenSource(corpus.tokens, cfg.seq_len)
    final_N = batching.eval_sample(len(packed), cfg.data.final_eval_sequences)
  except ValueError as e:
    raise InputError(f"--text_glob={text_glob!r}: {e}") from e
  held = batching.EvalSet(packed, final_N, final_N, cfg.data.eval_batch_size)
  return _Held(held, corpus.num_bytes / len(corpus.tokens))


def sample(
    run: FinishedRun, prompt: str, tokens: int, temperature: float, top_k: int, seed: int
) -> tuple[np.ndarray, str]:
  """`tokens` new token ids after `prompt` and their text (bytes that are not UTF-8 replaced)."""
  if run.tokenizer is None:
    raise InputError(f"{run.workdir} is a run on images: there is no text to sample")
  ids = run.tokenizer.encode(prompt.encode("utf-8"))
  try:
    new = sampling.generate(
        run.island.fns.graphdef,
        run.params,
        ids,
        tokens,
        run.island.model_cfg.max_len,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
    )
  except ValueError as e:
    raise InputError(str(e)) from e
  return new, run.tokenizer.decode(new).decode("utf-8", errors="replace")


def format_table(rows: list[dict[str, Any]]) -> str:
  """One line per evaluation: run, step, data, sequences, tokens, loss, bits per byte / accuracy,
  and the first 12 hex digits of the evaluation set's sha256."""
  extra = [k for k in ("eval_bpb", "eval_accuracy") if any(k in r for r in rows)]
  head = ["run", "step", "data", "sequences", "tokens", "eval_loss", *extra, "set"]
  rows = [{**r, "set": r["eval_sha256"][:12]} for r in rows]
  cells = [[_cell(r.get(k, "")) for k in head] for r in rows]
  widths = [max(len(c) for c in col) for col in zip(head, *cells)]
  return "\n".join(
      "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
      for line in [head, *cells]
  )


def _cell(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:.4f}" if math.isfinite(v) else str(v)
  return f"{v:,}" if isinstance(v, int) else str(v)
