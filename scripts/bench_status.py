"""Does reading the status service slow the synchronizer's gRPC handling? Heartbeats per second.

  python scripts/bench_status.py [--learners=4] [--seconds=4] [--repeats=3]

A synchronizer host, its gRPC service and its status service run in this process as in
`experiments.synchronizer` (the tiny model's Decoupled DiLoCo synchronizer). M learner clients join
and send Progress heartbeats (each takes the host's lock and feeds the status board) as fast as
they can from their own threads for --seconds; meanwhile the status page is read not at all, every
0.5 s (a person's browser), or back to back (a scraper with no pause). Runs are interleaved and the
best of --repeats is kept. The last line is `with_status_polling_vs_without=X`: heartbeats per
second while /status is read back to back over heartbeats per second without readers.
"""

import argparse
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import shakespeare  # noqa: E402
from diloco.rpc import (  # noqa: E402
    client as client_lib,
    limits as limits_lib,
    service,
    status_server,
    sync_main,
)
from diloco.runtime import threads  # noqa: E402

TOKEN = "bench"


def _reader(port: int, pause_s: float, stop: threading.Event, counts: list) -> None:
  req = urllib.request.Request(f"http://127.0.0.1:{port}/status")
  req.add_header("Authorization", f"Bearer {TOKEN}")
  while not stop.is_set():
    with urllib.request.urlopen(req, timeout=10) as r:
      r.read()
    counts[0] += 1
    if pause_s:
      stop.wait(pause_s)


def heartbeats(links, port: int, seconds: float, pause_s: float | None) -> tuple[float, float]:
  """(heartbeats per second, status reads per second) over `seconds`; pause_s None: no reader."""
  stop, counts, reads = threading.Event(), [0] * len(links), [0]

  def beat(i):
    while not stop.is_set():
      links[i].progress(False)
      counts[i] += 1

  workers = [threading.Thread(target=beat, args=(i,)) for i in range(len(links))]
  if pause_s is not None:
    workers.append(threading.Thread(target=_reader, args=(port, pause_s, stop, reads)))
  for w in workers:
    w.start()
  time.sleep(seconds)
  stop.set()
  for w in workers:
    w.join()
  return sum(counts) / seconds, reads[0] / seconds


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--learners", type=int, default=4)
  ap.add_argument("--seconds", type=float, default=4.0)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  config = shakespeare.get_config(f"mode=decoupled,runlocal,learners={args.learners}")
  parts, _ = threads.build_parts(config)
  limits = limits_lib.Limits(absent_after_s=60.0, progress_per_s=1e9)
  host, board = sync_main.watched_host(parts.make_sync(), limits, lambda r: None, lambda s: None)
  server, svc, port = service.serve(host, TOKEN, port=0, limits=limits)
  board.service = svc
  status = status_server.StatusServer(board, TOKEN, bind="127.0.0.1", port=0, count=board.count)
  links = []
  for m in range(args.learners):
    link = client_lib.GrpcLink(f"127.0.0.1:{port}", m, TOKEN, limits=limits)
    link.report = lambda m=m: dict(total_steps=100, total_tokens=1000, loss=2.0 + m)
    link.join(tuple([-1] * config.outer.fragments), ())
    links.append(link)
  cases = {"no reader": None, "reader every 0.5 s": 0.5, "reader back to back": 0.0}
  best = {name: (0.0, 0.0) for name in cases}
  heartbeats(links, status.port, 1.0, None)  # warm-up
  for _ in range(args.repeats):
    for name, pause in cases.items():
      rate, reads = heartbeats(links, status.port, args.seconds, pause)
      if rate > best[name][0]:
        best[name] = (rate, reads)
  for name, (rate, reads) in best.items():
    print(f"{name:>20}: {rate:8.0f} heartbeats/s ({reads:.0f} status reads/s)", flush=True)
  for link in links:
    link.close()
  status.close()
  server.stop(0).wait()
  host.close()
  ratio = best["reader back to back"][0] / best["no reader"][0]
  print(f"with_status_polling_vs_without={ratio:.3f}")


if __name__ == "__main__":
  main()
