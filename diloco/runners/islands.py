"""mode=diloco|streaming|decoupled: M islands and a synchronizer on the virtual runtime.

With a fault schedule (the `chaos` section) the runtime is runtime/chaotic.py and the summary gains
a `chaos` section; learner and synchronizer checkpoints (`outer.learner_checkpoint_every`,
`outer.sync_checkpoint_every`) can also be on without faults.
"""

import collections
import math
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco.chaos import schedule as chaos
from diloco import data as data_lib
from diloco.inner import evaluation
from diloco.outer import fragments, integrity
from diloco.inner import island as island_lib
from diloco import metrics
from diloco.outer import optimizers, policies, protocol
from diloco.recovery import rejoin
from diloco.outer.learner import Learner
from diloco.runtime import virtual_chaos, virtual
from diloco.outer.synchronizer import Synchronizer


def parse_list(text: str, n: int, kind: type, default: Any, what: str) -> list:
    """'1,1,3' -> [1, 1, 3]; empty -> n copies of default; wrong length fails clearly."""
    if not text:
        return [default] * n
    try:
        values = [kind(x) for x in str(text).split(",")]
    except ValueError as e:
        raise ValueError(f"{what}={text!r} is not a comma-separated list of {kind.__name__}") from e
    if len(values) != n:
        raise ValueError(f"{what}={text!r} has {len(values)} entries for {n} learners")
    return values


def split_devices(devices: list, m: int) -> list[list]:
    """M islands of len(devices) // M devices each; with fewer devices than M, islands share."""
    if m < 1:
        raise ValueError(f"need at least one learner, got {m}")
    if m > len(devices):
        return [[devices[i % len(devices)]] for i in range(m)]
    k = len(devices) // m
    return [devices[i * k:(i + 1) * k] for i in range(m)]


def make_screen(o: ml_collections.ConfigDict) -> integrity.OutlierScreen | None:
    """The synchronizer's outlier screen (and clip) of an `outer` config section; None when off."""
    if o.outlier_factor <= 0:
        return None
    return integrity.OutlierScreen(o.outlier_factor, o.outlier_history, o.outlier_window,
                                   clip_factor=o.get("clip_factor", 0.0))


def make_outer(o: ml_collections.ConfigDict):
    if o.optimizer == "nesterov":
        return optimizers.nesterov(o.lr, o.momentum)
    if o.optimizer == "sgd":
        return optimizers.sgd(o.lr)
    return optimizers.delayed_nesterov(o.lr, o.momentum, o.delayed_period, o.delayed_c)


def dp_bytes_per_token(num_params: int, learners: int, tokens_per_round: int) -> float:
    """Ring all-reduce of fp32 gradients: each of M workers sends and receives 2(M−1)/M of them."""
    per_worker = 2.0 * (learners - 1) / learners * 4 * num_params
    return 2 * learners * per_worker / tokens_per_round


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    """Trains M learners to the token budget and evaluates the synchronizer's global model."""
    o, sim = config.outer, config.sim
    m_count = o.learners
    batches = parse_list(sim.batch_sizes, m_count, int, config.batch_size, "sim.batch_sizes")
    speeds = parse_list(sim.speeds, m_count, float, 1.0, "sim.speeds")
    starts = parse_list(sim.start_times, m_count, float, 0.0, "sim.start_times")
    if any(s <= 0 for s in speeds) or any(b <= 0 for b in batches):
        raise ValueError("sim.speeds and sim.batch_sizes must be positive")
    t_wall = time.perf_counter()
    splits = data_lib.load_splits(config.data)
    islands = []
    for m, devices in enumerate(split_devices(jax.devices(), m_count)):
        cfg_m = config.copy_and_resolve_references()
        with cfg_m.unlocked():
            cfg_m.batch_size = batches[m]
        islands.append(island_lib.build_island(
            cfg_m, devices, shard_index=m, num_shards=m_count, splits=splits,
            init_params=islands[0].init_params if islands else None))
    params0 = fragments.flatten(jax.device_get(islands[0].init_state().params))
    frag = fragments.make(o.fragment_kind, params0, o.fragments)
    schedule = fragments.Schedule(o.fragments, o.inner_steps)

    def make_learner(m: int) -> Learner:
        return Learner(m, islands[m], frag, schedule, o.codec, o.alpha, batches[m] * config.seq_len)

    learners = [make_learner(m) for m in range(m_count)]
    for learner in learners:
        learner.load_global(params0, [0] * o.fragments)
    policy = policies.from_config(config)
    screen = make_screen(o)

    def make_sync() -> Synchronizer:
        return Synchronizer(params0, frag, policy, make_outer(o),
                            downlink_codec=o.downlink_codec or o.codec, screen=screen,
                            quorum_of="members" if o.quorum == 0 and not o.elastic else "live",
                            checkpoint_every=o.sync_checkpoint_every)

    sync = make_sync()
    for m in range(m_count):
        sync.handle(_join(m, o.fragments))
    faults = chaos.from_config(config.chaos, m_count, horizon_s=config.steps * sim.step_s)
    if any(f.kind == "sync_crash" for f in faults) and not o.sync_checkpoint_every:
        raise ValueError("sync_crash faults need synchronizer checkpoints: set "
                         "outer.sync_checkpoint_every > 0")
    recover = None
    if faults or o.learner_checkpoint_every or o.sync_checkpoint_every:
        recover = rejoin.Recovery(workdir, make_learner, [isl.data.train_iter for isl in islands],
                                    o.learner_checkpoint_every, o.sync_checkpoint_every)

    writer = metrics.MetricsWriter(workdir)
    merges: list[dict] = []
    evals: list[dict] = []
    rejected: collections.Counter = collections.Counter()
    state = {"total_steps": 0, "pending": [None] * m_count}
    eval_every = config.eval_every * m_count

    def evaluate(sim_time: float) -> dict[str, float] | None:
        if runtime.sync is None:  # down: nothing to evaluate until it restarts
            return None
        row = evaluate_global(islands[0], runtime.sync)
        row.update(step=state["total_steps"] // m_count, sim_time_s=sim_time,
                   tokens=sum(l.tokens for l in learners))
        writer.write(row)
        evals.append(row)
        return row

    def on_step(m, learner, device_metrics, now):
        prev, state["pending"][m] = state["pending"][m], (learner.steps, device_metrics, now)
        if prev is not None:
            _log_learner(writer, config, m, learner, *prev)
        state["total_steps"] += 1
        if state["total_steps"] % eval_every == 0:
            evaluate(now)

    def on_log(record):
        if record["event"] == "merge":
            merges.append(record)
        elif record["event"] == "reject":
            rejected[record["code"]] += 1
        writer.write({"step": state["total_steps"] // m_count, **record}, prefix="sync/")

    def on_chaos(record):
        writer.write({"step": state["total_steps"] // m_count, **record}, prefix="chaos/")

    clocks = [virtual.LearnerClock(step_s=sim.step_s * speeds[m] * batches[m] / config.batch_size,
                                   rng=np.random.default_rng([config.seed, m]),
                                   jitter=sim.step_jitter, start_s=starts[m])
              for m in range(m_count)]
    args = (learners, sync, clocks, virtual.Network(sim.latency_s, sim.bandwidth_gbps))
    kwargs = dict(next_batch=lambda m: next(islands[m].data.train_iter),
                  token_budget=config.steps * sum(batches) * config.seq_len, overlap=o.overlap,
                  blocking=o.blocking, on_step=on_step, on_log=on_log, recovery=recover)
    if faults:
        with open(os.path.join(workdir, "chaos_schedule.txt"), "w", encoding="utf-8") as f:
            f.write(chaos.format_schedule(faults))
        runtime = virtual_chaos.ChaosRuntime(*args, **kwargs, faults=faults, make_sync=make_sync,
                                       seed=config.chaos.seed, on_chaos=on_chaos,
                                       wait_timeout_s=o.inner_steps * sim.step_s)
    else:
        runtime = virtual.VirtualRuntime(*args, **kwargs)
    sim_time = runtime.run()
    runtime.finish()
    if recover is not None:
        recover.close()
    for m, prev in enumerate(state["pending"]):
        if prev is not None:
            _log_learner(writer, config, m, learners[m], *prev, force=True)
    final = evaluate(sim_time)
    writer.close()
    wall = time.perf_counter() - t_wall

    tokens = sum(l.tokens for l in learners)
    sent, received = sum(runtime.bytes_up), sum(runtime.bytes_down)
    n_params = islands[0].param_count
    allocated = m_count * sim_time
    summary = {
        "mode": config.mode, "runtime": "virtual", "learners": m_count,
        "steps": max(l.steps for l in learners), "tokens": tokens, "params": n_params,
        "flops_per_token": islands[0].flops_per_token,
        "eval_loss": final["eval_loss"], "eval_bpb": final["eval_bpb"],
        "wall_s": wall, "tokens_per_s": tokens / wall,
        "outer_steps": len(merges), "merges": len(merges),
        "bytes_sent": sent, "bytes_received": received,
        "bytes_per_token": (sent + received) / max(tokens, 1),
        "dp_bytes_per_token": dp_bytes_per_token(n_params, m_count, sum(batches) * config.seq_len),
        "sim_time_s": sim_time,
        "goodput": sum(c.busy_s - c.wasted_s for c in clocks) / allocated if allocated else 0.0,
        "uptime": uptime(merges, sim_time, o.inner_steps * sim.step_s / o.fragments),
        "mean_quorum": float(np.mean([r["quorum"] for r in merges])) if merges else 0.0,
        "mean_staleness": float(np.mean([s for r in merges for s in r["staleness"]])) if merges else 0.0,
        "per_learner": [{"steps": l.steps, "tokens": l.tokens, "idle_s": c.idle_s,
                         "busy_s": c.busy_s, "bytes_up": up, "bytes_down": down,
                         "merges_joined": sum(m in r["learners"] for r in merges)}
                        for m, (l, c, up, down) in enumerate(
                            zip(learners, clocks, runtime.bytes_up, runtime.bytes_down))],
        "eval_curve": [{"sim_time_s": r["sim_time_s"], "eval_loss": r["eval_loss"]} for r in evals],
        "rejected": dict(sorted(rejected.items())),
        "merges_skipped": runtime.sync.rounds_skipped,
        "faults": {}, "rejoins": 0, "synchronizer_restarts": 0,
    }
    if faults:
        summary.update(chaos_summary(runtime, faults, sim_time))
    return summary


def _join(m: int, num_fragments: int) -> protocol.Join:
    return protocol.Join(m, 0.0, tuple([0] * num_fragments))


def _log_learner(writer, config, m, learner, step, device_metrics, now, force=False):
    if step % config.log_every and not force:
        return
    mx = jax.device_get(device_metrics)
    loss = float(mx["loss"])
    if not math.isfinite(loss):
        raise FloatingPointError(f"learner {m}: loss is {loss} at step {step}; stopping")
    writer.write({"step": step, "learner": m, "loss": loss, "lr": float(mx["lr"]),
                  "sim_time_s": now, "tokens": learner.tokens}, prefix=f"learner{m}/")


def evaluate_global(isl: island_lib.Island, sync: Synchronizer) -> dict[str, float]:
    """Eval loss and bits per byte of the synchronizer's global parameters, on one island."""
    flat = sync.global_params()
    shardings = fragments.flatten(isl.fns.state_shardings.params)
    placed = {k: jax.device_put(flat[k], shardings[k]) for k in shardings}
    like = isl.abstract_state().params
    return evaluation.evaluate(isl.fns, fragments.unflatten(placed, like=like), isl.data)


def chaos_summary(runtime: virtual_chaos.ChaosRuntime, faults: list[chaos.Fault],
                  sim_time: float) -> dict[str, Any]:
    """Summary keys of a run with faults (documented in the README)."""
    st = runtime.stats
    crashes = st.crashes
    rejoined = [c for c in crashes if c["rejoined"] is not None]
    to_rejoin = [c["rejoined"] - c["back"] for c in rejoined]
    down = collections.Counter()
    for c in crashes:
        down[c["learner"]] += (c["rejoined"] if c["rejoined"] is not None else sim_time) - c["time"]
    params = runtime.sync.global_params()
    tainted = {k: dict(sorted(v.items())) for k, v in sorted(st.tainted.items())}
    return {
        "faults": dict(sorted(st.faults.items())),
        "rejoins": len(rejoined),
        "synchronizer_restarts": len(st.restarts),
        "merges_skipped": st.merges_skipped + runtime.sync.rounds_skipped,
        "chaos": {
            # generated schedules run past the end (chaos.SPAN); count those the run reached
            "faults_scheduled": sum(f.time_s < sim_time for f in faults),
            "faults_ignored": st.ignored,
            "faults_unused": st.unused, "crashes": len(crashes),
            # ... those back before the end, unless the synchronizer was down from then on
            "every_crashed_learner_rejoined": all(
                c["rejoined"] is not None for c in crashes
                if c["back"] <= sim_time and not c.get("sync_down_at_end")),
            "down_at_end": sum(c["rejoined"] is None for c in crashes),
            "learner_downtime_s": float(sum(down.values())),
            "time_to_rejoin_s": {"mean": float(np.mean(to_rejoin)) if to_rejoin else 0.0,
                                 "max": float(max(to_rejoin, default=0.0))},
            "restored_from_checkpoint": sum(c["restored_step"] is not None for c in crashes),
            "steps_lost": int(sum(st.steps_lost)),
            "synchronizer_downtime_s": float(sum(min(r["back"], sim_time) - r["time"]
                                                 for r in st.restarts)),
            "merges_lost": int(sum(r["merges"] - r["restored"] for r in st.restarts
                                   if r["restored"] is not None)),
            "resyncs": st.resyncs, "stalls_broken": st.stalls_broken,
            "messages_dropped": dict(sorted(st.dropped.items())),
            "refused_by_learners": dict(sorted(st.refused_by_learners.items())),
            "tainted": tainted,
            "tainted_merged": sum(v.get("merged", 0) for v in tainted.values()),
            "global_params_finite": bool(all(np.isfinite(v).all() for v in params.values())),
            "per_learner_downtime_s": [float(down[m]) for m in range(len(runtime.learners))],
        },
    }


def uptime(merges: list[dict], sim_time: float, period_s: float) -> float:
    """Share of the simulated time in which the global model advanced.

    Time counts as stalled when the gap between two merges (or from the start to the first, or from
    the last to the end) exceeds the nominal merge period H·step_s/P; the excess is the stall.
    """
    if sim_time <= 0:
        return 0.0
    times = [0.0] + sorted(r["time"] for r in merges) + [sim_time]
    stalled = sum(max(0.0, b - a - period_s) for a, b in zip(times, times[1:]))
    return max(0.0, 1.0 - stalled / sim_time)
