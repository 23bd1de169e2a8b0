"""Samples text from a finished run: python -m experiments.sample --workdir=RUN --prompt="ROMEO:".

The run's newest parameters, model and tokenizer (from RUN/config.json) continue the prompt by
`--tokens` tokens, each drawn at `--temperature` from the `--top_k` likeliest; the same seed gives
the same text. The decode loop recomputes the whole (padded, fixed-length) window for every token
with one jitted forward pass, no KV cache (diloco/inner/sampling.py). Exit code 2: no run in RUN,
or an empty prompt (one message).
"""

import sys

from absl import app, flags, logging

from diloco.config import cli as config_cli
from diloco.runners import finished_run

_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir (RUN/<mode> after mode=compare).")
_PROMPT = flags.DEFINE_string("prompt", "\n", "Text to continue.")
_TOKENS = flags.DEFINE_integer("tokens", 200, "New tokens to sample.", lower_bound=0)
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.8, "Softmax temperature; 0: greedy.", lower_bound=0
)
_TOP_K = flags.DEFINE_integer(
    "top_k", 40, "Sample from the k likeliest tokens; 0: all.", lower_bound=0
)
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
flags.mark_flags_as_required(["workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  run = finished_run.open_run(_WORKDIR.value)
  try:
    _, text = finished_run.sample(
        run, _PROMPT.value, _TOKENS.value, _TEMPERATURE.value, _TOP_K.value, _SEED.value
    )
  except finished_run.InputError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(config_cli.USAGE_ERROR)
  print(_PROMPT.value + text, flush=True)


if __name__ == "__main__":
  config_cli.run(main)
