"""mode=diloco|streaming|decoupled: M islands and a synchronizer on the virtual runtime."""

import math
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import data as data_lib, evaluation, fragments, island as island_lib, metrics
from diloco import outer, policies, protocol
from diloco.learner import Learner
from diloco.runtime import virtual
from diloco.synchronizer import Synchronizer


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


def make_outer(o: ml_collections.ConfigDict):
    if o.optimizer == "nesterov":
        return outer.nesterov(o.lr, o.momentum)
    if o.optimizer == "sgd":
        return outer.sgd(o.lr)
    return outer.delayed_nesterov(o.lr, o.momentum, o.delayed_period, o.delayed_c)


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
        islands.append(island_lib.build_island(cfg_m, devices, shard_index=m, num_shards=m_count,
                                               splits=splits))
    params0 = fragments.flatten(jax.device_get(islands[0].init_state().params))
    frag = fragments.make(o.fragment_kind, params0, o.fragments)
    schedule = fragments.Schedule(o.fragments, o.inner_steps)
    learners = [Learner(m, isl, frag, schedule, o.codec, o.alpha, batches[m] * config.seq_len)
                for m, isl in enumerate(islands)]
    for learner in learners:
        learner.load_global(params0, [0] * o.fragments)
    sync = Synchronizer(params0, frag, policies.from_config(config), make_outer(o),
                        downlink_codec=o.downlink_codec or o.codec)
    for m in range(m_count):
        sync.handle(_join(m, o.fragments))

    writer = metrics.MetricsWriter(workdir)
    merges: list[dict] = []
    evals: list[dict] = []
    state = {"total_steps": 0, "pending": [None] * m_count}
    eval_every = config.eval_every * m_count

    def evaluate(sim_time: float) -> dict[str, float]:
        row = evaluate_global(islands[0], learners[0], sync)
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
        writer.write({"step": state["total_steps"] // m_count, **record}, prefix="sync/")

    clocks = [virtual.LearnerClock(step_s=sim.step_s * speeds[m] * batches[m] / config.batch_size,
                                   rng=np.random.default_rng([config.seed, m]),
                                   jitter=sim.step_jitter, start_s=starts[m])
              for m in range(m_count)]
    runtime = virtual.VirtualRuntime(
        learners, sync, clocks, virtual.Network(sim.latency_s, sim.bandwidth_gbps),
        next_batch=lambda m: next(islands[m].data.train_iter),
        token_budget=config.steps * sum(batches) * config.seq_len, overlap=o.overlap,
        blocking=o.blocking, on_step=on_step, on_log=on_log)
    sim_time = runtime.run()
    runtime.finish()
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
    return {
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
        "goodput": sum(c.busy_s for c in clocks) / allocated if allocated else 0.0,
        "uptime": uptime(merges, sim_time, o.inner_steps * sim.step_s / o.fragments),
        "mean_quorum": float(np.mean([r["quorum"] for r in merges])) if merges else 0.0,
        "mean_staleness": float(np.mean([s for r in merges for s in r["staleness"]])) if merges else 0.0,
        "per_learner": [{"steps": l.steps, "tokens": l.tokens, "idle_s": c.idle_s,
                         "busy_s": c.busy_s, "bytes_up": up, "bytes_down": down,
                         "merges_joined": sum(m in r["learners"] for r in merges)}
                        for m, (l, c, up, down) in enumerate(
                            zip(learners, clocks, runtime.bytes_up, runtime.bytes_down))],
        "eval_curve": [{"sim_time_s": r["sim_time_s"], "eval_loss": r["eval_loss"]} for r in evals],
    }


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


def evaluate_global(isl: island_lib.Island, like: Learner, sync: Synchronizer) -> dict[str, float]:
    """Eval loss and bits per byte of the synchronizer's global parameters, on one island."""
    flat = sync.global_params()
    cur = fragments.flatten(like.state.params)
    placed = {k: jax.device_put(flat[k], cur[k].sharding) for k in cur}
    return evaluation.evaluate(isl.fns, fragments.unflatten(placed, like=like.state.params), isl.data)


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
