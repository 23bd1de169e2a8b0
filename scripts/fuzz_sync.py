"""Long runs of the synchronizer's property-based state machine (tests/sync_machine.py).

  python scripts/fuzz_sync.py --examples=10000 [--steps=40] [--seed=N]

Each example draws a policy, an outer optimizer, an outlier screen and codecs, then a random
interleaving of up to --steps events (joins, leaves, valid and bad uploads, rounds, ticks,
checkpoints, restarts), checking the invariants after every one. New examples every run (unlike the
test suite's derandomized ones) unless --seed is given. Prints what was exercised, then
`examples=N failures=0` as the last line; a failure prints hypothesis's minimal reproduction and
exits non-zero.
"""

import os
import sys
import time

from absl import app, flags
from hypothesis import HealthCheck, settings

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
)
import sync_machine  # pylint: disable=wrong-import-position

_EXAMPLES = flags.DEFINE_integer("examples", 1000, "State machine examples to run.")
_STEPS = flags.DEFINE_integer("steps", 40, "Events per example (at most).")
_SEED = flags.DEFINE_integer("seed", None, "Seed of the examples (default: new ones each run).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  test = sync_machine.SyncMachine.TestCase
  test.settings = settings(
      max_examples=_EXAMPLES.value,
      stateful_step_count=_STEPS.value,
      deadline=None,
      database=None,
      suppress_health_check=list(HealthCheck),
  )
  if _SEED.value is not None:
    import hypothesis  # pylint: disable=import-outside-toplevel

    test.runTest = hypothesis.seed(_SEED.value)(test.runTest)
  t0 = time.perf_counter()
  failures = 0
  try:
    test("runTest").runTest()
  except Exception:  # pylint: disable=broad-except  (hypothesis printed the minimal example)
    failures = 1
    raise
  finally:
    counts = sync_machine.COUNTS
    print(
        f"{time.perf_counter() - t0:.0f} s; events handled {counts['events']:,}; "
        f"restarts {counts['restarts']:,}; merges {counts['merge']:,}"
    )
    for k, n in sorted(counts.items()):
      if k.startswith("reject"):
        print(f"  {k:32} {n:>9,}")
    print(f"examples={_EXAMPLES.value} failures={failures}")


if __name__ == "__main__":
  app.run(main)
