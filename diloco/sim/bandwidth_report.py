"""experiments.bandwidth's job: bandwidth per method for a config, with the published comparisons.

It builds on the model (bandwidth.py) and on the published settings it is checked against
(bandwidth_reference.py), and writes WORKDIR/bandwidth.json.
"""

import json

import ml_collections
import numpy as np

from diloco import paths
from diloco.sim import bandwidth, bandwidth_reference as reference


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Bandwidth per method for the config; the Table 4 comparison and the blog setting; JSON."""
  work = bandwidth.workload_from_config(config)
  targets = tuple(config.targets)
  per_method = {
      m.name: bandwidth.needed(work, m, targets) for m in bandwidth.methods_from_config(config)
  }
  out = {"setting": config.to_dict(), "gbit_per_s": per_method}
  print(
      format_needed(
          per_method,
          f"{work.model_params / 1e9:g}B parameters, {work.layers} layers, "
          f"{work.step_time_s:g} s/step, M={config.learners}",
      )
  )
  if config.compare_published:
    rows = reference.table4_rows()
    out["table4"] = rows
    print(reference.format_table4(rows))
    blog = reference.blog_comparison()
    out["blog"] = blog
    print(reference.format_blog(blog))
  paths.write_text(
      paths.join(workdir, "bandwidth.json"), json.dumps(out, indent=1, default=_json_default)
  )
  return out


def format_needed(per_method: dict[str, dict[str, float]], title: str) -> str:
  keys = next(iter(per_method.values())).keys()
  lines = [
      f"Gbit/s needed per datacenter link ({title})",
      f"{'method':<14}" + "".join(f"{k + '%':>10}" for k in keys),
  ]
  for name, row in per_method.items():
    lines.append(f"{name:<14}" + "".join(f"{v:>10.3g}" for v in row.values()))
  return "\n".join(lines)


def _json_default(x):
  if isinstance(x, (np.floating, np.integer)):
    return x.item()
  if isinstance(x, tuple):
    return list(x)
  raise TypeError(f"not JSON serialisable: {type(x)}")
