"""One learner's tokens/s alone vs as one of the Decoupled DiLoCo learners over gRPC (fp4, loopback).

  python scripts/bench_wire.py [--config=configs/shakespeare.py:mode=decoupled,learners=2]
      [--steps=40] [--warmup=5] [--others=1] [--no_pin] [--link=learner|plain|background]

In one run, in this process: (1) learner 0 takes `steps`/2 inner steps alone (no synchronizer);
(2) a synchronizer process starts on loopback, `--others` other learner processes join it, and
learner 0 (this process, the same compiled step) trains `steps` steps as a Decoupled learner:
uploading fp4 fragments on its schedule, long-polling merged fragments and applying them; (3) once
the synchronizer and the others are stopped, it takes `steps`/2 more steps alone. The alone rate is
that of (1) and (3) together, which brackets (2) in time, so that a load on the machine that drifts
during the run weighs on both rates alike. Rates skip the first `warmup` steps of (1) and (2).
Also prints bytes per token that gRPC actually carried for learner 0 (serialized messages both
ways) against data-parallel's ring all-reduce of fp32 gradients, and the codec's own count. The
last line is `decoupled_vs_alone=R`.

What the ratio means: the measured learner's slowdown from the protocol (its own uploads, polls,
heartbeats, applying merged fragments, its gRPC threads), as on real hardware where the
synchronizer and the other learners run on other machines. So this process (every thread of it)
is pinned to the first allowed CPU core in BOTH runs, and the synchronizer and the other learners
to the remaining cores (they inherit the mask of the thread that starts them); without pinning
(`--no_pin`, or a single core) they compete for the learner's CPU and the ratio also measures
that contention. The load average is printed with each rate: other work on the machine slows
both runs, but not necessarily equally. As a cross-check less sensitive to such load, it also
prints tokens per CPU-second of this process (every thread: training, gRPC, heartbeats) in both
runs; that ratio misses time the learner spends idle waiting for the network. To tell the two
apart it prints, for each run, how much of the wall time this process's threads spent on a CPU
and runnable but waiting for the core (another task had it), from the kernel's schedstat.

`--link=learner` (the default) is the link as the learner process (experiments.learner) uses it
for Decoupled learners: Joins, long polls and uploads made by threads
(`async_link.BackgroundLink` with `send_in_thread=True`, one upload per fragment out at most;
until 2026-12-07 uploads went from the training thread while the next step computed).
`--link=plain` is the bare gRPC link (a poll round trip before every step). `--link=background`
is a BackgroundLink with one upload out at most.
"""

import argparse
import contextlib
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pin() -> tuple[set[int], set[int]] | None:
  """Pins this thread (and every thread and process it starts later) to the first allowed core;
  (learner cores, other cores), or None when fewer than two cores are allowed."""
  cores = sorted(os.sched_getaffinity(0))
  if len(cores) < 2:
    return None
  mine, others = {cores[0]}, set(cores[1:])
  os.sched_setaffinity(0, mine)  # before jax or grpc start any thread: they inherit it
  return mine, others


@contextlib.contextmanager
def _cores(cores: set[int] | None):
  """This thread on `cores` meanwhile: processes started now inherit them."""
  if cores is None:
    yield
    return
  before = os.sched_getaffinity(0)
  os.sched_setaffinity(0, cores)
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)


def _allowed(pid: int) -> str:
  with open(f"/proc/{pid}/status", encoding="utf-8") as f:
    return next(line.split(":")[1].strip() for line in f if line.startswith("Cpus_allowed_list"))


def _threads_on(cores: set[int]) -> bool:
  """Whether every thread of this process is confined to `cores`."""
  return all(os.sched_getaffinity(int(tid)) <= cores for tid in os.listdir("/proc/self/task"))


def _sched() -> tuple[float, float]:
  """(seconds on a CPU, seconds runnable but waiting for one), summed over this process's
  threads (the kernel's schedstat; a thread that ended meanwhile drops out)."""
  on_cpu = waiting = 0
  for tid in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{tid}/schedstat", encoding="utf-8") as f:
        run, wait, _ = (int(x) for x in f.read().split())
    except (FileNotFoundError, ProcessLookupError):
      continue
    on_cpu, waiting = on_cpu + run, waiting + wait
  return on_cpu / 1e9, waiting / 1e9


def _where(wall: float, start: tuple[float, float], end: tuple[float, float]) -> str:
  on_cpu, waiting = end[0] - start[0], end[1] - start[1]
  return (
      f"its threads on a CPU {on_cpu / wall:.0%} of the time, runnable but waiting for the "
      f"core {waiting / wall:.0%}"
  )


def _load() -> str:
  return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def _config(arg: str, steps: int):
  from configs import shakespeare

  spec = arg.split(":", 1)[1] if ":" in arg else None
  c = shakespeare.get_config(spec)
  with c.unlocked():
    c.steps = steps
  return c


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="configs/shakespeare.py:mode=decoupled,learners=2")
  ap.add_argument("--steps", type=int, default=40)
  ap.add_argument("--warmup", type=int, default=5)
  ap.add_argument("--others", type=int, default=1)
  ap.add_argument("--no_pin", action="store_true", help="leave every process on every core")
  ap.add_argument(
      "--link",
      choices=("learner", "plain", "background"),
      default="learner",
      help="learner: as experiments.learner (polls in a thread); plain: the gRPC "
      "link as it is; background: uploads in a thread too (experimental)",
  )
  args = ap.parse_args()
  pinned = None if args.no_pin else _pin()

  import jax

  from diloco.runners import islands as islands_lib
  from diloco.rpc import client as client_lib
  from diloco.rpc import learner_main, local
  from diloco.runtime import async_link, learner_loop

  config = _config(args.config, 10**6)
  if config.outer.codec != "fp4":
    raise ValueError(f"expected fp4 fragments, the config has codec={config.outer.codec}")
  if args.link != "plain" and config.outer.blocking:
    raise ValueError(f"--link={args.link} is for non-blocking (Decoupled) learners")
  if not 0 <= args.others < config.outer.learners:
    raise ValueError(f"--others must be in 0..{config.outer.learners - 1}")
  learner = learner_main.make_learner(config, 0)
  tokens_per_step = config.batch_size * config.seq_len
  batches = learner.island.data.train_iter

  def alone(steps: int) -> tuple[float, str, float]:
    """Wall seconds for `steps` steps of the learner alone, the load average before them, and
    the CPU seconds this process spent meanwhile."""
    load, s0 = _load(), _sched()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
      metrics = learner.step(next(batches))
    jax.block_until_ready(metrics)
    wall = time.perf_counter() - t0
    return wall, load, time.process_time() - c0, _where(wall, s0, _sched())

  # (1) alone: the same learner, its own parameters, no synchronizer.
  learner.versions = [0] * config.outer.fragments
  for _ in range(args.warmup):
    jax.block_until_ready(learner.step(next(batches)))
  first = alone(args.steps // 2)

  # (2) decoupled: the same learner over gRPC, with `others` learner processes.
  learner.versions = [-1] * config.outer.fragments
  learner.steps = 0
  spec = f"{args.config},steps={args.steps + args.warmup + 10 ** 5}"
  cluster = local.LocalCluster(spec, config.outer.learners, tempfile.mkdtemp(prefix="wire-"))
  marks: dict = {}
  try:
    with _cores(pinned and pinned[1]):
      cluster.start_sync()
      for m in range(1, 1 + args.others):
        cluster.start_learner(m)
    placement = {name: _allowed(p.pid) for name, p in cluster.procs.items()}
    link = client_lib.GrpcLink(f"127.0.0.1:{cluster.port}", 0, cluster.token)
    if args.link == "learner":
      link = learner_main.loop_link_for(link, config.outer.blocking, config.outer.fragments)
    elif args.link == "background":
      link = async_link.BackgroundLink(link)

    def on_step(lrn, device_metrics):
      if lrn.steps in (args.warmup, args.warmup + args.steps):
        jax.block_until_ready(device_metrics)
        marks[lrn.steps] = time.perf_counter()
        marks[("cpu", lrn.steps)] = time.process_time()
        marks[("sched", lrn.steps)] = _sched()
        if lrn.steps == args.warmup:
          marks["bytes"] = link.bytes_sent + link.bytes_received
          marks["codec"] = link.codec_bytes_sent
          marks["load"] = _load()

    result = learner_loop.run_learner(
        learner,
        link,
        lambda: next(batches),
        args.warmup + args.steps,
        overlap=config.outer.overlap,
        blocking=config.outer.blocking,
        on_step=on_step,
        settle_timeout_s=0.0,
    )
    deadline = time.monotonic() + 30.0  # the last uploads still queued go out first
    while getattr(link, "pending_uploads", lambda: 0)() and time.monotonic() < deadline:
      time.sleep(0.01)
    wire = link.bytes_sent + link.bytes_received - marks["bytes"]
    codec = link.codec_bytes_sent - marks["codec"]
    confined = pinned is None or _threads_on(pinned[0])
    link.close()
  finally:
    cluster.stop(grace_s=5.0)
  # (3) alone again, nothing else of this benchmark running.
  second = alone(args.steps - args.steps // 2)
  alone_rate = args.steps * tokens_per_step / (first[0] + second[0])
  timed_s = marks[args.warmup + args.steps] - marks[args.warmup]
  decoupled = args.steps * tokens_per_step / timed_s
  tokens = args.steps * tokens_per_step
  dp = islands_lib.dp_bytes_per_token(
      learner.island.param_count, config.outer.learners, config.outer.learners * tokens_per_step
  )
  print(
      f"model: {learner.island.param_count:,} params; M={config.outer.learners} learners "
      f"({args.others} other processes), P={config.outer.fragments}, "
      f"H={config.outer.inner_steps}, fp4, {tokens_per_step} tokens/step, {args.steps} timed "
      f"steps after {args.warmup}"
  )
  if pinned is None:
    print(f"cores: not pinned ({os.cpu_count()} cores): the ratio includes CPU contention")
  else:
    print(
        f"cores: learner 0 (this process, all {len(os.listdir('/proc/self/task'))} threads"
        f"{'' if confined else ', NOT all'} confined) on {sorted(pinned[0])}; "
        + ", ".join(f"{n} on {c}" for n, c in placement.items())
    )
  print(f"link: {args.link}")
  before = args.steps // 2 * tokens_per_step / first[0]
  after = (args.steps - args.steps // 2) * tokens_per_step / second[0]
  print(
      f"alone:     {alone_rate:,.0f} tokens/s (before: {before:,.0f} at {first[1]}; "
      f"after: {after:,.0f} at {second[1]})"
  )
  print(
      f"decoupled: {decoupled:,.0f} tokens/s ({marks['load']}; merges applied: "
      f"{result['applied']}, unreachable steps: {result['unreachable_steps']})"
  )
  print(
      f"wire bytes/token (learner 0, both ways, serialized gRPC): {wire / tokens:.3f}; "
      f"codec upload bytes/token: {codec / tokens:.3f}"
  )
  print(
      f"data-parallel bytes/token (ring all-reduce, fp32): {dp:.1f}; "
      f"ratio dp/wire = {dp / max(wire / tokens, 1e-12):.0f}x"
  )
  cpu_alone = args.steps * tokens_per_step / (first[2] + second[2])
  cpu_decoupled = tokens / (marks[("cpu", args.warmup + args.steps)] - marks[("cpu", args.warmup)])
  sched = marks[("sched", args.warmup)], marks[("sched", args.warmup + args.steps)]
  print(f"alone (before): {first[3]}; decoupled: {_where(timed_s, *sched)}")
  print(
      f"tokens per CPU-second of this process (all its threads; less sensitive to other load): "
      f"alone {cpu_alone:,.0f}, decoupled {cpu_decoupled:,.0f}, "
      f"ratio {cpu_decoupled / cpu_alone:.2f}"
  )
  print(f"decoupled_vs_alone={decoupled / alone_rate:.2f}")


if __name__ == "__main__":
  main()
