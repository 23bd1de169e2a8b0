"""The heterogeneous-hardware sweep's points and the table's verdicts, on rows made up by hand."""

import json

import pytest

from configs.sweeps import heterogeneous as het
from experiments.studies import hetero_table as ht


def _row(domain, policy, lr, loss, seed=0, acc=None, goodput=1.0):
  return {
      "name": f"{domain}+{policy}+{lr}+{seed}",
      "status": "done",
      "domain": domain,
      "policy": policy,
      "outer_lr": lr,
      "seed": seed,
      "eval_loss": loss,
      "eval_accuracy": acc if acc is not None else "",
      "goodput": goodput,
  }


def test_configs_of_the_three_policies():
  wait = het.get_config("domain=text,policy=wait_all")
  assert (wait.outer.quorum, wait.outer.blocking, wait.outer.grace_gamma) == (8, True, 0.0)
  k1 = het.get_config("domain=vision,policy=k1,outer_lr=0.2")
  assert (k1.outer.quorum, k1.outer.blocking, k1.outer.grace_gamma, k1.outer.lr) == (
      1,
      False,
      0.0,
      0.2,
  )
  grace = het.get_config("domain=text,policy=k1_grace,part=seeds,results=x")  # sweep-only keys
  assert (grace.outer.quorum, grace.outer.grace_gamma) == (1, 0.8)
  # 8 learners x 1,000 steps x 16 sequences x 64 bytes = 8,192,000 bytes: 284 per parameter
  assert grace.steps * grace.batch_size * grace.seq_len * grace.outer.learners == 8_192_000
  assert grace.sim.speeds == "1,1,1,1,2,2,2,2" and grace.sim.step_jitter == 0.1
  with pytest.raises(ValueError, match="policy='k2'"):
    het.get_config("policy=k2")


def test_points_grow_from_the_winners(tmp_path):
  assert len(het.get_sweep("part=tune")) == 2 * 3 * 3
  rows = [
      _row(d, p, lr, 2.0 + abs(lr - 0.4))
      for d in het.DOMAINS
      for p in het.POLICIES
      for lr in het.OUTER_LRS
  ]
  rows[0] = _row("text", "wait_all", 0.2, 1.0)  # wait_all's winner on the low edge
  (tmp_path / "tune.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  ext = het.get_sweep(f"part=extend,results={tmp_path}")
  assert ext == [dict(domain="text", policy="wait_all", outer_lr=0.1, seed=0)]
  seeds = het.get_sweep(f"part=seeds,seeds=3,results={tmp_path}")
  assert len(seeds) == 12 and {p["seed"] for p in seeds} == {1, 2}
  assert {p["outer_lr"] for p in seeds if p["policy"] == "k1"} == {0.4}
  with pytest.raises(ValueError, match="no finished seed-0 rows"):
    het.get_sweep(f"part=seeds,results={tmp_path / 'empty'}")


def test_findings_read_the_table():
  rows = []
  # text: wait_all 2.00/2.02 (half-range 0.01), k1 2.10/2.12 (worse by 0.10), grace 2.005/2.015
  for seed, (a, b, c) in enumerate([(2.00, 2.10, 2.005), (2.02, 2.12, 2.015)]):
    rows += [_row("text", "wait_all", 0.4, a, seed, goodput=0.75)]
    rows += [_row("text", "k1", 0.2, b, seed, goodput=1.0)]
    rows += [_row("text", "k1_grace", 0.4, c, seed, goodput=0.97)]
  rows += [_row("text", "k1", 0.4, 3.0)]  # off the winner: not in the cell
  # vision, accuracies: wait_all 0.91 (±0.02), k1 0.90 (±0.005), grace 0.96 (±0.01)
  for seed, (a, b, c) in enumerate([(0.89, 0.895, 0.95), (0.93, 0.905, 0.97)]):
    rows += [_row("vision", "wait_all", 0.4, 1.0, seed, acc=a, goodput=0.75)]
    rows += [_row("vision", "k1", 0.4, 1.0, seed, acc=b, goodput=1.0)]
    rows += [_row("vision", "k1_grace", 0.4, 1.0, seed, acc=c, goodput=0.97)]
  table = ht.cells(rows)
  assert table[("text", "k1")].outer_lr == 0.2 and table[("text", "k1")].losses == (2.10, 2.12)
  assert table[("text", "wait_all")].loss_spread == pytest.approx(0.01)
  got = [(claim.split(":")[0], v) for claim, v, _ in ht.findings(table)]
  # goodput: wait_all 75% < k1 100%, grace 97% >= 75%. text: k1 0.10 worse than wait_all (more
  # than 0.01), grace within 0.01 of wait_all and 0.10 better than k1. vision: k1 0.01 below
  # wait_all, inside its ±0.02 (they match); grace 0.05 above wait_all and 0.06 above k1.
  assert got == [
      (
          "waiting for all learners costs goodput; K=1 (with or without grace) does not wait",
          "shown",
      ),
      ("text", "shown"),
      ("text", "shown"),
      ("vision", "not shown"),
      ("vision", "shown"),
  ]
