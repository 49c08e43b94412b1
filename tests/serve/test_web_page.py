"""The server's page in headless Chromium (Debian's chromium and chromedriver, driven by selenium): it loads with
no console error, a chat message streams a reply, and the row of blocks follows the pager while a streamed model
generates. The screenshot is kept in tests/artifacts/page.png."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from superggml import Model
from superggml.commands.analyze import model_layout
from http_server import Server

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "artifacts")  # tests/artifacts
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="Debian's chromium and chromium-driver")


@pytest.fixture
def browser():
    opts = Options()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield d
    finally:
        d.quit()


def wait_for(check, timeout: float = 60.0):
    end = time.time() + timeout
    while time.time() < end:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_page_chats_and_shows_the_pager(smollm2_path, browser):
    slot = model_layout(smollm2_path).slot_bytes
    with Model(smollm2_path, ctx_size=512, n_threads=2, device_budget=4 * slot) as m:
        s = Server(m, parallel=1)
        try:
            browser.get(s.url + "/")
            row = browser.find_element(By.ID, "blocks")
            wait_for(lambda: int(row.get_attribute("data-updates")) >= 2)
            blocks = row.find_elements(By.CLASS_NAME, "block")
            assert len(blocks) == m.hparams.n_layer
            assert browser.find_element(By.ID, "model").text == os.path.basename(smollm2_path)
            severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert severe == [], severe

            browser.find_element(By.ID, "prompt").send_keys("Write a short poem about the sea.")
            browser.find_element(By.ID, "send").click()
            seen, reply = set(), None
            end = time.time() + 300
            while time.time() < end:
                seen.add(
                    browser.execute_script(
                        "return [...document.querySelectorAll('#blocks .block')].map(b => b.className).join(',')"
                    )
                )
                replies = browser.find_elements(By.CSS_SELECTOR, "#messages .assistant, #messages .error")
                if replies and replies[-1].get_attribute("data-state") in ("done", "error"):
                    reply = replies[-1]
                    break
                time.sleep(0.1)
            assert reply is not None and reply.get_attribute("data-state") == "done"
            assert reply.text.strip()
            assert len(seen) >= 2, seen  # the row followed the pager
            assert any("slot" in x for x in seen) and all("file" in x for x in seen)
            os.makedirs(ARTIFACTS, exist_ok=True)
            browser.save_screenshot(os.path.join(ARTIFACTS, "page.png"))
            assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []
        finally:
            browser.quit()
            s.close()
