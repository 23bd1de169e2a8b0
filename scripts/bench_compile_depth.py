"""Compile time of the train step against depth, blocks in a loop and in one scan, for a TPU.

  python scripts/bench_compile_depth.py                       # v5p-8, width 1024, 12 and 48
  python scripts/bench_compile_depth.py --layers=12,24,48 --topology=v5p-8 --noloop

Each case is the `180m` preset's width (d_model 1024, 16 heads, MLP 4096, bf16, remat=block,
FSDP over the slice) at --layers blocks, its train step traced, lowered and compiled by libtpu's
TPU compiler for the slice (`experiments.plan`'s devices; nothing runs). Scan on is
`model.scan_layers=True` (the preset's default), off the Python loop over blocks. Last lines: the
deepest over the shallowest compile time, `scan_ratio=X` and `loop_ratio=Y` (issue 52's
acceptance: X <= 1.5 for 48 against 12 layers).
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # configs/

from absl import app, flags

from configs import shakespeare
from diloco.config import checks
from diloco.plan import devices as devices_lib, make, programs, tpu

_LAYERS = flags.DEFINE_list("layers", ["12", "48"], "Depths to compile (shallowest first).")
_TOPOLOGY = flags.DEFINE_string("topology", "v5p-8", "The TPU slice compiled for.")
_SEQ = flags.DEFINE_integer("seq", 1024, "Sequence length.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per step (the slice's).")
_LOOP = flags.DEFINE_bool("loop", True, "Also compile the blocks in a Python loop.")


def compile_seconds(layers: int, scan: bool) -> float:
  """Seconds to trace, lower and compile the train step of `layers` blocks for the slice."""
  c = shakespeare.get_config("mode=dp,model=180m")
  c.model.num_layers, c.model.scan_layers = layers, scan
  c.seq_len, c.batch_size, c.model.max_len = _SEQ.value, _BATCH.value, max(_SEQ.value, 2048)
  c = checks.prepare(c)
  pod = tpu.parse(_TOPOLOGY.value, "--topology")
  devices = devices_lib.slice_devices(pod, make.slice_shape(c, pod))
  start = time.perf_counter()
  learner = programs.build(c, devices, make.BYTE_VOCAB, c.batch_size)
  compiled = programs.train(learner)
  seconds = time.perf_counter() - start
  print(
      f"layers={layers:>3} scan={str(scan):<5} {seconds:7.1f} s (compile {compiled.compile_s:.1f} s),"
      f" peak {compiled.peak_bytes / tpu.GiB:.2f} GiB per chip"
  )
  return seconds


def main(argv):
  del argv
  depths = [int(n) for n in _LAYERS.value]
  modes = (True, False) if _LOOP.value else (True,)
  times = {(n, s): compile_seconds(n, s) for s in modes for n in depths}
  lo, hi = depths[0], depths[-1]
  print(f"scan_ratio={times[(hi, True)] / times[(lo, True)]:.2f}  ({hi} against {lo} layers)")
  if _LOOP.value:
    print(f"loop_ratio={times[(hi, False)] / times[(lo, False)]:.2f}")


if __name__ == "__main__":
  app.run(main)
