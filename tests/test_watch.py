"""Watching a run: the progress bars' text, the timeline's spans and picture, and a virtual run's
timeline against its own summary."""

import io
import os

import numpy as np
import pytest

from configs import shakespeare
from diloco.runners import island_summary, islands
from diloco.watch import progress, timeline


def test_learners_postfix_names_the_slowest_and_fastest():
  # Learner 2 has the fewest steps, learner 1 the most (ties go to the lower index).
  assert progress.learners_postfix(123.4, 7, [10, 14, 9, 14]) == {
      "sim": "123s",
      "merges": "7",
      "slowest": "L2@9",
      "fastest": "L1@14",
  }
  assert progress.modes_postfix(["dp", "diloco", "decoupled"], 1) == {
      "running": "diloco",
      "done": "dp",
  }
  assert progress.modes_postfix(["dp", "diloco"], 2) == {"running": "-", "done": "dp,diloco"}


def test_throttle_and_bars_off_the_terminal():
  t = [0.0]
  show = progress.Throttle(0.5, clock=lambda: t[0])
  seen = []
  for now in (0.0, 0.2, 0.49, 0.5, 0.9, 1.01):
    t[0] = now
    seen.append(show())
  assert seen == [True, False, False, True, False, True]
  out = io.StringIO()  # not a terminal: nothing is drawn even when enabled
  for enabled in (True, False):
    bar = progress.bar(enabled, total=10, file=out)
    bar.update(10)
    bar.close()
  assert out.getvalue() == ""


def test_trace_joins_touching_spans_and_cuts_at_a_crash():
  tr = timeline.Trace(2)
  tr.span(0, timeline.TRAIN, 0.0, 1.0)
  tr.span(0, timeline.TRAIN, 1.0, 2.0)  # touches: joined
  tr.span(0, timeline.WAIT, 2.0, 2.5)
  tr.span(0, timeline.TRAIN, 2.5, 3.5)
  tr.span(0, timeline.TRAIN, 3.5, 3.5)  # empty: dropped
  tr.span(1, timeline.TRAIN, 0.0, 4.0)
  assert tr.spans[0] == [("train", 0.0, 2.0), ("wait", 2.0, 2.5), ("train", 2.5, 3.5)]
  tr.cut(0, 3.0)
  assert tr.spans[0][-1] == ("train", 2.5, 3.0)
  assert tr.total(0, timeline.TRAIN) == pytest.approx(2.5)
  with pytest.raises(ValueError, match="span kind"):
    tr.span(1, "lunch", 0.0, 1.0)


def test_stalled_spans_by_hand():
  # Period 2 s. Gaps: 0->1 (ok), 1->6 (5 s: stalled from 3 to 6), 6->7 (ok), 7->10 (stall 9..10).
  assert timeline.stalled_spans([1.0, 6.0, 7.0], 10.0, 2.0) == [(3.0, 6.0), (9.0, 10.0)]
  merges = [{"time": t} for t in (1.0, 6.0, 7.0)]
  assert island_summary.uptime(merges, 10.0, 2.0) == pytest.approx(1 - 4 / 10)


def _pixel(fig, ax, x, y):
  """RGB (0..1) of the rendered figure at data point (x, y) of `ax`."""
  fig.canvas.draw()
  rgba = np.asarray(fig.canvas.buffer_rgba())
  px, py = ax.transData.transform((x, y))
  return rgba[int(round(rgba.shape[0] - py)), int(round(px)), :3] / 255.0


def _rgb(hex_color):
  return np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255.0


def test_timeline_picture_of_a_hand_built_log(tmp_path):
  """Two learners over 10 s: learner 0 trains, waits 4..6, trains; learner 1 trains until it
  crashes at 5 and is down until 8. Merges at 1, 2 and 9 with period 2: the model stalls 4..9."""
  tr = timeline.Trace(2)
  tr.span(0, timeline.TRAIN, 0.0, 4.0)
  tr.span(0, timeline.WAIT, 4.0, 6.0)
  tr.span(0, timeline.TRAIN, 6.0, 10.0)
  tr.span(1, timeline.TRAIN, 0.0, 10.0)
  tr.cut(1, 5.0)
  merges = [dict(time=t, fragment=p, quorum=2) for t, p in ((1.0, 0), (2.0, 1), (9.0, 0))]
  args = (tr, merges, 10.0, 2.0, 2)
  fig, ax, _ = timeline.figure(*args, down=[(1, 5.0, 8.0)], shares=[0.625, None])
  labels = [t.get_text() for t in ax.get_yticklabels()]
  assert labels == ["global model", "learner 1", "learner 0\n62% merged"]
  want = {  # (time, row) -> colour; learner 0 is row 2, learner 1 row 1, the model row 0
      (2.0, 2): timeline.COLORS["train"],
      (5.0, 2): timeline.COLORS["wait"],
      (7.0, 2): timeline.COLORS["train"],
      (3.0, 1): timeline.COLORS["train"],
      (6.0, 1): timeline.COLORS["down"],
      (2.0, 0): timeline.ADVANCING,
      (6.5, 0): timeline.STALLED,
      (9.5, 0): timeline.ADVANCING,
  }
  for (t, row), color in want.items():
    assert np.allclose(_pixel(fig, ax, t, row), _rgb(color), atol=0.02), (t, row)
  assert np.allclose(_pixel(fig, ax, 9.0, 1), 1.0, atol=0.02)  # back at 8, nothing drawn: done
  path = timeline.draw(str(tmp_path / "t.png"), *args, down=[(1, 5.0, 8.0)])
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_virtual_run_draws_its_timeline_from_what_it_did(tmp_path, monkeypatch):
  """Streaming DiLoCo (blocking) with learner 1 three times slower: the timeline's spans are the
  run's own busy and idle seconds, and the picture is written beside the summary."""
  seen = {}
  draw = timeline.draw

  def spy(path, trace, merges, end, *a, **kw):
    seen.update(trace=trace, merges=merges, end=end)
    return draw(path, trace, merges, end, *a, **kw)

  monkeypatch.setattr(timeline, "draw", spy)
  config = shakespeare.get_config("mode=streaming,runlocal,steps=16")
  with config.unlocked():
    config.sim.speeds = "1,3"
    config.progress_bar = False
  s = islands.run(config, str(tmp_path))
  assert s["timeline"] == str(tmp_path / "timeline.png") and os.path.getsize(s["timeline"]) > 0
  tr = seen["trace"]
  for m, row in enumerate(s["per_learner"]):
    assert tr.total(m, timeline.TRAIN) == pytest.approx(row["busy_s"])
    assert tr.total(m, timeline.WAIT) == pytest.approx(row["idle_s"])
  assert s["per_learner"][0]["idle_s"] > 0  # the fast learner waits for the slow one
  assert len(seen["merges"]) == s["merges"] and seen["end"] == s["sim_time_s"]
