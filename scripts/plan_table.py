"""The plan table of BENCHMARKS.md: presets x TPU slices, with the project's defaults and with the
best memory settings it offers, each compiled by libtpu's TPU compiler on this CPU machine.

  python scripts/plan_table.py --out=runs/plan_table.jsonl [--presets=35m,180m]
      [--topologies=v5e-8,v5p-8,v5p-64,v6e-8] [--per_chip=8] [--seq_len=2048]

Every row is `experiments.plan`'s figures (diloco/plan) for mode=dp on one slice, 8 sequences of
2,048 bytes per chip: `defaults` is the config as it stands (float32 compute, remat=none,
mesh.fsdp=1); `best` is bfloat16 compute, remat=block and FSDP over every chip. Rows are appended
to --out as they finish and a rerun skips the rows already there; the markdown table is printed
at the end.
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import shakespeare  # noqa: E402
from diloco.plan import make, report, tpu  # noqa: E402
from diloco.sweeps import sweep  # noqa: E402

_OUT = flags.DEFINE_string("out", "runs/plan_table.jsonl", "Rows, one JSON object per line.")
_PRESETS = flags.DEFINE_list("presets", ["35m", "180m"], "model sizes (180m: the largest preset)")
_TOPOLOGIES = flags.DEFINE_list("topologies", ["v5e-8", "v5p-8", "v5p-64", "v6e-8"], "slices")
_PER_CHIP = flags.DEFINE_integer("per_chip", 8, "sequences per chip per step")
_SEQ = flags.DEFINE_integer("seq_len", 2048, "sequence length")

SETTINGS = {
    "defaults": {},
    "best": {
        "model.dtype": "bfloat16",
        "model.remat": "block",
        "mesh.data": "1",
        "mesh.fsdp": "CHIPS",
    },
}


def config_for(preset: str, chips: int, setting: str):
  c = shakespeare.get_config(f"model={preset}")
  keys = {"seq_len": str(_SEQ.value), "batch_size": str(_PER_CHIP.value * chips)}
  for key, raw in {**keys, **SETTINGS[setting]}.items():
    sweep.set_from_text(c, key, raw.replace("CHIPS", str(chips)))
  return c


def row(preset: str, topology: str, setting: str) -> dict:
  chips = tpu.parse(topology).chips
  start = time.perf_counter()
  plan = make.make_plan(config_for(preset, chips, setting), topology)
  figures = report.figures(plan)
  return {
      "preset": preset,
      "setting": setting,
      **{k: figures[k] for k in ("topology", "params", "peak_bytes", "hbm_bytes", "fits")},
      **{k: figures[k] for k in ("roofline_s", "step_s", "tokens_per_s_per_chip", "compile_s")},
      "refused": [p["refused"] for p in figures["programs"] if p["refused"]],
      "wall_s": time.perf_counter() - start,
  }


def table(rows: list[dict]) -> str:
  head = (
      "| preset | slice | setting | peak GiB/chip | of HBM | compile s | roofline ms | "
      "tokens/s/chip at MFU 0.462 |\n|---|---|---|---|---|---|---|---|"
  )
  lines = [head]
  for r in rows:
    share = r["peak_bytes"] / r["hbm_bytes"]
    fits = "" if r["fits"] else " (does not fit)"
    # A program the compiler refused has only its temporaries' size, and no FLOPs to roof.
    roof = "refused" if r["refused"] else f"{1e3 * r['roofline_s']:.1f}"
    tokens = "-" if r["refused"] else f"{r['tokens_per_s_per_chip']:,.0f}"
    lines.append(
        f"| {r['preset']} | {r['topology']} | {r['setting']} | {r['peak_bytes'] / tpu.GiB:.2f}"
        f"{fits} | {share:.0%} | {r['compile_s']:.0f} | {roof} | {tokens} |"
    )
  return "\n".join(lines)


def main(argv):
  del argv
  done = []
  if os.path.exists(_OUT.value):
    with open(_OUT.value, encoding="utf-8") as f:
      done = [json.loads(line) for line in f if line.strip()]
  have = {(r["preset"], r["topology"], r["setting"]) for r in done}
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  for preset in _PRESETS.value:
    for topology in _TOPOLOGIES.value:
      for setting in SETTINGS:
        if (preset, topology, setting) in have:
          continue
        r = row(preset, topology, setting)
        print(json.dumps(r), flush=True)
        done.append(r)
        with open(_OUT.value, "a", encoding="utf-8") as f:
          f.write(json.dumps(r) + "\n")
  print(table(done))


if __name__ == "__main__":
  app.run(main)
