"""The console in a real browser: Debian's Chromium driven by selenium, against a real
supervisor running a long job and a real console process on 127.0.0.1.

Skips, saying why, when selenium, /usr/bin/chromium or /usr/bin/chromedriver is missing
(``scripts/test`` tries ``apt-get install chromium chromium-driver`` first). Set
``ATLANTIS_CONSOLE_SCREENSHOTS=docs`` to refresh the screenshots under ``docs/``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

pytest.importorskip("starlette", reason="the console extra is not installed")
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install selenium)")
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    pytest.skip(f"Chromium is not installed ({CHROMIUM}, {CHROMEDRIVER}): "
                "apt-get install chromium chromium-driver", allow_module_level=True)

import httpx  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

import atlantis  # noqa: E402
from tests.conftest import ROOT, wait_for, wait_state  # noqa: E402
from tests.test_console_api import APP, Console, console_server  # noqa: E402, F401

SECRET = "browser-secret"
HOSTILE = "<script>window.__pwned = 1</script>"


@pytest.fixture
def browser() -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="atl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1360,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    target = os.environ.get("ATLANTIS_CONSOLE_SCREENSHOTS")
    if target:
        dest = Path(target) if Path(target).is_absolute() else ROOT / target
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest / name)


# The pages replace their live parts in place, so an element found by selenium can be gone
# (stale) by the time its text is read. These read in one script run in the page, atomically.
def value(driver: Any, css: str, attr: str = "value") -> str:
    """``attr`` of the first element matching ``css``, "" when there is none."""
    got = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        " return e === null ? null : e.getAttribute(arguments[1]);", css, attr)
    return str(got or "")


def text(driver: Any, css: str) -> str:
    """The rendered text of the first element matching ``css``, "" when there is none."""
    got = driver.execute_script(
        "const e = document.querySelector(arguments[0]);"
        " return e === null ? null : e.innerText;", css)
    return str(got or "").strip()


def click(driver: Any, css: str) -> None:
    """Click the element matching ``css``, finding it again if a live update replaced it."""
    def once() -> bool:
        try:
            driver.find_element(By.CSS_SELECTOR, css).click()
            return True
        except StaleElementReferenceException:
            return False
    wait_for(once, message=f"a click on {css}")


def texts(driver: Any, css: str) -> list[str]:
    """The rendered texts of every element matching ``css``."""
    got = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);", css)
    return [str(t) for t in got]


def test_live_job_page_cancel_and_escaping(db: psycopg.Connection[Any], tmp_path: Path,
                                           supervise: Callable[..., Any],
                                           console_server: Callable[..., Console],  # noqa: F811
                                           browser: Any) -> None:
    for msg in ("upstream said 502", "upstream said 502", "row 17 is malformed"):
        atlantis.enqueue(db, "console.Fail", {"account_id": "acme", "message": msg})
    for _ in range(3):
        atlantis.enqueue(db, "console.Quick", {"account_id": "acme"})
    job_id = atlantis.enqueue(db, "console.Import",
                              {"account_id": "acme", "steps": 400, "message": HOSTILE})
    supervise(queues=("console",), app=APP, concurrency=2)
    con = console_server(env={"ATLANTIS_CONSOLE_TOKEN": f"ops:{SECRET}"})
    wait_state(db, job_id, "running")

    # Anonymous: the page updates itself, shows handler text as text, offers no write.
    browser.get(f"{con.url}/jobs/{job_id}")
    browser.execute_script("window.__marker = 'same page';")
    assert browser.find_elements(By.CSS_SELECTOR, "button[data-action]") == []
    start = float(value(browser, "#progress") or 0)
    wait_for(lambda: float(value(browser, "#progress") or 0) >= start + 2, timeout=60,
             message="the progress bar to move")
    lines = len(texts(browser, "#log .line"))
    grown = wait_for(lambda: len(now := texts(browser, "#log .line")) > lines and now,
                     timeout=60, message="a new log line")
    assert "imported page" in grown[-1]
    assert browser.execute_script("return window.__marker") == "same page"  # no reload
    assert text(browser, "#message").startswith(HOSTILE)
    assert browser.execute_script("return window.__pwned") is None
    forbidden = httpx.post(f"{con.url}/api/jobs/{job_id}/cancel")
    assert forbidden.status_code == 403 and "error" in forbidden.json()
    shot(browser, tmp_path, "console-job.png")

    browser.get(f"{con.url}/")
    wait_for(lambda: "console" in text(browser, "#live"),
             message="the overview")
    shot(browser, tmp_path, "console-overview.png")
    browser.get(f"{con.url}/dlq")
    wait_for(lambda: "upstream said 502" in text(browser, "#live"),
             message="the dead-letter page")
    shot(browser, tmp_path, "console-dlq.png")

    # With the token: sign in, press cancel, see the job end cancelled.
    browser.get(f"{con.url}/login?next=/jobs/{job_id}")
    browser.find_element(By.NAME, "token").send_keys(SECRET)
    browser.find_element(By.ID, "login-submit").click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "button[data-action=cancel]"),
             message="the cancel button")
    browser.execute_script("window.__marker = 'after login';")
    click(browser, "button[data-action=cancel]")

    def accept() -> bool:
        try:
            browser.switch_to.alert.accept()
            return True
        except NoAlertPresentException:
            return False

    wait_for(accept, message="the confirmation")
    wait_for(lambda: text(browser, "#state") == "cancelled", timeout=60,
             message="the page to show the job cancelled")
    assert wait_state(db, job_id, "cancelled")["cancelled_by"] == "console:ops"
    audit = db.execute("SELECT action, target, label FROM atlantis.console_audit").fetchall()
    assert audit == [("cancel", str(job_id), "ops")]


def test_live_workflow_page_follows_its_steps_and_cancels(
        db: psycopg.Connection[Any], tmp_path: Path, supervise: Callable[..., Any],
        console_server: Callable[..., Console],  # noqa: F811
        browser: Any) -> None:
    workflow_id = atlantis.start_workflow(db, "console.Long", {"account_id": "acme"})
    con = console_server(env={"ATLANTIS_CONSOLE_TOKEN": f"ops:{SECRET}"})
    browser.get(f"{con.url}/login?next=/workflows/{workflow_id}")
    browser.find_element(By.NAME, "token").send_keys(SECRET)
    browser.find_element(By.ID, "login-submit").click()
    wait_for(lambda: "waiting" in text(browser, "#steps"), message="the workflow page")
    browser.execute_script("window.__marker = 'same page';")
    supervise(queues=("console",), app=APP, concurrency=2)

    def step_states() -> list[str]:
        return texts(browser, "#steps tbody tr td:nth-child(3)")

    wait_for(lambda: step_states() == ["complete", "running"], timeout=60,
             message="the page to show the import running")
    assert browser.execute_script("return window.__marker") == "same page"  # live, no reload
    click(browser, "button[data-action=cancel]")

    def accept() -> bool:
        try:
            browser.switch_to.alert.accept()
            return True
        except NoAlertPresentException:
            return False

    wait_for(accept, message="the confirmation")
    wait_for(lambda: text(browser, ".summary .badge") == "cancelled", timeout=60,
             message="the page to show the workflow cancelled")
    trail = texts(browser, "#compensations tbody tr")
    assert [row.split()[0] for row in trail] == ["import", "create"], trail
    shot(browser, tmp_path, "console-workflow.png")
    audit = db.execute("SELECT action, target, label FROM atlantis.console_audit").fetchall()
    assert audit == [("workflow-cancel", str(workflow_id), "ops")]
