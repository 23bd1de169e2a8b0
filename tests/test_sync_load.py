"""The plan's synchronizer section (diloco/plan/sync_load.py): its figures worked out by hand,
and the merge rate measured by a real merge round."""

import pytest

from diloco.plan import sync_load


def _load(**kw) -> sync_load.SyncLoad:
  args = dict(
      params=10**9,
      learners=8,
      fragments=24,
      inner_steps=24,
      step_s=1.0,
      quorum=1,
      merge_clock="arrival",
      uplink_ratio=0.25,  # int8
      shards=1,
      rate=sync_load.MergeRate(1e9, "given"),
      cores_per_shard=16,
      save_share=0.25,
      disk_bytes_per_s=1e9,
  )
  return sync_load.SyncLoad(**{**args, **kw})


def test_the_load_of_eight_learners_worked_by_hand():
  load = _load()
  # 1B parameters: 12 GB of state; 24 fragments of 4e9 / 24 = 1.667e8 bytes.
  assert load.state_bytes == 12 * 10**9 and load.fragment_bytes == pytest.approx(4e9 / 24)
  # 8 learners x 24 fragments per 24 steps of 1 s: 8 uploads/s, each its own merge (K = 1).
  assert load.uploads_per_s == 8 and load.merges_per_s == 8
  # 8 x 1.667e8 bytes/s at 1e9 per core: 1.333 cores busy; x2 headroom: 3 cores, one shard.
  assert load.merge_busy == pytest.approx(4 / 3) and load.cores_needed == 3
  assert load.shards_needed == 1 and load.keeps_up
  # RAM: the state plus (4 + 1 upload x 0.25) fragments of a round.
  assert load.ram_per_shard == pytest.approx(12e9 + 4.25 * 4e9 / 24)
  # A whole save: 12 GB at 1 GB/s = 12 s, every 48 s at share 0.25; restore 12 s read + 12 s sha.
  assert load.save_s == 12 and load.save_bytes_per_s == 0.25e9 and load.restore_s == 24
  # The period clock: one merge per fragment per period (1/s), each of all 8 uploads.
  period = _load(merge_clock="period")
  assert period.merges_per_s == 1 and period.merge_busy == load.merge_busy
  assert period.ram_per_shard == pytest.approx(12e9 + (4 + 8 * 0.25) * 4e9 / 24)


def test_a_slow_merge_rate_needs_more_shards():
  # 50 MB/s per core: 26.7 cores busy, 54 with headroom: 4 shards of 16 cores; 2 are too few.
  slow = _load(rate=sync_load.MergeRate(5e7, "given"), shards=2)
  assert slow.cores_needed == 54 and slow.shards_needed == 4 and not slow.keeps_up
  assert _load(rate=sync_load.MergeRate(5e7, "given"), shards=4).keeps_up
  assert any("CANNOT KEEP UP" in line for line in sync_load.lines(slow))


def test_the_merge_rate_is_measured_once_and_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  measured = []

  def measure(uplink, rule):
    measured.append((uplink, rule))
    return sync_load.measure_merge_rate(uplink, rule, mbytes=1, uploads=2)

  first = sync_load.merge_rate("int8", "mean", measure)
  again = sync_load.merge_rate("int8", "mean", measure)
  assert measured == [("int8", "mean")] and first == again and first.bytes_per_s > 0
  assert "int8 uploads" in first.source and (tmp_path / "diloco" / "sync_merge_rate.json").exists()
