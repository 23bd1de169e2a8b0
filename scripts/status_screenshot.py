"""A screenshot of the synchronizer's status page during a real local gRPC run (docs/status_page.png).

  python scripts/status_screenshot.py --out=docs/status_page.png [--learners=3] [--after_s=25] \
      [--config=configs/shakespeare.py:mode=decoupled,runlocal,steps=400] [--workdir=runs/shot]

Starts a synchronizer with its status service and M learner processes (the last one 3x slower, a
chaos straggle fault), waits --after_s seconds after the learners' first merge, loads the page in
headless Chromium (Debian's `chromium` and `chromium-driver`) with the token sent as the
Authorization header, saves the screenshot, and stops every process.
"""

import argparse
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diloco.rpc import local  # noqa: E402


def screenshot(url: str, token: str, out: str, profile: str) -> None:
  from selenium import webdriver
  from selenium.webdriver.chrome.service import Service

  options = webdriver.ChromeOptions()
  options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
  for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1100,1000"):
    options.add_argument(flag)
  options.add_argument(f"--user-data-dir={profile}")
  driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
  try:
    driver.execute_cdp_cmd("Network.enable", {})
    headers = {"headers": {"Authorization": f"Bearer {token}"}}
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", headers)
    driver.get(url)
    driver.save_screenshot(out)
  finally:
    driver.quit()


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", default="configs/shakespeare.py:mode=decoupled,runlocal,steps=400")
  ap.add_argument("--learners", type=int, default=3)
  ap.add_argument("--after_s", type=float, default=25.0)
  ap.add_argument("--workdir", default="runs/shot")
  ap.add_argument("--out", required=True)
  args = ap.parse_args()
  if not (shutil.which("chromium") or shutil.which("chromium-browser")):
    raise SystemExit("needs Debian's chromium and chromium-driver (apt-get install them)")
  m = args.learners
  spec = local.with_arg(args.config, "learners", m)
  overrides = (
      "--config.deploy.status_port=0",
      f"--config.chaos.schedule=straggle learner {m - 1} at t=0s for 1000000s x3",
      "--config.progress_bar=False",
  )
  c = local.LocalCluster(spec, m, os.path.abspath(args.workdir), overrides=overrides)
  try:
    c.start()
    status_file = os.path.join(c.workdir, "sync", "status_port")
    deadline = time.monotonic() + 120
    while not os.path.exists(status_file) and time.monotonic() < deadline:
      time.sleep(0.2)
    with open(status_file) as f:
      port = int(f.read())
    time.sleep(args.after_s)
    url = f"http://127.0.0.1:{port}/"
    screenshot(url, c.token, os.path.abspath(args.out), os.path.join(c.workdir, "chrome"))
    print(f"wrote {args.out} from {url}", flush=True)
  finally:
    c.stop()


if __name__ == "__main__":
  main()
