"""The plan every TPU launcher runs before it creates anything (diloco/plan): a config whose
learner does not fit its slice's chips stops the launch with the numbers and the keys.

With --noplan the launch goes on without one and says so; on a machine without libtpu it says how
to install it and goes on without one. The summary goes to stderr, each line behind '# ', so
that a dry run's standard output stays the commands alone.
"""

import sys

from diloco.plan import devices, make


def preflight(config, accelerator_type: str, enabled: bool = True, out=None) -> bool:
  """Plans one learner of `config` on a slice of `accelerator_type` and prints the summary;
  raises make.DoesNotFit (a ConfigError: exit 2) when it does not fit. True when a plan ran."""
  out = out or sys.stderr
  if not enabled:
    print("# plan skipped (--noplan): nothing checked that the learner fits its chips", file=out)
    return False
  try:
    plan = make.make_plan(config, accelerator_type, key="deploy.tpu.accelerator_type")
  except devices.LibtpuMissing as e:
    print(f"# no plan: {e}; the launch goes on without one", file=out, flush=True)
    return False
  for line in make.summary(plan, config).splitlines():
    print(f"# plan: {line}", file=out)
  out.flush()
  refused = make.refusal(plan, config)
  if refused:
    raise refused
  return True
