"""The status page across `slipstream serve --workers N`: each worker publishes its live buckets
(sdk/observability/live_stats.py) where the others read them, so a page shows every worker's traffic.

The workers share one port, and a page or its refresh reaches whichever worker accepts the
connection: built from that worker's buckets alone it showed a fraction of the traffic, a different
one at each refresh. Now every worker writes a copy of its buckets every `PUBLISH_S` seconds (only
when it recorded something since the last copy) to the directory the workers already share for
their metrics (sdk/observability/exposition.py), and the worker answering a page adds the others'
copies to its own buckets: counters and latency histograms add bucket by bucket (buckets are
aligned on Unix time, and the histograms' bins are the same everywhere), so percentiles are the
merged traffic's. The others' numbers are at most `PUBLISH_S` seconds old. The copies are JSON
(never pickle: the directory may be one an operator named).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections import Counter
from pathlib import Path

import numpy as np
import orjson

from sdk.observability.exposition import MULTIPROC_ENV, alive
from sdk.observability.live_stats import BUCKETS, COUNTERS, Bucket, LiveStats, SeriesCopy, Snapshot, dense

PUBLISH_S = 2.0
_FILE = re.compile(r"live-stats-(\d+)\.json")


def shared_dir() -> Path | None:
    """The directory `slipstream serve --workers` shares between its workers; None for one process."""
    directory = os.environ.get(MULTIPROC_ENV)
    return Path(directory) if directory else None


def _path(directory: Path, pid: int) -> Path:
    return directory / f"live-stats-{pid}.json"


async def publish(recorder: LiveStats, directory: Path, interval_s: float = PUBLISH_S) -> None:
    """Write this worker's buckets for the others every `interval_s` while it records; removes the
    copy when cancelled (the worker stops)."""
    path, published = _path(directory, os.getpid()), -1
    try:
        while True:
            await asyncio.sleep(interval_s)
            if recorder.recorded == published:
                continue
            published = recorder.recorded
            snapshot = recorder.snapshot()  # on the loop that records; encoding and writing in a thread
            await asyncio.to_thread(_write, path, encode(snapshot))
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def _write(path: Path, data: bytes) -> None:
    partial = path.with_suffix(".partial")
    partial.write_bytes(data)
    os.replace(partial, path)  # a reader sees the old copy or the new one, never half of one


def others(directory: Path) -> list[Snapshot]:
    """The copies the other live workers published (a dead worker's is left out)."""
    copies = []
    for name in os.listdir(directory):
        match = _FILE.fullmatch(name)
        if match is None or int(match.group(1)) == os.getpid() or not alive(int(match.group(1))):
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, IndexError):  # gone, or not a copy we wrote
            copies.append(decode((directory / name).read_bytes()))
    return copies


def merged(own: Snapshot, copies: list[Snapshot]) -> Snapshot:
    """`own` with the buckets of `copies` added, on `own`'s window (older buckets fall out)."""
    if not copies:
        return own
    first = own.last - BUCKETS + 1
    series: dict[tuple[str, str], dict[int, Bucket]] = {}
    for snapshot in (own, *copies):
        start = snapshot.last - BUCKETS + 1
        for copy in snapshot.series:
            rows = series.setdefault((copy.team, copy.route), {})
            for row, bucket in copy.rows:
                epoch = start + row
                if first <= epoch <= own.last:
                    rows[epoch] = _added(rows[epoch], bucket) if epoch in rows else bucket
    return Snapshot(own.bucket_s, own.last, [
        SeriesCopy(team, route, [(epoch - first, bucket) for epoch, bucket in sorted(rows.items())])
        for (team, route), rows in sorted(series.items()) if rows
    ])


def _added(a: Bucket, b: Bucket) -> Bucket:
    return Bucket(tuple(x + y for x, y in zip(a.counts, b.counts, strict=True)), a.ttft + b.ttft, a.e2e + b.e2e,
                   a.causes + b.causes)


def encode(snapshot: Snapshot) -> bytes:
    """A snapshot as JSON, histograms sparse ({bin: samples})."""
    return orjson.dumps({
        "bucket_s": snapshot.bucket_s, "last": snapshot.last,
        "series": [{"team": copy.team, "route": copy.route, "rows": [
            [row, list(bucket.counts), _sparse(bucket.ttft), _sparse(bucket.e2e), dict(bucket.causes)]
            for row, bucket in copy.rows]} for copy in snapshot.series],
    })


def decode(data: bytes) -> Snapshot:
    body = orjson.loads(data)
    return Snapshot(int(body["bucket_s"]), int(body["last"]), [
        SeriesCopy(str(copy["team"]), str(copy["route"]), [
            (int(row), Bucket(_counts(counts), _dense_of(ttft), _dense_of(e2e), Counter({str(k): int(v) for k, v in causes.items()})))
            for row, counts, ttft, e2e, causes in copy["rows"] if 0 <= int(row) < BUCKETS])
        for copy in body["series"]
    ])


def _counts(values: list[int]) -> tuple[int, ...]:
    if len(values) != len(COUNTERS):
        raise ValueError("a copy from another version of the counters")
    return tuple(int(v) for v in values)


def _sparse(histogram: np.ndarray) -> dict[str, int]:
    return {str(i): int(histogram[i]) for i in np.flatnonzero(histogram)}


def _dense_of(sparse: dict[str, int]) -> np.ndarray:
    return dense({int(k): int(v) for k, v in sparse.items()})
