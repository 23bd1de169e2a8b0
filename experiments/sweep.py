"""Runs a sweep: python -m experiments.sweep --config=FILE[:variants] --workdir=DIR [--parallel=N].

The config file defines get_sweep(arg) (diloco/sweeps/sweep.py). Each point runs in DIR/<name>; a
point with a summary.json is skipped, so running the same command again resumes. The table goes to
DIR/results.jsonl and DIR/results.csv; --export=DEST copies the summaries to check in.
"""

from absl import app, flags, logging

from diloco.config import cli as config_cli
from diloco import paths
from diloco.sweeps import sweep, sweep_run

_CONFIG = flags.DEFINE_string("config", None, "FILE[:variants] of a config file with get_sweep.")
_WORKDIR = flags.DEFINE_string("workdir", None, "One sub-directory per point, and the table.")
_PARALLEL = flags.DEFINE_integer("parallel", 1, "Worker processes (0: in this process).")
_KEYS = flags.DEFINE_list("keys", [], "Summary keys of the table (default: the file's SWEEP_KEYS).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print each point's command; run nothing.")
_PROGRESS = flags.DEFINE_bool("progress_bar", True, "A progress bar over the points.")
_TABLE = flags.DEFINE_string("table", "results", "The table's name: DIR/<table>.jsonl and .csv.")
_EXPORT = flags.DEFINE_string(
    "export", "", "Also copy every finished point's summary.json (without its workdir) here."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)
  try:
    workdir = paths.local_only(_WORKDIR.value, "a sweep")
  except ValueError as err:
    raise app.UsageError(str(err)) from None
  try:
    table = sweep_run.run(
        _CONFIG.value,
        workdir,
        _PARALLEL.value,
        _KEYS.value,
        _DRY_RUN.value,
        _PROGRESS.value,
        _TABLE.value,
    )
  except sweep.SweepError as e:
    raise app.UsageError(str(e)) from e
  if _DRY_RUN.value:
    return
  failed = [r for r in table if r["status"] != "done"]
  print(
      f"{len(table) - len(failed)} of {len(table)} points done; table in {_WORKDIR.value}/{_TABLE.value}.csv"
  )
  for r in failed:
    print(f"  {r['status']}: {r['name']}: {r['error']}")
  if _EXPORT.value:
    print(f"{sweep_run.export(_WORKDIR.value, _EXPORT.value)} summaries copied to {_EXPORT.value}")
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  config_cli.run(main)
