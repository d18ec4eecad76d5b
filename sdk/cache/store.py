"""Cache entries in SQLite, with in-memory lookup structures rebuilt from it on start.

SQLite is the one source of truth: it holds each entry's response, its embedding, TTL and LRU
stamps, so a restart (or a crash between two writes) can never leave an index pointing at a missing
row. The per-partition faiss indexes are derived from it when the store opens; every lookup reads
the entry's row, so an entry deleted from the file is served by no process. The workers of
`slipstream serve --workers N` share the file: an exact lookup, a replaced key and an invalidation
go to the file by key (another worker's answers are exact hits at once, and an invalidation drops
them too); the semantic tier finds another worker's entries after a restart.

Writes wait for each other, and with several workers on one file a write waits for another
process's (SQLite's busy timeout): they have a connection and a lock of their own, and the pipeline
stores off the event loop (`ResponseCache.put`). Lookups, on the loop, only read (in WAL mode a
reader never waits for a writer); the LRU stamp a hit earns is kept in memory and written with the
next store, when the least recently used entries are chosen.

Isolation is structural: every in-memory map is keyed by team first, and every SQL statement
filters by team, so no lookup can reach another team's entries whatever the similarity.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from sdk.cache.index import PartitionIndex
from sdk.embedding import DIMENSION
from sdk.offload import HEAVY_POOL

# Entries deleted in one hold of the store's lock (an invalidation's part, a store's expired or evicted
# entries). The lock is every team's, and lookups take it on the event loop every team's requests
# share: a team's whole cache (10,000 entries by default) deleted in one hold held them all for
# about 0.1 s.
DELETES_PER_HOLD = 500

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    team TEXT NOT NULL,
    partition TEXT NOT NULL,
    exact_key TEXT NOT NULL,
    route TEXT NOT NULL,
    query TEXT,
    embedding BLOB,
    response BLOB NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    last_used_at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_exact ON entries (team, exact_key);
CREATE INDEX IF NOT EXISTS entries_lru ON entries (team, last_used_at);
CREATE INDEX IF NOT EXISTS entries_expiry ON entries (team, expires_at);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class TeamLimits:
    ttl_s: float
    max_entries: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class NewEntry:
    team: str
    partition: str
    exact_key: str
    route: str
    query: str | None
    vector: np.ndarray | None  # None: exact tier only
    response: dict[str, Any]


@dataclass(slots=True)
class Entry:
    """A stored answer as read: its response's bytes, parsed when first asked for (`response`), so a
    large one can be parsed in the heavy-work pool rather than under the store's lock on the loop."""

    id: int
    team: str
    exact_key: str
    route: str
    query: str | None
    raw: bytes
    _parsed: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def response(self) -> dict[str, Any]:
        return self._parsed if self._parsed is not None else self.parse()

    def parse(self) -> dict[str, Any]:
        self._parsed = orjson.loads(self.raw)
        return self._parsed


@dataclass(frozen=True, slots=True)
class Candidate:
    id: int
    cosine: float
    query: str
    vector: np.ndarray


@dataclass(slots=True)
class _Team:
    partitions: dict[str, PartitionIndex] = field(default_factory=dict)
    located: dict[int, str] = field(default_factory=dict)  # id -> partition, of the entries this process indexed
    bytes: int = 0


class CacheStore:
    def __init__(self, path: Path, space: str = "minilm", approximate_from: int = 20_000, clock: Callable[[], float] = time.time):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.clock = clock
        self.approximate_from = approximate_from
        self._lock = threading.RLock()  # the in-memory structures and the reading connection
        self._write_lock = threading.Lock()  # the writing connection: one write at a time
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a crash may lose the last entries, never corrupt
        self._db.executescript(_SCHEMA)
        # A second connection to ":memory:" would be a second database: an in-memory store reads and
        # writes on one (no other process can make its writes wait).
        self._writer = self._db if str(path) == ":memory:" else sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        # entry id -> (its team, its key, its last hit), not yet written. Written to that entry only: under
        # --workers N another worker may have deleted it meanwhile, and its id come back as another team's row.
        self._stamps: dict[int, tuple[str, str, float]] = {}
        self._teams: dict[str, _Team] = {}
        self._forget_other_space(space)
        self._load()

    # -- lookups ---------------------------------------------------------------------------------

    # `max_age_s` in lookups: the team's ttl_s as its policy is now. An entry expires at the ttl_s it was
    # stored under; a policy reload that lowers ttl_s must not leave older answers served until then.

    def get_exact(self, team: str, exact_key: str, max_age_s: float | None = None) -> Entry | None:
        with self._lock:
            entry_id = self._id_of(self._db, team, exact_key)
            return self._fetch(team, entry_id, max_age_s) if entry_id is not None else None

    def search(self, team: str, partition: str, vector: np.ndarray, k: int, max_age_s: float | None = None) -> list[Candidate]:
        """Nearest entries of this team's partition (live ones only), most similar first."""
        with self._lock:
            index = self._team(team).partitions.get(partition)
            if index is None:
                return []
            hits = index.search(vector, k)
            if not hits:
                return []
            marks = ",".join("?" * len(hits))
            # NOT INDEXED: fetch the hits by row id; left to itself SQLite picks the (team, expires_at)
            # index and reads every live entry of the team (3 ms a lookup at 7,500 entries, measured).
            now = self.clock()
            rows = self._db.execute(
                "SELECT id, query, embedding FROM entries NOT INDEXED WHERE team = ? AND partition = ? AND expires_at > ? "
                f"AND created_at > ? AND id IN ({marks})",
                (team, partition, now, _born_after(now, max_age_s), *(i for i, _ in hits)),
            ).fetchall()
        found = {row[0]: row for row in rows}
        return [
            Candidate(i, cosine, found[i][1], np.frombuffer(found[i][2], dtype=np.float32))
            for i, cosine in hits
            if i in found
        ]

    def fetch(self, team: str, entry_id: int, max_age_s: float | None = None) -> Entry | None:
        with self._lock:
            return self._fetch(team, entry_id, max_age_s)

    def _fetch(self, team: str, entry_id: int, max_age_s: float | None) -> Entry | None:
        now = self.clock()
        row = self._db.execute(
            "SELECT id, team, exact_key, route, query, response FROM entries WHERE id = ? AND team = ? AND expires_at > ? AND created_at > ?",
            (entry_id, team, now, _born_after(now, max_age_s)),
        ).fetchone()
        if row is None:
            return None
        self._stamps[entry_id] = (team, row[2], now)  # the LRU stamp, written with the next store (a write here could wait)
        return Entry(row[0], row[1], row[2], row[3], row[4], row[5])

    # -- writes ----------------------------------------------------------------------------------

    def put(self, entry: NewEntry, limits: TeamLimits) -> int:
        """Store an answer; may wait for other writers (another worker's): call it off the event loop."""
        response = orjson.dumps(entry.response)
        blob = None if entry.vector is None else np.asarray(entry.vector, dtype=np.float32).reshape(DIMENSION).tobytes()
        size = len(response) + len(blob or b"") + len(entry.query or "")
        now = self.clock()
        with self._write_lock:
            self._purge_expired(entry.team, now)
            if (old := self._id_of(self._writer, entry.team, entry.exact_key)) is not None:
                self._delete(entry.team, [old])  # a concurrent miss (of any worker) stored it first: the newer answer wins
            cursor = self._writer.execute(
                "INSERT INTO entries (team, partition, exact_key, route, query, embedding, response, size, created_at, expires_at, last_used_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (entry.team, entry.partition, entry.exact_key, entry.route, entry.query, blob, response, size, now, now + limits.ttl_s, now),
            )
            entry_id = int(cursor.lastrowid or 0)
            with self._lock:
                self._remember(entry.team, entry_id, entry.partition, blob, size)
            self._write_stamps()
            self._enforce_caps(entry.team, limits)
        if (index := self._due(entry.team, entry.partition)) is not None:
            # in the heavy-work pool as the team's work: not in this thread, where every team's stores wait their turn
            HEAVY_POOL.submit(functools.partial(self._approximate, entry.team, entry.partition, index), tenant=entry.team)
        return entry_id

    def invalidate(self, team: str | None = None, exact_key: str | None = None) -> int:
        """Delete entries: one by key (within a team if given), a whole team, or everything. Returns the count.
        The entries are the file's, not only those this process stored: another worker's go too."""
        where = " AND ".join(["1", *(["team = ?"] if team is not None else []), *(["exact_key = ?"] if exact_key is not None else [])])
        with self._write_lock:
            rows = self._writer.execute(f"SELECT team, id FROM entries WHERE {where}",
                                        [value for value in (team, exact_key) if value is not None]).fetchall()
            ids: dict[str, list[int]] = {}
            for t, entry_id in rows:
                ids.setdefault(t, []).append(entry_id)
            for t, team_ids in ids.items():
                for start in range(0, len(team_ids), DELETES_PER_HOLD):  # the lock let go between: see DELETES_PER_HOLD
                    self._delete(t, team_ids[start:start + DELETES_PER_HOLD])
        return len(rows)

    def count(self, team: str) -> int:
        with self._lock:
            return len(self._team(team).located)

    def close(self) -> None:
        with self._write_lock, self._lock:
            self._write_stamps()
            self._db.close()
            self._writer.close()

    # -- internals -------------------------------------------------------------------------------

    @staticmethod
    def _id_of(db: sqlite3.Connection, team: str, exact_key: str) -> int | None:
        row = db.execute("SELECT id FROM entries WHERE team = ? AND exact_key = ?", (team, exact_key)).fetchone()
        return int(row[0]) if row is not None else None

    def _write_stamps(self) -> None:
        """Write the LRU stamps of the hits since the last store (with the write lock held)."""
        with self._lock:
            stamps, self._stamps = self._stamps, {}
        if stamps:
            self._writer.executemany("UPDATE entries SET last_used_at = ? WHERE id = ? AND team = ? AND exact_key = ?",
                                     [(at, i, team, key) for i, (team, key, at) in stamps.items()])

    def _due(self, team: str, partition: str) -> PartitionIndex | None:
        """The partition's index if it has grown past `approximate_from`, marked as being trained."""
        with self._lock:
            index = self._team(team).partitions.get(partition)
            if index is None or not index.due:
                return None
            index.training = True
            return index

    def _approximate(self, team: str, partition: str, index: PartitionIndex) -> None:
        """Train `index` an approximate one and install it. Training takes seconds, and runs holding neither
        lock: with the one every lookup takes (on the event loop every team's requests share) it held them
        all. The entries stored and removed meanwhile are brought in when it is installed."""
        with self._lock:
            vectors = index.snapshot()
        trained = None
        try:
            trained = PartitionIndex.trained(vectors)
        finally:
            with self._lock:
                index.training = False
                if trained is not None and self._team(team).partitions.get(partition) is index:
                    index.install(trained, vectors)

    def _team(self, team: str) -> _Team:
        state = self._teams.get(team)
        if state is None:
            state = self._teams[team] = _Team()
        return state

    def _remember(self, team: str, entry_id: int, partition: str, blob: bytes | None, size: int) -> None:
        state = self._team(team)
        state.located[entry_id] = partition
        state.bytes += size
        if blob is not None:
            index = state.partitions.get(partition)
            if index is None:
                index = state.partitions[partition] = PartitionIndex(self.approximate_from)
            index.add([entry_id], np.frombuffer(blob, dtype=np.float32))

    def _delete(self, team: str, ids: list[int]) -> None:
        """Delete entries from the file (with the write lock held), then from this process's structures."""
        if not ids:
            return
        rows: list[tuple[int, int]] = []
        for start in range(0, len(ids), 500):  # SQLite caps the number of bound parameters
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            rows += self._writer.execute(f"SELECT id, size FROM entries WHERE team = ? AND id IN ({marks})", (team, *chunk)).fetchall()
            self._writer.execute(f"DELETE FROM entries NOT INDEXED WHERE team = ? AND id IN ({marks})", (team, *chunk))  # by row id, as in search
        with self._lock:
            self._forget(team, ids, rows)

    def _forget(self, team: str, ids: list[int], rows: list[tuple[int, int]]) -> None:
        state = self._team(team)
        state.bytes -= sum(size for entry_id, size in rows if entry_id in state.located)  # another worker's are not counted here
        for entry_id in ids:
            self._stamps.pop(entry_id, None)
        by_partition: dict[str, list[int]] = {}
        for entry_id in ids:
            partition = state.located.pop(entry_id, None)
            if partition is None:
                continue
            by_partition.setdefault(partition, []).append(entry_id)
        for partition, partition_ids in by_partition.items():
            index = state.partitions.get(partition)
            if index is not None:
                index.remove(partition_ids)
                if not len(index):
                    del state.partitions[partition]

    def _purge_expired(self, team: str, now: float) -> None:
        """At most DELETES_PER_HOLD of the team's expired entries; later stores take the rest (lookups
        never return an expired entry)."""
        rows = self._writer.execute("SELECT id FROM entries WHERE team = ? AND expires_at <= ? LIMIT ?",
                                    (team, now, DELETES_PER_HOLD)).fetchall()
        self._delete(team, [row[0] for row in rows])

    def _enforce_caps(self, team: str, limits: TeamLimits) -> None:
        """Evict least recently used entries until the team is within both caps (never its last one),
        at most DELETES_PER_HOLD a store, chosen by one read: later stores evict the rest. One entry
        went per statement while the team's bytes were over, and every entry over a lowered
        `max_entries` in one hold, on the loop every team's requests share."""
        with self._lock:
            state = self._team(team)
            count, size = len(state.located), state.bytes
        victims: list[int] = []
        if count > limits.max_entries or size > limits.max_bytes:
            for entry_id, entry_size in self._writer.execute("SELECT id, size FROM entries WHERE team = ? ORDER BY last_used_at, id LIMIT ?",
                                                         (team, DELETES_PER_HOLD)).fetchall():
                if count <= 1 or (count <= limits.max_entries and size <= limits.max_bytes):
                    break
                victims.append(entry_id)
                count, size = count - 1, size - entry_size
        self._delete(team, victims)

    def _forget_other_space(self, space: str) -> None:
        """Embeddings from another model are not comparable with this one's: such entries keep their exact tier only."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'embedding_space'").fetchone()
        if row is not None and row[0] != space:
            self._db.execute("UPDATE entries SET embedding = NULL WHERE embedding IS NOT NULL")
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('embedding_space', ?)", (space,))

    def _load(self) -> None:
        self._db.execute("DELETE FROM entries WHERE expires_at <= ?", (self.clock(),))
        rows = self._db.execute("SELECT id, team, partition, embedding, size FROM entries ORDER BY id").fetchall()
        for entry_id, team, partition, blob, size in rows:
            self._remember(team, entry_id, partition, blob, size)
        for team, state in list(self._teams.items()):
            for partition in list(state.partitions):
                if (index := self._due(team, partition)) is not None:
                    self._approximate(team, partition, index)


def _born_after(now: float, max_age_s: float | None) -> float:
    """The oldest creation time a lookup takes (0: any, within its own expiry)."""
    return now - max_age_s if max_age_s is not None else 0.0
