"""The status page, `GET /ui`: behind the admin key (header or login form + session cookie), fed by the
same point as the access log, and drawn in a real browser (headless Chromium through selenium).

The browser test saves its screenshot in the test's temp folder; with SLIPSTREAM_UI_SCREENSHOT=PATH
it also writes it there (docs/img/ui.png is made that way, docs/observability.md).
"""

from __future__ import annotations

import io
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from emulator.app import EmulatorConfig
from emulator.testing import running_emulator
from gateway.testing import RunningServer, running_proxy
from sdk.observability import live_stats
from tests.helpers import requires_extra

# The team compresses retrieved context and caches answers: both read MiniLM.
pytestmark = requires_extra("semantic")

ADMIN_KEY = "admin-ui-test-key"
TEAM_KEY = "sk-search-ui"
SYSTEM = "You are the search team's assistant. " + " ".join(f"Reference fact {i}: item {i} weighs {i * 7} grams." for i in range(160))
# Retrieved context after a lead-in: what compression prunes (docs/compression.md)
CONTEXT = "Use the following pieces of retrieved context to answer the question.\n\n" + "\n".join(
    f"The warehouse in city {i} stores {i * 13} crates of apples and ships them on day {i % 7}.\nIts manager likes tea." for i in range(60))


def _policy(directory: Path, emulator_url: str) -> None:
    (directory / "search.yaml").write_text(f"""team: search
api_keys: [{{value: "{TEAM_KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator_url}", api_key: "up-anthropic"}}
  gpt: {{kind: openai, base_url: "{emulator_url}/v1", api_key: "up-openai"}}
routes:
  - match: {{model: "claude-sonnet-5"}}
    targets: [{{provider: claude}}]
  - match: {{model: "claude-flaky"}}
    targets: [{{provider: claude}}, {{provider: gpt, model: gpt-4.1-mini}}]
  - match: {{model: "gpt-4.1-mini"}}
    targets: [{{provider: gpt}}]
retry: {{max_attempts: 2, base_delay_ms: 5, max_delay_ms: 20}}
breaker: {{min_requests: 2, cooldown_s: 300}}
semantic_cache: {{enabled: true, semantic: false}}
compression: {{enabled: true}}
budget: {{usd: 0.05, period: day}}
pricing: {{"claude-flaky": {{input: 3, output: 15}}}}  # a budgeted team is refused models without a price
""")


@pytest.fixture(scope="module")
def proxy(tmp_path_factory) -> Iterator[RunningServer]:
    """A proxy with the admin key, and a recorder with 1-second buckets so a few seconds draw a line."""
    previous = live_stats.recorder()
    live_stats.enable(live_stats.LiveStats(bucket_s=1))
    config = EmulatorConfig(ttft_base_ms=25, ttft_jitter=0.6, per_output_token_ms=0.5)
    with running_emulator(config) as emulator, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_ADMIN_KEY", ADMIN_KEY)
        directory = tmp_path_factory.mktemp("ui-policies")
        _policy(directory, emulator.url)
        with running_proxy([directory], watch_interval_s=None) as running:
            _traffic(running, emulator.url)
            yield running
    live_stats.enable(previous or live_stats.LiveStats())


def _traffic(proxy: RunningServer, emulator_url: str) -> None:
    """Five one-second rounds: prompt-cache reads (one changed system prompt: a named miss cause),
    response-cache hits and misses, a streamed answer, compressed context, failures that open a
    breaker (its requests fall back to gpt), and a request that fails."""
    claude = anthropic.Anthropic(base_url=proxy.url, api_key=TEAM_KEY, max_retries=0)
    gpt = openai.OpenAI(base_url=proxy.url + "/v1", api_key=TEAM_KEY, max_retries=0)
    for round_ in range(5):
        started = time.monotonic()
        system = SYSTEM if round_ != 3 else SYSTEM.replace("Reference fact 3:", "Reference fact three:")
        for question in range(2):
            claude.messages.create(model="claude-sonnet-5", max_tokens=32, system=system,
                                   messages=[{"role": "user", "content": f"Round {round_}, question {question}: what weighs most?"}])
        with claude.messages.stream(model="claude-sonnet-5", max_tokens=64, system=SYSTEM,
                                    messages=[{"role": "user", "content": f"Round {round_}: stream it"}]) as stream:
            assert stream.get_final_text()
        gpt.chat.completions.create(model="gpt-4.1-mini", temperature=0, messages=[{"role": "user", "content": "same question every round"}])
        gpt.chat.completions.create(model="gpt-4.1-mini", temperature=0, messages=[
            {"role": "system", "content": CONTEXT}, {"role": "user", "content": f"How many crates does city {round_ + 3} store?"}])
        if round_ == 2:
            httpx.post(f"{emulator_url}/_emulator/faults", json={"fault": "500", "count": 2, "match": {"model": "claude-flaky"}})
            for _ in range(2):  # two failed attempts open claude-flaky's breaker; both requests end on gpt
                claude.messages.create(model="claude-flaky", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            httpx.post(f"{emulator_url}/_emulator/faults", json={"fault": "500", "count": 2, "match": {"model": "gpt-4.1-mini"}})
            with pytest.raises(openai.InternalServerError):
                gpt.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "fails twice"}])
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def test_closed_without_the_admin_key(proxy):
    page = httpx.get(f"{proxy.url}/ui")
    assert page.status_code == 401 and 'action="/ui/login"' in page.text and "search" not in page.text
    for headers in ({}, {"authorization": f"Bearer {TEAM_KEY}"}, {"authorization": "Bearer wrong"}):
        data = httpx.get(f"{proxy.url}/ui/data", headers=headers)
        assert data.status_code == 401 and "search" not in data.text
    assert httpx.get(f"{proxy.url}/ui/static/uPlot.iife.min.js").status_code == 401
    assert httpx.post(f"{proxy.url}/ui/login", data={"key": TEAM_KEY}).status_code == 401
    assert httpx.get(f"{proxy.url}/ui", cookies={"slipstream_ui": "9999999999.forged"}).status_code == 401


def test_login_sets_a_session_cookie_and_the_data_has_the_traffic(proxy):
    login = httpx.post(f"{proxy.url}/ui/login", data={"key": ADMIN_KEY})
    assert login.status_code == 303 and login.headers["location"] == "/ui"
    cookie = login.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie and ADMIN_KEY not in cookie
    page = httpx.get(f"{proxy.url}/ui", cookies=login.cookies)
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert "/ui/static/uPlot.iife.min.js" in page.text and 'data-team="search"' in page.text
    data = httpx.get(f"{proxy.url}/ui/data", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    (team,) = data["teams"]
    charts = {chart["id"]: chart for chart in team["charts"]}
    traffic = charts["search|claude/claude-sonnet-5|traffic"]["series"]
    assert sum(traffic["requests"]) == 15 and sum(traffic["errors"]) == 0
    gpt = charts["search|gpt/gpt-4.1-mini|traffic"]["series"]
    assert sum(gpt["requests"]) == 6 + 2 + 1 and sum(gpt["errors"]) == 1  # misses, the fallbacks, the failure
    ttft = [v for v in charts["search|claude/claude-sonnet-5|ttft"]["series"]["p50"] if v is not None]
    assert len(ttft) >= 4 and all(v > 10 for v in ttft)  # the emulator's 25 ms base, bucket by bucket
    hits = [v for v in charts["search|caches"]["series"]["response-cache hits"] if v]
    reads = [v for v in charts["search|caches"]["series"]["prompt-cache read"] if v]
    assert hits and reads
    summary = team["summary_html"]
    assert "system_changed@system" in summary  # the changed system prompt, named as a miss cause
    assert 'breaker-open">open' in summary and "claude/claude-flaky" in summary
    assert "day budget" in summary and "<meter" in summary
    assert "tokens saved" in summary
    assert "4 exact" in summary  # the repeated question, answered from the response cache in rounds 1-4


def test_closed_when_no_admin_key_is_configured(tmp_path, emulator, monkeypatch):
    monkeypatch.delenv("SLIPSTREAM_ADMIN_KEY", raising=False)
    _policy(tmp_path, emulator.url)
    with running_proxy([tmp_path], watch_interval_s=None) as bare:
        page = httpx.get(f"{bare.url}/ui")
        assert page.status_code == 403 and "--admin-key" in page.text
        assert httpx.get(f"{bare.url}/ui/data").status_code == 403
        assert httpx.post(f"{bare.url}/ui/login", data={"key": ""}).status_code == 403


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="headless browser test: Debian's chromium and chromium-driver are not installed "
                           "(apt-get install -y chromium chromium-driver)")
def test_page_draws_the_charts_in_a_real_browser(proxy, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the [test] extra")
    from PIL import Image
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1500", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.get(f"{proxy.url}/ui")  # 401: the login form
        WebDriverWait(driver, 30).until(lambda d: d.find_elements(By.NAME, "key"))
        driver.find_element(By.NAME, "key").send_keys(ADMIN_KEY)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

        def drawn(d) -> bool:  # every chart has been drawn from /ui/data at least once
            return d.execute_script("return document.querySelectorAll('.chart[data-points]').length") >= 9

        WebDriverWait(driver, 30).until(drawn)
        kinds = driver.execute_script(
            "return [...document.querySelectorAll('.chart')].map(c => [c.dataset.kind, Number(c.dataset.points)])")
        assert {kind for kind, _ in kinds} == {"caches", "traffic", "ttft", "e2e"}
        assert all(points > 0 for _, points in kinds)
        # uPlot drew on its canvases: count the pixels that are not transparent
        inked = driver.execute_script("""
            return [...document.querySelectorAll('.chart canvas')].map(c => {
              const pixels = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
              let n = 0; for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) n++; return n; })""")
        assert len(inked) == len(kinds) and min(inked) > 500
        assert "slipstream_ui" not in driver.execute_script("return document.cookie")  # HttpOnly
        text = driver.find_element(By.CSS_SELECTOR, 'section[data-team="search"]').text
        assert "system_changed@system" in text and "open" in text
        png = driver.get_screenshot_as_png()
    finally:
        driver.quit()

    image = Image.open(io.BytesIO(png))
    assert image.size[0] >= 1200 and len(image.getcolors(maxcolors=1 << 16) or range(1 << 16)) > 16
    image.save(tmp_path / "ui.png")
    if target := os.environ.get("SLIPSTREAM_UI_SCREENSHOT"):  # docs/img/ui.png: 256 colours keep it small
        image.convert("RGB").quantize(256).save(target, optimize=True)
