"""The SQLite response store's schema and statements (sdk/responses/sqlite_store.py runs them)."""

from __future__ import annotations

from collections.abc import Iterator


def id_slices(ids: list[str], size: int = 500) -> Iterator[list[str]]:
    """`ids` in slices SQLite takes as one statement's variables (at most 32,766; 999 before 3.32):
    300,000 item references in one `IN (...)` failed the request with a 500."""
    for start in range(0, len(ids), size):
        yield ids[start:start + size]


def runs_by_bytes(sized: list[tuple[str, int]], budget: int) -> Iterator[list[str]]:
    """Ids in order, in runs of about `budget` bytes (a run holds at least one)."""
    part: list[str] = []
    size = 0
    for rid, bytes_ in sized:
        if part and size + bytes_ > budget:
            yield part
            part, size = [], 0
        part.append(rid)
        size += bytes_
    if part:
        yield part



SCHEMA = """
CREATE TABLE IF NOT EXISTS stored_responses (
    team TEXT NOT NULL,
    id TEXT NOT NULL,
    previous TEXT,
    provider TEXT NOT NULL,
    native INTEGER NOT NULL,
    created_at REAL NOT NULL,
    touched_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    depth INTEGER NOT NULL,
    size INTEGER NOT NULL,
    chain_bytes INTEGER NOT NULL,
    input BLOB NOT NULL,
    response BLOB NOT NULL,
    PRIMARY KEY (team, id)
);
CREATE INDEX IF NOT EXISTS stored_responses_lru ON stored_responses (team, touched_at, depth);
CREATE INDEX IF NOT EXISTS stored_responses_expiry ON stored_responses (expires_at);
CREATE TABLE IF NOT EXISTS stored_response_items (
    team TEXT NOT NULL,
    item_id TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (team, item_id)
);
CREATE INDEX IF NOT EXISTS stored_response_items_owner ON stored_response_items (team, response_id);
-- Each team's count and bytes, kept by the database itself on every insert and delete: the quota
-- check of every put reads one row instead of summing the team's records (at 3,000 records that
-- sum was two thirds of a put, and a put holds the store's one connection).
CREATE TABLE IF NOT EXISTS stored_response_totals (
    team TEXT PRIMARY KEY,
    count INTEGER NOT NULL,
    size INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS stored_responses_counted AFTER INSERT ON stored_responses BEGIN
    INSERT INTO stored_response_totals VALUES (NEW.team, 1, NEW.size)
        ON CONFLICT (team) DO UPDATE SET count = count + 1, size = size + NEW.size;
END;
CREATE TRIGGER IF NOT EXISTS stored_responses_uncounted AFTER DELETE ON stored_responses BEGIN
    UPDATE stored_response_totals SET count = count - 1, size = size - OLD.size WHERE team = OLD.team;
END;
"""
# Run at open: a file written before the totals existed (or by an older version) starts right.
RECOUNT = """
BEGIN IMMEDIATE;
DELETE FROM stored_response_totals;
INSERT INTO stored_response_totals SELECT team, COUNT(*), SUM(size) FROM stored_responses GROUP BY team;
COMMIT;
"""
INSERT = "INSERT INTO stored_responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
COLUMNS = "id, team, provider, native, created_at, input, response, previous, depth, chain_bytes"
CHAIN = """
WITH RECURSIVE chain(id, n) AS (
    SELECT ?, 0
    UNION ALL
    SELECT r.previous, chain.n + 1 FROM stored_responses r JOIN chain ON r.team = ? AND r.id = chain.id
    WHERE r.previous IS NOT NULL AND r.expires_at >= ? AND chain.n < ?
)
SELECT %s FROM chain JOIN stored_responses r ON r.team = ? AND r.id = chain.id AND r.expires_at >= ? ORDER BY chain.n
"""
CHAIN_SIZES = CHAIN % "r.id, r.size"  # newest first; parameters: id, team, now, most steps back, team, now
CHAIN_PREVIOUS = CHAIN % "r.id, r.previous"
