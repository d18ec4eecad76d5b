"""`slipstream serve --workers N`: N processes on one port sharing Redis, or a refusal without it."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import anthropic
import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.testing import free_port
from tests.gateway.test_cli import ROOT, _command, _wait, serving
from tests.helpers import write_policy


def test_workers_refuse_to_split_state_silently(tmp_path):
    write_policy(tmp_path, "t", "sk-t", "http://127.0.0.1:9")
    env = {k: v for k, v in os.environ.items() if k != "SLIPSTREAM_STATE_URL"}
    done = subprocess.run([*_command(), "serve", "--policy-dir", str(tmp_path), "--workers", "2"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--state-url" in done.stderr and "--local-state" in done.stderr


def test_two_workers_share_one_limit(tmp_path, fresh_emulator, redis_url):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 5}\n")
    port = free_port()
    process = subprocess.Popen([*_command(), "serve", "--policy-dir", str(tmp_path), "--port", str(port), "--workers", "2",
                                "--state-url", redis_url], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(f"http://127.0.0.1:{port}/healthz", process)
        outcomes = []
        started = time.monotonic()
        for _ in range(12):  # a fresh connection each time: the kernel spreads them over the workers
            client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sk-t", max_retries=0)
            try:
                client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
                outcomes.append(True)
            except anthropic.RateLimitError:
                outcomes.append(False)
            finally:
                client.close()
        # The bucket refills one request every 12 s: on a loaded machine the twelve calls may outlast
        # that, and each refill is one more the limit rightly lets through.
        refilled = int((time.monotonic() - started) * 5 / 60)
        assert 5 <= sum(outcomes) <= 5 + refilled, (outcomes, refilled)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _scraped(url: str) -> dict[str, float]:
    """One scrape of /metrics on a fresh connection (the kernel hands it to any worker): the team's
    answered requests and requests in flight."""
    page = httpx.get(f"{url}/metrics", timeout=10, headers={"connection": "close"}).text
    values = {"requests": 0.0, "in_flight": 0.0}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.labels.get("team") != "t":
                continue
            if sample.name == "slipstream_requests_total":
                values["requests"] += sample.value
            elif sample.name == "slipstream_in_flight_requests":
                values["in_flight"] += sample.value
    return values


def _sent(url: str, requests: int) -> int:
    for _ in range(requests):  # a fresh connection each time: the kernel spreads them over the workers
        with anthropic.Anthropic(base_url=url, api_key="sk-t", max_retries=0) as client:
            client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    return requests


def test_every_scrape_counts_every_workers_requests(tmp_path, fresh_emulator):
    """With two workers on one port a scrape reached one of them and showed its counters alone (a
    fraction of the traffic, changing with the worker that answered); every page sums all workers."""
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url)
    with serving(tmp_path, "--workers", "2", "--local-state") as url:
        sent = _sent(url, 16)
        assert [_scraped(url) for _ in range(6)] == [{"requests": sent, "in_flight": 0}] * 6


def test_the_status_page_adds_up_every_workers_traffic(tmp_path, fresh_emulator):
    """With two workers on one port the page showed the worker that answered it, a share of the
    traffic that changed at each refresh; now each worker publishes its buckets for the others."""
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url)
    admin = {"authorization": "Bearer status-admin-key", "connection": "close"}
    with serving(tmp_path, "--workers", "2", "--local-state", env={"SLIPSTREAM_ADMIN_KEY": "status-admin-key"}) as url:
        sent = _sent(url, 16)

        def page() -> tuple[int, int]:  # one page on a fresh connection: requests it counts, processes it adds up
            data = httpx.get(f"{url}/ui/data", headers=admin, timeout=10).json()
            (team,) = [t for t in data["teams"] if t["team"] == "t"]
            traffic = [chart for chart in team["charts"] if chart["kind"] == "traffic"]
            return int(sum(sum(v or 0 for v in chart["series"]["requests"]) for chart in traffic)), data.get("workers", 1)

        # Until both workers have published (every 2 s, later on a loaded machine): one page that adds up
        # both says only that the worker answering it has the other's copy, so six pages in a row must.
        deadline = time.monotonic() + 60
        while (pages := [page() for _ in range(6)]) != [(sent, 2)] * 6 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert pages == [(sent, 2)] * 6


def test_a_metrics_directory_the_operator_names_starts_empty(tmp_path, monkeypatch):
    """An earlier run's files in PROMETHEUS_MULTIPROC_DIR would add its counters to this run's, and a
    dead worker's status-page copy would pass for a new process given its pid: both are deleted."""
    from sdk.observability.exposition import MULTIPROC_ENV, shared_metrics_dir

    (tmp_path / "counter_123.db").write_bytes(b"old")
    (tmp_path / "live-stats-123.json").write_bytes(b"{}")
    (tmp_path / "notes.txt").write_text("the operator's")
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    with shared_metrics_dir() as directory:
        assert directory == tmp_path and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    monkeypatch.delenv(MULTIPROC_ENV)
    with shared_metrics_dir() as directory:  # none named: a temporary one, gone afterwards
        assert os.environ[MULTIPROC_ENV] == str(directory) and directory.is_dir()
    assert not directory.exists() and MULTIPROC_ENV not in os.environ
