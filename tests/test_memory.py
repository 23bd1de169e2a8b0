"""A synchronizer process keeps freed large arrays for reuse (outer/memory.py): measured in page
faults of a fresh process, with and without the setting."""

import json
import subprocess
import sys

import pytest

PROBE = """
import json, resource, sys
import numpy as np
from diloco.outer import memory
kept = memory.keep_freed_arrays() if sys.argv[1] == "keep" else False
def round_():
  x = np.ones(16 << 20, np.float32)  # 64 MiB, touched whole, then freed
  del x
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  round_()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str) -> dict:
  out = subprocess.run(
      [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
  )
  return json.loads(out.stdout)


def test_freed_arrays_are_reused_without_page_faults():
  kept, returned = _faults("keep"), _faults("default")
  if not kept["kept"]:
    pytest.skip("not glibc: mallopt is not available")
  # 5 rounds of 64 MiB: when glibc unmaps each array, the next one is touched afresh, at least
  # one fault per page (32 per round even if every page is a 2 MiB huge page); a reused array
  # faults not even one round's worth.
  assert returned["faults"] >= 5 * 32, returned
  assert kept["faults"] < 32, kept
