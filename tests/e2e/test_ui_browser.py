"""The web view in a real browser: headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) against a real ``flywheel up`` with real traffic.

``flywheel up --tiny`` runs with a task file and a callable agent (two chat calls per episode through
the ``openai`` SDK, a reward per call), one group per trainer step, two steps. The test also makes two
episodes of its own through the gateway, as an agent would. Then, in the browser, signed in with the
admin token through the form: the list shows the test's episodes, a filter narrows it, an episode's
page shows exactly the token ids and behaviour logprobs the event log holds for its calls, the training
chart has the steps the trainer reported, and a malformed filter is a page that says what is wrong.

The test command installs the browser (infra/scripts/test.sh) and sets ``FLYWHEEL_REQUIRE_BROWSER=1``:
without it a missing browser skips this module. Screenshots go to the test's directory, and to
``FLYWHEEL_UI_SCREENSHOTS`` too when that names a directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")
TOKEN = "ui-browser-admin-token-0123456789"
AGENT = "examples.agents_for_tests.per_call_agent:run"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
STEPS = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        reason = "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("FLYWHEEL_REQUIRE_BROWSER") == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``flywheel up --tiny`` training on a task file (its URL, and a key of tenant ``acme``); Ctrl-C at
    the end must stop it cleanly."""
    tmp = tmp_path_factory.mktemp("up")
    tasks = tmp / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps(
                {"task_id": f"sum-{i}", "input": {"question": f"What is {i} plus 2?", "max_tokens": 6}}
            )
            + "\n"
            for i in range(2)
        )
    )
    port = _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update(
        FLYWHEEL_ADMIN_TOKEN=TOKEN, FLYWHEEL_TRAINER_TORCH_THREADS="1", FLYWHEEL_TRAINER_BATCH_GROUPS="1"
    )
    made = subprocess.run(
        [FLYWHEEL, "keys", "create", "--tenant", "acme"],
        env={**env, "FLYWHEEL_DATA_DIR": str(tmp / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    key = made.stdout.strip()
    log = (tmp / "up.log").open("w+")
    args = ["up", "--tiny", "--port", str(port), "--data-dir", str(tmp / "data")]
    args += ["--tasks", str(tasks), "--agent", AGENT, "--n", "2", "--max-steps", str(STEPS)]
    proc = subprocess.Popen([FLYWHEEL, *args], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "flywheel up did not become ready"
            time.sleep(0.3)  # another process's readiness: nothing to wait on but its port
        yield url, key
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -1
        log.close()
    output = (tmp / "up.log").read_text()
    assert code == 0 and "stopped cleanly" in output, output[-2000:]
    assert f"web view on {url}/ui/" in output  # flywheel up says where the view is


def _sql(url: str, sql: str) -> list[list[Any]]:
    r = httpx.post(
        f"{url}/admin/eventlog/query",
        json={"sql": sql},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    r.raise_for_status()
    rows: list[list[Any]] = r.json()["rows"]
    return rows


def _wait_for(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)  # the recorder writes in batches: poll the event log


def _episodes_of_our_own(
    url: str, names: tuple[tuple[str, float], ...] = (("browser-a", 1.0), ("browser-b", 0.0))
) -> dict[str, float]:
    """Episodes through the gateway as an agent makes them (two calls each, one per task name); rewards."""
    out: dict[str, float] = {}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(timeout=60, headers=headers) as client:
        for name, reward in names:
            opened = client.post(f"{url}/admin/episodes", json={"task_id": name}).json()
            messages: list[dict[str, str]] = [{"role": "user", "content": f"Say hello to {name}."}]
            for _ in range(2):
                answer = client.post(
                    f"{opened['base_url']}/chat/completions",
                    json={"model": "policy", "messages": messages, "max_tokens": 8},
                )
                assert answer.status_code == 200, answer.text
                messages += [
                    answer.json()["choices"][0]["message"],
                    {"role": "user", "content": "And again."},
                ]
            finished = client.post(
                f"{url}/admin/episodes/{opened['episode_id']}/finish", json={"reward": reward}
            )
            assert finished.status_code == 200, finished.text
            out[opened["episode_id"]] = reward
    return out


def _production_sessions(url: str, key: str) -> list[str]:
    """Two sessions of tenant ``acme`` through ``/v1`` with its key: one liked, one without feedback."""
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=60, headers=headers) as client:
        for session in ("liked", "silent"):
            answer = client.post(
                f"{url}/v1/chat/completions",
                json={"model": "policy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
                headers={"X-Flywheel-Session": session},
            )
            assert answer.status_code == 200, answer.text
        liked = client.post(f"{url}/v1/feedback", json={"session_id": "liked", "rating": 1})
        assert liked.status_code == 200, liked.text
        for session in ("liked", "silent"):
            assert client.post(f"{url}/v1/sessions/{session}/end").status_code == 200
    return ["liked", "silent"]


def _shoot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"ui-{name}.png"
    driver.save_screenshot(str(path))
    target = os.environ.get("FLYWHEEL_UI_SCREENSHOTS")
    if target:
        shutil.copy(path, Path(target) / path.name)


def _rows(driver: Any, column: int = 0) -> list[str]:
    """The list's episode ids (or one column's text), read in one go: the page replaces its rows while
    it polls, so element handles found one call earlier may be gone."""
    rows: list[str] = driver.execute_script(
        "return Array.from(document.querySelectorAll('tr.episode')).map(r =>"
        " arguments[0] ? r.cells[arguments[0]].textContent : r.dataset.episode)",
        column,
    )
    return rows


def test_the_view_in_a_browser_shows_what_the_event_log_holds(up: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    up, key = up
    ours = _episodes_of_our_own(up)
    _production_sessions(up, key)
    ids = ", ".join(f"'{e}'" for e in ours)
    _wait_for(
        "our episodes to be scored",
        lambda: (
            _sql(
                up,
                f"SELECT count() FROM flywheel.events WHERE type = 'episode_scored' AND episode_id IN ({ids})",
            )[0][0]
            >= 2
        ),
        120,
    )
    steps = _wait_for(
        f"{STEPS} trainer steps",
        lambda: (s := _sql(up, "SELECT JSONExtractInt(payload, 'step') FROM flywheel.events "
                               "WHERE type = 'trainer_step_completed' ORDER BY emitted_at")) and len(s) >= STEPS and s,
        240,
    )  # fmt: skip
    reported = [row[0] for row in steps]
    wait = WebDriverWait(browser, 30)

    # sign in through the form; the list then shows the episodes the test made
    browser.get(f"{up}/ui/")
    assert browser.find_elements(By.ID, "token"), browser.page_source[:500]
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "signin").click()
    wait.until(ec.presence_of_element_located((By.ID, "rows")))
    listed = _rows(browser)
    assert set(ours) <= set(listed), (ours, listed)
    _shoot(browser, tmp_path, "episodes")

    # live: an episode made now appears in the open list without a reload (the page polls its rows)
    browser.execute_script("document.body.dataset.untouched = 'yes'")
    (late,) = _episodes_of_our_own(up, names=(("browser-late", 0.5),))
    WebDriverWait(browser, 60).until(lambda d: late in _rows(d))
    assert browser.execute_script("return document.body.dataset.untouched") == "yes"  # the same page

    # a filter narrows the list: reward ≥ 1 keeps browser-a, drops browser-b
    browser.find_element(By.ID, "f-reward_min").send_keys("1")
    browser.find_element(By.ID, "f-task").send_keys("browser-")
    browser.find_element(By.ID, "apply").click()
    wait.until(ec.url_contains("reward_min=1"))
    narrowed = _rows(browser)
    liked = [e for e, r in ours.items() if r >= 1]
    assert narrowed == liked, (narrowed, ours)
    browser.get(f"{up}/ui/?source=production")
    production = _rows(browser)
    sources = _rows(browser, column=2)
    assert len(production) == 2 and sources == ["production"] * 2, (production, sources)
    pages = []
    for episode in production:  # the liked session's page shows its feedback
        browser.get(f"{up}/ui/episodes/{episode}")
        pages.append(browser.find_elements(By.CSS_SELECTOR, "#feedback li.feedback"))
        if pages[-1]:
            assert "rating 1" in pages[-1][0].text
            _shoot(browser, tmp_path, "production")
    assert sorted(len(p) for p in pages) == [0, 1]

    # an episode's page: every token id and behaviour logprob the event log holds for its calls
    episode_id = liked[0]
    browser.get(f"{up}/ui/episodes/{episode_id}")
    wait.until(ec.presence_of_element_located((By.ID, "episode")))
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('section.call')).map(s =>"
        " Array.from(s.querySelectorAll('.tok')).map(t => [Number(t.dataset.id), Number(t.dataset.logprob), t.title]))"
    )
    payloads = _sql(
        up,
        "SELECT payload FROM flywheel.events FINAL WHERE type = 'llm_call_recorded' "
        f"AND episode_id = '{episode_id}' ORDER BY call_seq",
    )
    recorded = [json.loads(p[0])["choices"][0] for p in payloads]
    assert len(shown) == len(recorded) == 2
    for tokens, choice in zip(shown, recorded, strict=True):
        assert [t[0] for t in tokens] == choice["token_ids"]
        assert [t[1] for t in tokens] == pytest.approx(choice["logprobs"], abs=1e-5)
        assert all("logprob" in t[2] for t in tokens)  # the tooltip carries the value
    _shoot(browser, tmp_path, "episode")

    # the training page: the chart's steps are the steps the trainer reported
    browser.get(f"{up}/ui/training")
    labels = WebDriverWait(browser, 30).until(
        lambda d: d.execute_script(
            "const c = window.Chart && Chart.getChart('chart-reward'); return c && c.data.labels.length ? c.data.labels : null"
        )
    )
    assert labels == reported and len(labels) == STEPS, (labels, reported)
    tenants = browser.execute_script(
        "const c = Chart.getChart('chart-tenants'); return [c.data.labels, c.data.datasets[0].data]"
    )
    assert tenants == [["acme"], [0.5]]  # two production sessions of acme, one with feedback
    _shoot(browser, tmp_path, "training")

    # a malformed filter: a page that says what is wrong
    browser.get(f"{up}/ui/?reward_min=abc")
    assert "reward_min must be a number" in browser.find_element(By.ID, "error").text
