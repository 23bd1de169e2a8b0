"""One learner's tokens/s alone vs as one of the Decoupled DiLoCo learners over gRPC (fp4, loopback).

  python scripts/bench_wire.py [--config=configs/shakespeare.py:mode=decoupled,learners=2]
      [--steps=60] [--warmup=5] [--others=1]

In one run, in this process: (1) learner 0 takes `steps` inner steps alone (no synchronizer);
(2) a synchronizer process starts on loopback, `--others` other learner processes join it, and
learner 0 (this process, the same compiled step) trains `steps` more steps as a Decoupled learner:
uploading fp4 fragments on its schedule, long-polling merged fragments and applying them. Both rates
skip the first `warmup` steps. Also prints bytes per token that gRPC actually carried for learner 0
(serialized messages both ways) against data-parallel's ring all-reduce of fp32 gradients, and
the codec's own count. The last line is `decoupled_vs_alone=R`.

On a machine with few cores the synchronizer and the other learners share learner 0's CPU, so the
ratio then also measures that contention; `--others=0` leaves only the synchronizer.
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402,F401

from diloco import multi  # noqa: E402
from diloco.rpc import client as client_lib, learner_main, local  # noqa: E402
from diloco.runtime import realtime  # noqa: E402


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
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--others", type=int, default=1)
    args = ap.parse_args()
    config = _config(args.config, 10 ** 6)
    if config.outer.codec != "fp4":
        raise ValueError(f"expected fp4 fragments, the config has codec={config.outer.codec}")
    if not 0 <= args.others < config.outer.learners:
        raise ValueError(f"--others must be in 0..{config.outer.learners - 1}")
    learner = learner_main.make_learner(config, 0)
    tokens_per_step = config.batch_size * config.seq_len
    batches = learner.island.data.train_iter

    # (1) alone: the same learner, its own parameters, no synchronizer.
    learner.versions = [0] * config.outer.fragments
    for _ in range(args.warmup):
        jax.block_until_ready(learner.step(next(batches)))
    t0 = time.perf_counter()
    for _ in range(args.steps):
        metrics = learner.step(next(batches))
    jax.block_until_ready(metrics)
    alone = args.steps * tokens_per_step / (time.perf_counter() - t0)

    # (2) decoupled: the same learner over gRPC, with `others` learner processes.
    learner.versions = [-1] * config.outer.fragments
    learner.steps = 0
    spec = f"{args.config},steps={args.steps + args.warmup + 10 ** 5}"
    cluster = local.LocalCluster(spec, config.outer.learners, tempfile.mkdtemp(prefix="wire-"))
    marks: dict[int, float] = {}
    try:
        cluster.start_sync()
        for m in range(1, 1 + args.others):
            cluster.start_learner(m)
        link = client_lib.GrpcLink(f"127.0.0.1:{cluster.port}", 0, cluster.token)

        def on_step(lrn, device_metrics):
            if lrn.steps in (args.warmup, args.warmup + args.steps):
                jax.block_until_ready(device_metrics)
                marks[lrn.steps] = time.perf_counter()
                if lrn.steps == args.warmup:
                    marks["bytes"] = link.bytes_sent + link.bytes_received
                    marks["codec"] = codec_bytes[0]

        codec_bytes = [0]
        upload = link.upload

        def counting_upload(up):
            upload(up)
            codec_bytes[0] += up.nbytes

        link.upload = counting_upload
        result = realtime.run_learner(
            learner, link, lambda: next(batches), args.warmup + args.steps,
            overlap=config.outer.overlap, blocking=config.outer.blocking, on_step=on_step,
            settle_timeout_s=0.0)
        wire = link.bytes_sent + link.bytes_received - marks["bytes"]
        link.close()
    finally:
        cluster.stop(grace_s=5.0)
    decoupled = args.steps * tokens_per_step / (marks[args.warmup + args.steps] - marks[args.warmup])
    tokens = args.steps * tokens_per_step
    dp = multi.dp_bytes_per_token(learner.island.param_count, config.outer.learners,
                                  config.outer.learners * tokens_per_step)
    print(f"model: {learner.island.param_count:,} params; M={config.outer.learners} learners "
          f"({args.others} other processes), P={config.outer.fragments}, "
          f"H={config.outer.inner_steps}, fp4, {tokens_per_step} tokens/step")
    print(f"alone:     {alone:,.0f} tokens/s")
    print(f"decoupled: {decoupled:,.0f} tokens/s (merges applied: {result['applied']}, "
          f"unreachable steps: {result['unreachable_steps']})")
    print(f"wire bytes/token (learner 0, both ways, serialized gRPC): {wire / tokens:.3f}; "
          f"codec upload bytes/token: {(codec_bytes[0] - marks['codec']) / tokens:.3f}")
    print(f"data-parallel bytes/token (ring all-reduce, fp32): {dp:.1f}; "
          f"ratio dp/wire = {dp / max(wire / tokens, 1e-12):.0f}x")
    print(f"decoupled_vs_alone={decoupled / alone:.2f}")


if __name__ == "__main__":
    main()
