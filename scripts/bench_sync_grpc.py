"""One synchronizer process under load over gRPC: sustained merges per second against
scripts/bench_sync.py's in-process round, and the learners' polls while a save is in flight
(issue 72, point 4).

  python scripts/bench_sync_grpc.py --workdir=runs/sync_grpc [--model=90m] [--fragments=1]
      [--learners=4] [--uplink=int8] [--seconds=60] [--config.KEY=VALUE ...]

Starts the synchronizer (`experiments.synchronizer`, the Decoupled preset: K = 1, RDA, background
saves at `outer.sync_save_share`) for `model` cut into `fragments` fragments (90m in one: 360 MB of
float32), and `learners` uploader processes that join and then, without pause, upload a fixed
random delta of each fragment in the uplink codec against the newest version they hold and
long-poll for the merge (no training: the synchronizer's side is what is measured). After
`seconds` they report finished and the synchronizer is stopped. Printed: uploads and merges per
second over the run, the bytes of uploads merged per second against the in-process bench's at the
same fragment size (`merged_vs_bench`), the synchronizer's saves, and each poll's wait (upload
sent to merge received) split by whether a save was in flight during it (`poll_in_save_vs_not`,
medians). Report in WORKDIR/report.json.
"""

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from diloco import jsonl  # noqa: E402
from diloco.rpc import local  # noqa: E402

REPO = local.REPO


def _config_arg(args) -> str:
  return f"configs/shakespeare.py:mode=decoupled,model={args.model}"


def _overrides(args) -> list[str]:
  """The run's --config.KEY=VALUE flags: P, the codec, and any given on the command line."""
  mine = [f"--config.outer.fragments={args.fragments}", f"--config.outer.codec={args.uplink}"]
  return mine + list(args.config)


def _uploader(m: int, port: int, token: str, args, out: str) -> None:
  """Learner m: join, then upload and long-poll until `args.seconds` have passed."""
  from configs import shakespeare
  from diloco.config import checks
  from diloco.outer.codecs import compression
  from diloco.outer.protocol import Upload
  from diloco.rpc import client, sync_main
  from diloco.runtime import link as link_lib
  from diloco.sweeps import sweep

  config = shakespeare.get_config(f"mode=decoupled,model={args.model}")
  for flag in _overrides(args):
    key, _, raw = flag[len("--config.") :].partition("=")
    sweep.set_from_text(config, key, raw)
  config = checks.prepare(config)
  sync = sync_main.make_synchronizer(config)  # for the fragments' paths and shapes
  rng = np.random.default_rng(m)
  fragment_bytes = max(sum(v.nbytes for v in g.values()) for g in sync.globals.values())
  deltas = {
      p: compression.encode_tree(
          {k: rng.standard_normal(v.shape, np.float32) * np.float32(1e-4) for k, v in g.items()},
          args.uplink,
      )
      for p, g in sync.globals.items()
  }
  del sync
  link = client.GrpcLink(f"127.0.0.1:{port}", m, token)
  joined = link.join(tuple([0] * args.fragments), tuple([0] * args.fragments))
  versions, gen = list(joined.versions), joined.generation
  polls, uploads, failed, t_end = [], 0, [], time.time() + args.seconds
  while time.time() < t_end:
    for p, delta in deltas.items():
      now = time.time()
      up = Upload(m, p, versions[p], delta, 8, 8 * 512, now, now, 1.0, base_generation=gen)
      try:
        link.upload(up)
        uploads += 1
        t0 = time.time()
        got = []
        while not any(s.fragment == p and s.version > versions[p] for s in got):
          got += link.poll(30.0)
        polls.append((t0, time.time()))
        for s in got:
          versions[s.fragment] = max(versions[s.fragment], s.version)
        link.progress(False)
      except (link_lib.Unreachable, link_lib.Refused) as e:  # as a learner: note it, go on
        failed.append((time.time(), type(e).__name__, str(e)[:120]))
        if isinstance(e, link_lib.Refused):
          joined = link.join(tuple(versions), tuple([gen] * len(versions)))
  link.progress(True)
  link.close()
  with open(out, "w") as f:
    json.dump(
        {"uploads": uploads, "polls": polls, "failed": failed, "fragment_bytes": fragment_bytes}, f
    )


def _bench(args, mbytes: int) -> float:
  """scripts/bench_sync.py's bytes of uploads merged per second at this size (M uploads)."""
  cmd = [sys.executable, "scripts/bench_sync.py", f"--mbytes={mbytes}", f"--uplink={args.uplink}"]
  cmd += [f"--learners={args.learners}", "--merge=rda", "--nophases", "--repeats=2"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
  gbps = re.search(r"\(([\d.]+) GB/s of uploads merged\)", out)
  return float(gbps.group(1)) * 1e9


def _saves(sync_dir: str) -> list[tuple[float, float]]:
  rows = jsonl.read(os.path.join(sync_dir, "metrics.jsonl"))
  return [(r["start"], r["start"] + r["seconds"]) for r in rows if r.get("event") == "save"]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--model", default="90m")
  parser.add_argument("--fragments", type=int, default=1)
  parser.add_argument("--learners", type=int, default=4)
  parser.add_argument("--uplink", default="int8")
  parser.add_argument("--seconds", type=float, default=60.0)
  parser.add_argument("--nobench", action="store_true", help="skip the in-process reference")
  args, more = parser.parse_known_args()
  args.config = [f for f in more if f.startswith("--config.")]
  if len(args.config) < len(more):
    parser.error(f"unexpected arguments: {[f for f in more if not f.startswith('--config.')]}")
  c = local.LocalCluster(
      _config_arg(args), args.learners, args.workdir, tuple(_overrides(args)), absent_after_s=120.0
  )  # (an upload of hundreds of MB from one of M processes on few cores takes seconds)
  ctx = multiprocessing.get_context("spawn")
  try:
    port = c.start_sync(timeout_s=600)
    outs = [os.path.join(args.workdir, f"uploader{m}.json") for m in range(args.learners)]
    procs = [
        ctx.Process(target=_uploader, args=(m, port, c.token, args, outs[m]))
        for m in range(args.learners)
    ]
    t0 = time.time()
    for p in procs:
      p.start()
    for p in procs:
      p.join()
    wall = time.time() - t0
  finally:
    c.stop(grace_s=120.0)
  sync_dir = os.path.join(args.workdir, "sync")
  with open(os.path.join(sync_dir, "summary.json")) as f:
    summary = json.load(f)
  runs = [json.load(open(o)) for o in outs]
  saves = _saves(sync_dir)
  merges = [
      r for r in jsonl.read(os.path.join(sync_dir, "metrics.jsonl")) if r.get("event") == "merge"
  ]
  merge_times = [r["wall_time"] for r in merges]
  span = max(merge_times) - min(merge_times)
  uploads_merged = sum(len(r["learners"]) for r in merges)
  frag_bytes = runs[0]["fragment_bytes"]
  in_save, outside = [], []
  for run in runs:
    for a, b in run["polls"]:
      (in_save if any(s < b and a < e for s, e in saves) else outside).append(b - a)
  report = {
      "wall_s": wall,
      "merges": summary["merges"],
      "merges_per_s": (len(merge_times) - 1) / span if span > 0 else None,
      "uploads": sum(r["uploads"] for r in runs),
      "failed_calls": [f for r in runs for f in r["failed"]],
      "uploads_merged": uploads_merged,
      "saves": len(saves),
      "save_seconds": [round(e - s, 3) for s, e in saves],
      "checkpoints": summary.get("checkpoints"),
      "poll_s_in_save": sorted(in_save),
      "poll_s_outside": sorted(outside),
  }
  print(json.dumps({k: v for k, v in report.items() if not k.startswith("poll_s")}, indent=1))
  if in_save and outside:
    med_in, med_out = statistics.median(in_save), statistics.median(outside)
    print(f"polls: {len(in_save)} during a save (median {med_in:.3f} s), {len(outside)} not "
          f"(median {med_out:.3f} s)")  # fmt: skip
    print(f"poll_in_save_vs_not={med_in / med_out:.2f}")
  if not args.nobench and span > 0:
    rate = uploads_merged / span * frag_bytes
    bench = _bench(args, round(frag_bytes / 2**20))
    report.update(uploads_merged_bytes_per_s=rate, bench_bytes_per_s=bench)
    print(f"merged {rate / 1e9:.2f} GB/s of uploads, the bench {bench / 1e9:.2f}: "
          f"merged_vs_bench={rate / bench:.2f}")  # fmt: skip
  with open(os.path.join(args.workdir, "report.json"), "w") as f:
    json.dump(report, f, indent=1)


if __name__ == "__main__":
  main()
