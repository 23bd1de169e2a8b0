r"""Cross-datacenter bandwidth needed per method to reach a target compute utilization.

Command (Streaming DiLoCo's Table 4, 1B rows, and the Decoupled DiLoCo blog's 198 / 0.84 Gbit/s):

  python -m experiments.bandwidth --config=configs/bandwidth.py --workdir=runs/bandwidth

Variants after the colon, comma-separated (e.g. `configs/bandwidth.py:blog,method=decoupled`):
  method=all|data_parallel|diloco|streaming|decoupled
  blog        the blog setting instead of Table 4's (27B parameters, 46 layers, 5 s per step,
              8 datacenters, 24 fragments each every 24 steps, overlap 2, fp4).
  nocompare   skip the published comparisons (only the config's own setting).

Any key can be overridden on the command line, e.g. `--config.step_time_s=0.5 --config.codec=int8`;
unknown keys fail (the config is locked).

Expected (2-core CPU, about 4 s): Table 4 reproduced within 22% on every 50-95% cell, each at most
one grid step above the published one (data-parallel 97.6 / 180 / 213 / 231 Gbit/s against 86.8 /
152.6 / 184.2 / 222.3); the blog setting gives 198.1 Gbit/s for data-parallel and 0.835 Gbit/s for
Decoupled DiLoCo. See BENCHMARKS.md.
"""

import ml_collections

from diloco.config import variants
from diloco.sim import bandwidth_reference as reference


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  arg = variants.parse_arg(arg, method="all", blog=False, nocompare=False)
  work = reference.BLOG_WORKLOAD if arg.blog else reference.TABLE4_WORKLOAD
  methods = dict(reference.TABLE4_METHODS, **(reference.BLOG_METHODS if arg.blog else {}))
  c = ml_collections.ConfigDict()
  c.method = arg.method  # all | data_parallel | diloco | streaming | decoupled
  c.model_params = work.model_params
  c.layers = work.layers
  c.step_time_s = work.step_time_s
  c.forward_fraction = work.forward_fraction  # backward takes the rest of the step
  c.learners = methods["learners"]  # M: learners, i.e. datacenters
  c.inner_steps = methods["inner_steps"]  # H
  c.fragments = methods["fragments"]  # P (streaming, decoupled)
  c.overlap = methods["overlap"]  # tau, in steps (streaming, decoupled)
  c.codec = methods["codec"]  # streaming and decoupled payloads
  c.dp_codec = methods["dp_codec"]  # data-parallel gradients
  c.diloco_codec = methods["diloco_codec"]  # DiLoCo outer gradients
  c.targets = (0.9,) if arg.blog else reference.TABLE4_TARGETS
  c.compare_published = not arg.nocompare
  c.lock()
  return c
