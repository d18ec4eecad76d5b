"""The Prometheus page (`GET /metrics`): one process's metrics, or every worker's summed.

`slipstream serve --workers N` runs N processes on one port, and a scrape reaches whichever one
accepts its connection: a page of that process's counters alone is a fraction of the traffic, and
it jumps between the workers' values from scrape to scrape (Prometheus reads each drop as a counter
reset). So with several workers every process keeps its values in prometheus_client's multiprocess
files (a directory named by `PROMETHEUS_MULTIPROC_DIR`, which the library reads when it is first
imported, so the serving command sets it before the workers start) and each page is built from all
of them: counters and histograms summed, gauges by their `multiprocess_mode` (sdk/observability/metrics.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from sdk.observability.metrics import REGISTRY

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's own name for the directory
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db")


def exposition() -> bytes:
    """The page in Prometheus' text format (it walks every series: call it off the event loop)."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return generate_latest(REGISTRY)
    _forget_dead_workers(directory)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    return generate_latest(registry)


def _forget_dead_workers(directory: str) -> None:
    """Drop the live gauges of workers that are gone (a crashed worker's in-flight requests would
    count forever); their counters stay, so totals never go back."""
    pids = {int(match.group(1)) for name in os.listdir(directory) if (match := _LIVE_GAUGE_FILE.fullmatch(name))}
    for pid in pids:
        if not alive(pid):
            mark_process_dead(pid, directory)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a worker's files outlive it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True


@contextlib.contextmanager
def shared_metrics_dir() -> Iterator[Path]:
    """For the life of a multi-worker server: the directory every worker writes its metrics (and
    its status-page buckets) to, set in the environment the workers inherit. In a directory the
    operator named, an earlier run's files are deleted first (its values would be added to this
    run's, and a new process given a dead worker's pid would pass for it); otherwise a temporary
    one is made and removed afterwards."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        directory = Path(given)
        directory.mkdir(parents=True, exist_ok=True)
        for pattern in ("*.db", "live-stats-*.json"):  # the metrics' files, the status page's (live_workers.py)
            for stale in directory.glob(pattern):
                stale.unlink()
        yield directory
        return
    directory = Path(tempfile.mkdtemp(prefix="slipstream-metrics-"))
    os.environ[MULTIPROC_ENV] = str(directory)
    try:
        yield directory
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)
