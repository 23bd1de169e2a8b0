"""The synchronizer's status service on a live synchronizer: two learners train over gRPC in
threads while /status, /metrics and the page are read, with and without the token."""

import json
import shutil
import threading
import time
import types
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from configs import shakespeare
from diloco.rpc import client as client_lib, limits as limits_lib, service, status_board, status_server, sync_main
from diloco.runtime import learner_loop, threads

TOKEN = "status-s3cret"


def _get(port, path, token=TOKEN):
  req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
  if token is not None:
    req.add_header("Authorization", f"Bearer {token}")
  with urllib.request.urlopen(req, timeout=10) as r:
    return r.status, r.headers.get("Content-Type"), r.read()


@pytest.fixture(scope="module")
def live():
  config = shakespeare.get_config("mode=decoupled,runlocal")
  parts, learners = threads.build_parts(config)
  sync = parts.make_sync()
  limits = limits_lib.Limits(absent_after_s=30.0)
  host, board = sync_main.watched_host(sync, limits, lambda r: None, lambda s: None)
  server, svc, port = service.serve(host, TOKEN, port=0, limits=limits)
  board.service = svc
  status = status_server.StatusServer(
      board, TOKEN, bind="127.0.0.1", port=0, count=board.count, max_age_s=0.0
  )  # every read renders anew: the test compares each with the state of the moment
  links, results = [], {}

  def train(m):
    link = client_lib.GrpcLink(f"127.0.0.1:{port}", m, TOKEN, limits=limits)
    l = learners[m]
    link.report = lambda: dict(total_steps=l.steps, total_tokens=l.tokens, loss=1.5 + m)
    links.append(link)
    results[m] = learner_loop.run_learner(
        l, link, lambda: next(parts.islands[m].data.train_iter), config.steps, overlap=2,
        blocking=False, heartbeat_s=0.2, seed=m,
    )  # fmt: skip

  workers = [threading.Thread(target=train, args=(m,)) for m in range(2)]
  for w in workers:
    w.start()
  yield dict(host=host, sync=sync, board=board, port=status.port, workers=workers, svc=svc,
             learners=learners, results=results, config=config)  # fmt: skip
  for w in workers:
    w.join(timeout=120)
  for link in links:
    link.close()
  status.close()
  server.stop(0).wait()
  host.close()


def _finished(live):
  for w in live["workers"]:
    w.join(timeout=180)
  assert all(r["settled"] for r in live["results"].values()), live["results"]


def test_status_while_training_then_consistent_with_the_synchronizer(live):
  # While the learners train: the page answers, and the figures only grow.
  first = json.loads(_get(live["port"], "/status")[2])
  _finished(live)
  code, ctype, body = _get(live["port"], "/status")
  s = json.loads(body)
  assert code == 200 and ctype == "application/json"
  sync, host = live["sync"], live["host"]
  summary = sync_main._summary(sync, live["board"], live["svc"], 0, None, {}, 0.0)
  assert s["merges"] == summary["merges"] == host.merges >= first["merges"]
  assert s["generation"] == summary["generation"]
  assert s["versions"] == summary["versions"]
  assert [f["version"] for f in s["fragments"]] == summary["versions"]
  assert s["refusals"] == summary["refusals"]
  assert [r["learner"] for r in s["learners"]] == [0, 1]
  for r, learner in zip(s["learners"], live["learners"]):
    assert r["step"] == learner.steps == live["config"].steps
    assert r["tokens"] == learner.tokens
    assert r["loss"] == 1.5 + r["learner"]
    assert r["finished"] is True
    assert r["versions"] == sync.held[r["learner"]]
    # Where its work went, as the synchronizer's summary says (merged steps over P × trained).
    assert 0 < r["merged_share"] == summary["learners"][str(r["learner"])]["merged_share"] <= 1
    received, sent = live["svc"].bytes_of(r["learner"])
    assert (r["bytes_up"], r["bytes_down"]) == (received, sent) and received > 0 and sent > 0
  # Every merge is in the history, numbered 1..N; each fragment's recent quorums are real ones.
  assert [n for _, n in s["history"]["merges"]] == list(range(1, sync.merges + 1))
  for f in s["fragments"]:
    if f["version"]:
      assert f["recent"][-1]["version"] == f["version"]
      assert 1 <= f["recent"][-1]["quorum"] <= 2
  total_up = sum(r["bytes_up"] for r in s["learners"])
  assert total_up == live["svc"].bytes_received


def test_metrics_parse_as_prometheus_text(live):
  _finished(live)
  code, ctype, body = _get(live["port"], "/metrics")
  assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
  families = {f.name: f for f in text_string_to_metric_families(body.decode())}
  samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values()
             for s in f.samples}  # fmt: skip
  sync = live["sync"]
  assert samples[("diloco_sync_merges_total", ())] == sync.merges
  assert samples[("diloco_sync_generation", ())] == sync.generation
  for m, learner in enumerate(live["learners"]):
    assert samples[("diloco_learner_step", (("learner", str(m)),))] == learner.steps
    assert samples[("diloco_learner_tokens_total", (("learner", str(m)),))] == learner.tokens
    assert samples[("diloco_learner_live", (("learner", str(m)),))] in (0.0, 1.0)
    share = samples[("diloco_learner_merged_share", (("learner", str(m)),))]
    assert 0 < share <= 1
  for p, v in enumerate(sync.versions):
    assert samples[("diloco_fragment_version", (("fragment", str(p)),))] == v


def test_a_shards_metrics_and_page_carry_its_shard(live):
  _finished(live)
  live["board"].shard = 1
  try:
    _, _, body = _get(live["port"], "/metrics")
    _, _, page = _get(live["port"], "/")
  finally:
    live["board"].shard = None
  samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
  assert samples and all(s.labels.get("shard") == "1" for s in samples)
  merges = [s for s in samples if s.name == "diloco_sync_merges_total"]
  assert [m.value for m in merges] == [live["sync"].merges]
  assert b"<h1>DiLoCo synchronizer shard 1</h1>" in page


@pytest.mark.parametrize("token", [None, "wrong", ""])
@pytest.mark.parametrize("path", ["/", "/status", "/metrics"])
def test_every_path_needs_the_token(live, path, token):
  before = dict(live["host"].counts), live["sync"].digest(), live["board"].refusals()
  with pytest.raises(urllib.error.HTTPError) as err:
    _get(live["port"], path, token=token)
  assert err.value.code == 401
  assert err.value.headers["WWW-Authenticate"].startswith("Bearer")
  after = live["board"].refusals()
  assert after.get("unauthenticated", 0) == before[2].get("unauthenticated", 0) + 1
  assert dict(live["host"].counts) == before[0]  # the gRPC side's own counts: unchanged
  assert live["sync"].digest() == before[1]


def test_unknown_path_is_404_after_the_token_check(live):
  with pytest.raises(urllib.error.HTTPError) as err:
    _get(live["port"], "/nope")
  assert err.value.code == 404


def test_status_answers_while_the_synchronizer_lock_is_held(live):
  """The status service never takes the host's lock: it answers while a gRPC handler holds it."""
  with live["host"].cond:
    t0 = time.monotonic()
    code, _, body = _get(live["port"], "/status")
    assert code == 200 and time.monotonic() - t0 < 5.0
    assert "merges" in json.loads(body)


def _chromium():
  for name in ("chromium", "chromium-browser", "google-chrome"):
    if shutil.which(name):
      return shutil.which(name)
  return None


def test_page_in_a_headless_browser_shows_the_learner_rows(live, tmp_path):
  """The HTML page, rendered by a real headless Chromium (Debian's `chromium` and
  `chromium-driver`; .ci/run installs them), with the token sent as a header by the browser."""
  browser, driver_path = _chromium(), shutil.which("chromedriver")
  if browser is None or driver_path is None:
    pytest.skip("no chromium/chromedriver here: apt-get install chromium chromium-driver")
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service
  from selenium.webdriver.common.by import By

  _finished(live)
  options = webdriver.ChromeOptions()
  options.binary_location = browser
  for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
    options.add_argument(flag)
  options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
  driver = webdriver.Chrome(service=Service(driver_path), options=options)
  try:
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {TOKEN}"}}
    )
    driver.get(f"http://127.0.0.1:{live['port']}/")
    assert driver.title == "DiLoCo synchronizer"
    rows = driver.find_elements(By.CSS_SELECTOR, "tr.learner")
    cells = [[td.text for td in r.find_elements(By.TAG_NAME, "td")] for r in rows]
    assert [c[0] for c in cells] == ["0", "1"]
    assert all(c[3] == str(live["config"].steps) for c in cells)  # the step column
    assert all(0 < float(c[7]) <= 1 for c in cells)  # the merged share column
    assert len(driver.find_elements(By.CSS_SELECTOR, "svg.plot polyline")) >= 3  # merges, 2 losses
  finally:
    driver.quit()


def test_trained_steps_over_a_learners_processes_by_hand():
  """Issue 49, point 3: the summary's trained steps of a learner that ran as several processes:
  the furthest step reached plus the steps a process trained again from behind it."""
  board = status_board.StatusBoard(host=types.SimpleNamespace(now=lambda: 0.0))
  beat = lambda m, session, start, step: board.report(
      m, dict(step=step, start=start, session=session, finished=False)
  )
  beat(0, "a", 0, 10)
  board.uploaded(0, "a", 15)  # killed after its upload of step 15, before a heartbeat said so;
  board.uploaded(0, "a", 12)  # (an older upload arriving late changes nothing)
  board.uploaded(0, "z", 40)  # (a process no heartbeat opened: where it started is not known)
  beat(0, "b", 0, 60)  # the next process starts at 0: no checkpoint
  beat(1, "c", 0, 21)  # its synchronizer away from step 21; it trains to 80, saves, exits
  beat(1, "d", 80, 80)  # ... and is started again from that save
  beat(2, "e", 0, 30)
  beat(2, "f", 20, 50)  # restored from step 20 after reaching 30: steps 21-30 twice
  assert board.trained_steps() == {0: 60 + 15, 1: 80, 2: 50 + 10}
  again = status_board.StatusBoard(host=board.host)
  again.load_sessions(json.loads(json.dumps(board.sessions())))  # through a checkpoint's JSON
  assert again.trained_steps() == board.trained_steps()
