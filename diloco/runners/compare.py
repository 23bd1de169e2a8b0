"""mode=compare: data-parallel, synchronous DiLoCo and Decoupled DiLoCo on one token budget.

Each run goes to WORKDIR/<mode>/ through the same train_and_evaluate; the comparison is printed
as a table and drawn as WORKDIR/compare.png (eval loss against simulated time).

Data-parallel has no simulated clock of its own: it is placed on the same islands, so each of its
steps takes as long as the slowest island's (sim.step_s · max(speeds)), with no communication time
counted; its bytes per token are those of a ring all-reduce.
"""

import os
from typing import Any

import ml_collections

from diloco import metrics
from diloco.config import presets
from diloco.runners import islands as islands_lib


def sub_config(config: ml_collections.ConfigDict, mode: str) -> ml_collections.ConfigDict:
    """The config of one compared run: same budget, model, data and learners."""
    c = config.copy_and_resolve_references()
    with c.unlocked():
        presets.apply(c, mode, runlocal=False)
        c.outer.learners = config.outer.learners
        c.outer.inner_steps = config.outer.inner_steps
        if mode == "decoupled":
            c.outer.fragments = config.compare.decoupled_fragments
            c.outer.inner_steps = config.compare.decoupled_inner_steps
        if mode == "dp":  # one island over all devices, M x the batch, same steps and tokens
            c.batch_size = config.batch_size * config.outer.learners
    return c


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
    from diloco import train  # train imports this module

    rows = {}
    for mode in config.compare.modes.split(","):
        summary = train.train_and_evaluate(sub_config(config, mode), os.path.join(workdir, mode))
        if mode == "dp":
            speeds = [float(s) for s in config.sim.speeds.split(",")] if config.sim.speeds else [1.0]
            summary["sim_time_s"] = summary["steps"] * config.sim.step_s * max(speeds)
            summary["eval_curve"] = [{"sim_time_s": r["step"] * config.sim.step_s * max(speeds),
                                      "eval_loss": r["eval_loss"]}
                                     for r in _eval_rows(os.path.join(workdir, mode))]
            summary["dp_bytes_per_token"] = islands_lib.dp_bytes_per_token(
                summary["params"], config.outer.learners, config.batch_size * config.outer.learners
                * config.seq_len)
            summary["bytes_per_token"] = summary["dp_bytes_per_token"]
            summary["goodput"] = 1.0 / max(speeds) * sum(speeds) / len(speeds)
        rows[mode] = summary
    table = format_table(rows)
    print(table, flush=True)
    plot_path = plot(rows, os.path.join(workdir, "compare.png"))
    first = next(iter(rows.values()))
    return {"mode": "compare", "runs": rows, "table": table, "plot": plot_path,
            "tokens": first["tokens"], "params": first["params"],
            "flops_per_token": first["flops_per_token"],
            "wall_s": sum(r["wall_s"] for r in rows.values())}


def _eval_rows(workdir: str) -> list[dict]:
    return [r for r in metrics.read_jsonl(os.path.join(workdir, metrics.METRICS_FILE))
            if "eval_loss" in r]


def format_table(rows: dict[str, dict]) -> str:
    header = f"{'mode':<10} {'eval bpb':>9} {'sim time s':>11} {'goodput':>8} {'bytes/token':>12}"
    lines = [header, "-" * len(header)]
    for mode, r in rows.items():
        lines.append(f"{mode:<10} {r['eval_bpb']:>9.3f} {r.get('sim_time_s', 0):>11.0f}"
                     f" {r.get('goodput', 1.0):>8.3f} {r.get('bytes_per_token', 0):>12.2f}")
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for mode, r in rows.items():
        curve = r.get("eval_curve", [])
        ax.plot([c["sim_time_s"] for c in curve], [c["eval_loss"] for c in curve], marker="o",
                label=mode)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("eval loss (nats)")
    ax.set_title("Shakespeare, same token budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
