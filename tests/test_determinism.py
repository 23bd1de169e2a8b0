"""Same command, same machine, same devices: bit-identical global parameters and summary.

Two fresh processes run one Decoupled DiLoCo command (the virtual runtime: three learners, fp4,
RDA, the last learner 3x slower) and one data-parallel command; their `params_sha256` (sha256 of
every final global tensor) and summaries must agree exactly. What changes the bits across machines
(XLA's CPU instruction set, the device count) is measured in BENCHMARKS.md, "Determinism".
"""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = {
    "decoupled": ["--config=configs/shakespeare.py:mode=decoupled,runlocal,learners=3"]
    + ["--config.sim.speeds=1,1,3"],
    "dp": ["--config=configs/shakespeare.py:runlocal"],
}
# wall-clock figures (throughput, MFU, the measured CPU peak), where it ran
VARYING = ("wall_s", "tokens_per_s", "tokens_per_s_per_chip", "mfu", "peak_flops_per_s")
VARYING += ("workdir", "timeline")


def _run(args: list[str], workdir: str) -> dict:
  subprocess.run(
      [sys.executable, "-m", "experiments.train", *args, f"--workdir={workdir}"]
      + ["--config.progress_bar=False"],
      cwd=REPO,
      env={**os.environ, "PYTHONPATH": REPO},
      check=True,
      capture_output=True,
      timeout=300,
  )
  with open(os.path.join(workdir, "summary.json"), encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_two_fresh_processes_end_bit_identical(name, tmp_path):
  a, b = (_run(COMMANDS[name], str(tmp_path / f"run{i}")) for i in range(2))
  assert len(a["params_sha256"]) == 64 and a["params_sha256"] == b["params_sha256"]
  for k in VARYING:
    a.pop(k, None), b.pop(k, None)
  assert a == b  # every other summary number too: losses, merges, bytes, per-learner counts
