"""Evaluates a finished run: python -m experiments.evaluate --workdir=RUN [--text_glob=GLOB].

Loss and bits per byte of the run's newest parameters (of each mode's run after mode=compare) on
its own validation batches, or on the text files of a glob, with the run's tokenizer and model
read from RUN/config.json. Prints a table; writes nothing. Exit code 2: no run in RUN, or a glob
without enough text (one message).
"""

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
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  rows = []
  for workdir in finished_run.run_dirs(_WORKDIR.value):
    run = finished_run.open_run(workdir, sequences=_SEQUENCES.value)
    try:
      rows.append(finished_run.evaluate(run, _TEXT_GLOB.value))
    except finished_run.InputError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(config_cli.USAGE_ERROR)
  print(finished_run.format_table(rows), flush=True)


if __name__ == "__main__":
  config_cli.run(main)
