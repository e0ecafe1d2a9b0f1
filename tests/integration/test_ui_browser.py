"""What a person reads in the Temporal UI of the embedded stack, read by a real browser.

`gpuflow up -d` starts the stack as a user does (dev server with its Web UI, control worker,
local agent); a sim fleet runs three jobs: one that ends done, one that fails (`exit 3`), one
that keeps running. Debian's chromium, driven headless by Selenium through Debian's
chromedriver (nothing is downloaded), opens the workflow list and each job's page.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from gpuflow.client import Client
from gpuflow.config import TEMPORAL_VARIABLES
from gpuflow.specs import FleetSpec, JobSpec
from gpuflow.status import JobStatus
from tests.integration.stack_cli import free_port, gpuflow

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLEET = "uisim"
# name -> (command, the status the job reaches, the status the Temporal UI shows)
JOBS = {
    "ui-done": ("echo hello", JobStatus.DONE, "completed"),
    "ui-failed": ("exit 3", JobStatus.FAILED, "failed"),
    "ui-running": ("sleep 600", JobStatus.RUNNING, "running"),
}
WAIT_S = 20


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A headless chromium session, or a skip that says what is missing (a failure in CI)."""
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        reason = (
            f"browser test needs {', '.join(missing)} (apt-get install chromium chromium-driver)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium never looks for a driver online
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # chromium's sandbox refuses to start as root, as CI runs
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-background-networking",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The embedded stack on free loopback ports; yields the UI's address that `up` printed."""
    for variable in (*TEMPORAL_VARIABLES, "GPUFLOW_DATABASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUFLOW_TEMPORAL_PORT", str(free_port()))
    monkeypatch.setenv("GPUFLOW_UI_PORT", str(free_port()))
    text = gpuflow("up", "-d")
    try:
        match = re.search(r"http://127\.0\.0\.1:\d+", text)
        assert match, f"gpuflow up printed no UI address:\n{text}"
        yield match.group(0)
    finally:
        gpuflow("down")


async def _run_jobs(client: Client) -> dict[str, str]:
    """Submit the three jobs; return name -> workflow id once each has reached its status."""
    await client.apply_fleet(
        FleetSpec.model_validate(
            {
                "type": "fleet",
                "name": FLEET,
                "kind": "sim",
                "hosts": [
                    {"name": "box", "gpus": [{"name": "A100", "memory": "80GB", "count": 4}]}
                ],
            }
        )
    )
    ids = {}
    for name, (command, _, _) in JOBS.items():
        spec = JobSpec.model_validate(
            {"name": name, "commands": [command], "fleets": [FLEET], "resources": {"gpu": "A100:1"}}
        )
        ids[name] = (await client.submit(spec)).id
    deadline = time.monotonic() + WAIT_S
    for name, job_id in ids.items():
        expected = JOBS[name][1]
        while (status := (await client.get(job_id)).status) != expected:
            assert not status.is_final, f"{name} ended {status}, expected {expected}"
            assert time.monotonic() < deadline, f"{name} is {status} after {WAIT_S}s"
            await asyncio.sleep(0.1)
        if expected.is_final:  # the workflow closes just after it records the final status
            handle = client.temporal.get_workflow_handle(job_id)
            while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
                assert time.monotonic() < deadline, f"{name}'s workflow is open after {WAIT_S}s"
                await asyncio.sleep(0.1)
    return ids


def _wait(driver: Any, what: str | Callable[[], str], condition: Callable[[Any], Any]) -> Any:
    """Poll `condition` until it holds; else fail saying what was expected and what the page
    read (`what` may be a callable, to describe the last state seen)."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    # The UI draws its elements again as data comes in: one read between a look and its use
    # finds the element gone (seen once in CI); the next poll reads the page as it is then.
    ignored = (StaleElementReferenceException,)
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=ignored).until(
            condition
        )
    except TimeoutException:
        body = driver.find_element("tag name", "body").text
        wanted = what() if callable(what) else what
        raise AssertionError(
            f"the UI never showed {wanted}; the page read:\n{body[:3000]}"
        ) from None


def _list_statuses(driver: Any) -> dict[str, str]:
    """Workflow id -> status as the workflow list shows it (lower case)."""
    rows = driver.find_elements(
        "css selector", 'tr[data-testid="workflows-summary-configurable-table-row"]'
    )
    statuses = {}
    for row in rows:
        links = row.find_elements("css selector", "a[href*='/workflows/']")
        status = row.find_elements("css selector", '[data-testid="execution-status"]')
        if links and status:
            statuses[links[0].text.strip()] = status[0].text.strip().lower()
    return statuses


def _frame_text(driver: Any, frame_id: str) -> str:
    """The text of the frame with this id, or "" while it is not there."""
    from selenium.common.exceptions import (
        NoSuchElementException,
        NoSuchFrameException,
        StaleElementReferenceException,
    )

    try:
        driver.switch_to.frame(driver.find_element("id", frame_id))
        return str(driver.find_element("tag name", "body").text)
    except (NoSuchElementException, NoSuchFrameException, StaleElementReferenceException):
        return ""  # not there, or the UI drew it again between the look and the read
    finally:
        driver.switch_to.default_content()


def _shoot(driver: Any, path: Path) -> None:
    driver.save_screenshot(str(path))
    copies = os.environ.get("GPUFLOW_UI_SHOTS")  # a folder to keep the screenshots in
    if copies:
        Path(copies).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(copies) / path.name)


def _check_list(driver: Any, url: str, expected: dict[str, str], shot: Path) -> None:
    """The workflow list shows each workflow id with the expected status."""
    seen: dict[str, str] = {}
    loaded = [time.monotonic()]

    def matches(drv: Any) -> bool:
        seen.clear()
        seen.update(_list_statuses(drv))
        if all(seen.get(wid) == status for wid, status in expected.items()):
            return True
        # The list loads once; a row missing or behind after a while means visibility lagged.
        if time.monotonic() - loaded[0] > 3:
            drv.refresh()
            loaded[0] = time.monotonic()
        return False

    driver.get(url)
    try:
        _wait(driver, lambda: f"the statuses {expected} (read: {seen})", matches)
    finally:
        _shoot(driver, shot)


def _check_job_page(
    driver: Any, url: str, *, shown: str, want: dict[str, list[str]], shot: Path
) -> None:
    """The job's page shows its status, and its User Metadata tab the texts in `want` (frame
    id -> texts): the UI renders a workflow's summary and current details in frames."""
    driver.get(url)
    tab = '[data-testid="user-metadata-tab"]'
    _wait(driver, f"the tabs of {url}", lambda drv: drv.find_elements("css selector", tab))
    driver.find_element("css selector", tab).click()
    read: dict[str, str] = {}

    def shows(drv: Any) -> bool:
        header = drv.find_elements("css selector", '[data-testid="execution-status"]')
        read["status"] = header[0].text.strip().lower() if header else ""
        read.update({frame: _frame_text(drv, frame) for frame in want})
        texts_shown = all(t in read[frame] for frame, texts in want.items() for t in texts)
        return read["status"] == shown and texts_shown

    try:
        _wait(driver, lambda: f"{shown} and {want} (read: {read})", shows)
    finally:
        _shoot(driver, shot)


async def test_ui_shows_done_failed_and_running_jobs(
    browser: Any, stack: str, tmp_path: Path
) -> None:
    driver = browser
    client = await Client.connect()
    ids: dict[str, str] = {}
    try:
        ids.update(await _run_jobs(client))
        workflows = f"{stack}/namespaces/default/workflows"
        expected = {ids[name]: shown for name, (_, _, shown) in JOBS.items()}
        _check_list(driver, workflows, expected, tmp_path / "ui-list.png")
        for name, (_, status, shown) in JOBS.items():
            want = {
                "user-metadata-summary": [f"job {name}: 1 node(s), GPU A100:1"],
                "user-metadata-current-details": [
                    f"status {status.value} (attempt 1)",
                    "node 0: box GPUs",
                ],
            }
            _check_job_page(
                driver,
                f"{workflows}/{ids[name]}",
                shown=shown,
                want=want,
                shot=tmp_path / f"ui-{name}.png",
            )
    finally:
        if "ui-running" in ids:
            await client.stop(ids["ui-running"])
        await client.close()
