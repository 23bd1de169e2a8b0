"""Evaluates a finished run: python -m experiments.evaluate --workdir=RUN [--text_glob=GLOB]
[--tasks=TASKS].

Loss and bits per byte of the run's newest parameters (of each mode's run after mode=compare) on
its own validation batches, or on the text files of a glob, with the run's tokenizer and model
read from RUN/config.json. Prints a table; writes nothing.

With --tasks, lm-evaluation-harness tasks instead (pip install -e '.[eval]'): harness task or
group names, our shipped tasks (shakespeare_line_end) and local task folders (YAML and data
files), comma-separated. Each run's results go to RUN/eval_harness/<tasks>.json, a row of
RUN/metrics.jsonl and its trackers; the table gives each task's headline metric and its standard
error, and their average where the tasks share a metric.

Exit code 2: no run in RUN, a glob without enough text, a task that does not exist or a task
folder whose YAML does not load (one message, before anything is written).
"""

import os
import sys

from absl import app, flags, logging

from diloco.config import cli as config_cli
from diloco.runners import finished_run

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir (experiments.train's --workdir).")
_TEXT_GLOB = flags.DEFINE_string(
    "text_glob", "", "Text files to evaluate on (** recurses); empty: the run's validation split."
)
_SEQUENCES = flags.DEFINE_integer(
    "sequences",
    None,
    "Sequences to score, spread over the text (0: all of it); default the run's "
    "data.final_eval_sequences (what its summary's eval_* scored).",
)
_TASKS = flags.DEFINE_string("tasks", "", "Harness tasks (comma-separated names or folders).")
_LIMIT = flags.DEFINE_integer("limit", None, "At most this many items per task (a quick look).")
_BATCH_ROWS = flags.DEFINE_integer(
    "batch_rows", 8, "Rows of packed requests per forward pass (rounded up to the devices)."
)
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if _TASKS.value:
    _harness(finished_run.run_dirs(_WORKDIR.value))
    return
  rows = []
  for workdir in finished_run.run_dirs(_WORKDIR.value):
    run = finished_run.open_run(workdir, sequences=_SEQUENCES.value)
    try:
      rows.append(finished_run.evaluate(run, _TEXT_GLOB.value))
    except finished_run.InputError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(config_cli.USAGE_ERROR)
  print(finished_run.format_table(rows), flush=True)


def _harness(workdirs: list[str]) -> None:
  """The harness's tasks on each run, recorded in it."""
  os.environ.setdefault("TQDM_DISABLE", "1")
  try:
    from diloco.harness import model, records, tasks
  except ImportError as e:
    _refuse(f"--tasks needs lm-evaluation-harness: pip install -e '.[eval]' ({e})")
  try:
    task_list = tasks.resolve(_TASKS.value)
    runs = [finished_run.open_run(w) for w in workdirs]
  except finished_run.InputError as e:
    _refuse(str(e))
  lines = []
  for run in runs:
    lm = model.JaxLM.from_run(run, _BATCH_ROWS.value)
    try:
      results = tasks.run(lm, task_list, limit=_LIMIT.value)
    except ValueError as e:  # a request the model cannot score (longer than its window)
      _refuse(f"--tasks={_TASKS.value} on {run.workdir}: {e}")
    scores = tasks.scores(results)
    path = records.write(run, task_list, results, records.row(run.step, scores, lm.stats.padding))
    lines.append((run.workdir, run.step, scores))
    logging.info("wrote %s", path)
  print(records.format_table(lines), flush=True)


def _refuse(message: str) -> None:
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(config_cli.USAGE_ERROR)


if __name__ == "__main__":
  config_cli.run(main)
