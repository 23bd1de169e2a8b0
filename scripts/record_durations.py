"""Records each test's seconds into tests/durations.json, from which tests/conftest.py orders the
files (longest first, so the two xdist workers finish together) and marks the `slow` tier.

  python scripts/record_durations.py                   # runs the README's test command (~25 min)
  python scripts/record_durations.py --junit=run.xml   # reads a finished run's `--junitxml`

A test's seconds are its setup, call and teardown on one of two workers (pytest's junit `time`),
rounded to a tenth; the file also says when, at which commit and with which command."""

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "durations.json"
COMMAND = "-m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests"


def seconds(junit: pathlib.Path) -> dict[str, float]:
  """nodeid -> seconds of every test case in a junit XML file (skipped ones too)."""
  out = {}
  for case in ET.parse(junit).getroot().iter("testcase"):
    module, name = case.get("classname", ""), case.get("name", "")
    parts = module.split(".")
    # classname is "tests.test_x" for a function, "tests.test_x.TestClass" for a method
    cut = next(i for i, p in enumerate(parts) if p.startswith("test_")) + 1
    nodeid = "/".join(parts[:cut]) + ".py::" + "::".join([*parts[cut:], name])
    out[nodeid] = round(float(case.get("time", 0.0)), 1)
  return out


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--junit", type=pathlib.Path, help="a finished run's junit XML")
  args = parser.parse_args(argv)
  command = f"python {COMMAND}"
  if args.junit is None:
    with tempfile.TemporaryDirectory() as tmp:
      args.junit = pathlib.Path(tmp) / "run.xml"
      subprocess.run([sys.executable, *COMMAND.split(), f"--junitxml={args.junit}"], cwd=REPO)
      recorded = seconds(args.junit)
  elif not args.junit.is_file():
    print(f"--junit={args.junit}: no such file", file=sys.stderr)
    return 2
  else:
    recorded, command = seconds(args.junit), f"python {COMMAND} --junitxml={args.junit.name}"
  commit = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
  ).stdout.strip()
  OUT.write_text(
      json.dumps(
          {
              "recorded": datetime.date.today().isoformat(),
              "commit": commit,
              "command": command,
              "seconds": dict(sorted(recorded.items())),
          },
          indent=1,
      )
      + "\n"
  )
  print(f"{OUT.relative_to(REPO)}: {len(recorded)} tests, {sum(recorded.values()):.0f} s summed")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
