"""Who owns a provider object: files, batches and message batches created through the gateway.

Teams that share one provider key share one provider account, so the provider cannot tell their
objects apart: the gateway records the creating team of each object it saw created and checks it
on every later read, download, list, delete, cancel and use (sdk/passthrough/). A record is a name
(`KIND:ID`) holding a value (the team, or for a batch's output file the batch that made it), kept
`KEEP_S`; an object the gateway has no record of is nobody's, so it answers as not found.

A file is also used by naming it inside a request that runs a model (a chat `file` part, a
Responses `input_file` or `input_image`, an Anthropic `source` of type `file`, a code interpreter's
`file_ids`, the image generation tool's `input_image_mask`): the provider reads it with the shared
key, so `referenced_files` finds those ids in a body and each must be the team's
(`Ownership.check_files`) before the request is sent.

Other objects on the provider account are named the same way but never created through the gateway
(it serves no vector store, conversation, container, stored prompt or skill endpoint): whoever made
them did so with the provider key itself, for some team, and the gateway cannot tell for which. A
request may name one (`account_objects`) only when the team's policy lists its id under
`provider_objects` (`check_account_objects`); `"*"` there is for a team whose provider account is
its own.

Where records live follows the state backend: for `LocalState`, a SQLite file under the data
directory (`owners.sqlite3`), so a restarted proxy and every worker of `--workers N --local-state`
on the host know them (in process memory, a restart forgot every object created before it, a
24-hour batch's results included, and each worker knew only what it had created); in Redis next to
the limits for a shared backend, so every replica agrees. While Redis is away a replica writes and
reads its own records in memory (it still knows what it created meanwhile; the other replicas do not).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from sdk.errors import InvalidRequestError, NotFoundError
from sdk.offload import off_loop, off_loop_if_large
from sdk.policy import FINE_TUNED
from sdk.services import default_data_dir
from sdk.state.backend import SpendRecord, StateBackend

MISSING_FILE = "No such File object: {}"  # what the provider answers for a file it does not have
# Names looked up in one pipelined call. A list page can hold 10,000 rows (OpenAI's files list): asked
# in one call, their owners took 50-250 ms, past the store's timeout (100 ms by default), and the
# guard then put the whole replica, every team, on local state. 256 take about 2 ms.
LOOKUP_CHUNK = 256
MAX_NAMED_FILES = 10_000  # distinct files one request may name (each is looked up: 40 calls at most)
KEEP_S = 400 * 86_400  # longer than any provider keeps an object it did not get a delete for


class Records(Protocol):
    async def put(self, records: Mapping[str, str], keep_s: float) -> None: ...

    async def get(self, names: Sequence[str]) -> list[str | None]: ...

    async def delete(self, names: Sequence[str]) -> None: ...

    async def claim(self, name: str, keep_s: float) -> bool:
        """Take `name` for `keep_s` if no one holds it: True for exactly one caller (per host without
        Redis, across replicas with it), however many ask at once."""
        ...


class LocalRecords:
    """Records in this process (no expiry: a process does not live `KEEP_S`): a replica's while Redis is away."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    async def put(self, records: Mapping[str, str], keep_s: float) -> None:
        self._values.update(records)

    async def get(self, names: Sequence[str]) -> list[str | None]:
        return [self._values.get(name) for name in names]

    async def delete(self, names: Sequence[str]) -> None:
        for name in names:
            self._values.pop(name, None)

    async def claim(self, name: str, keep_s: float) -> bool:
        if name in self._values:
            return False
        self._values[name] = "claimed"
        return True


class SQLiteRecords:
    """Records in a SQLite file (WAL: the workers of one host read it at once), each with its expiry.
    Calls run in the heavy-work pool: a write of another process may hold the file for a moment."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (name TEXT PRIMARY KEY, value TEXT NOT NULL, expires REAL NOT NULL)")
        # The expired go at the first call, in the heavy-work pool: a scan of every team's records (each
        # file, batch and spoken answer's audio id, kept 400 days), which ran where the records were
        # opened, on the event loop every team's requests share at the first request after a start.
        self._swept = False

    def _sweep_once(self) -> None:
        """(Holding `_lock`.) The expired records deleted, once."""
        if not self._swept:
            self._db.execute("DELETE FROM records WHERE expires < ?", (time.time(),))
            self._swept = True

    async def put(self, records: Mapping[str, str], keep_s: float) -> None:
        rows = [(name, value, time.time() + keep_s) for name, value in records.items()]
        await off_loop(self._write, "INSERT INTO records VALUES (?, ?, ?) "
                                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value, expires = excluded.expires", rows)

    async def get(self, names: Sequence[str]) -> list[str | None]:
        return await off_loop(self._get, list(names), time.time())

    async def delete(self, names: Sequence[str]) -> None:
        await off_loop(self._write, "DELETE FROM records WHERE name = ?", [(name,) for name in names])

    async def claim(self, name: str, keep_s: float) -> bool:
        return await off_loop(self._claim, name, time.time(), keep_s)

    def _claim(self, name: str, now: float, keep_s: float) -> bool:
        with self._lock:  # one statement: the file's write lock decides between the workers
            self._sweep_once()
            taken = self._db.execute("INSERT INTO records VALUES (?, 'claimed', ?) ON CONFLICT (name) DO UPDATE "
                                     "SET value = excluded.value, expires = excluded.expires WHERE records.expires <= ?",
                                     (name, now + keep_s, now))
            return taken.rowcount == 1

    def _write(self, statement: str, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            self._sweep_once()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(statement, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _get(self, names: list[str], now: float) -> list[str | None]:
        found: dict[str, str] = {}
        with self._lock:
            self._sweep_once()
            for start in range(0, len(names), LOOKUP_CHUNK):
                part = names[start:start + LOOKUP_CHUNK]
                marks = ", ".join("?" * len(part))
                found.update(self._db.execute(f"SELECT name, value FROM records WHERE expires > ? AND name IN ({marks})",
                                              (now, *part)).fetchall())
        return [found.get(name) for name in names]


class SharedRecords:
    """Records in the shared store (`PREFIX:own:NAME`, one key each with its expiry); what a
    replica writes while the store is unreachable it keeps locally, and reads there."""

    def __init__(self, state: StateBackend, local: LocalRecords):
        from sdk.state.guard import DOWN, GuardedState

        assert isinstance(state, GuardedState)
        self._guard, self._down, self._local = state, DOWN, local

    def _key(self, name: str) -> str:
        return self._guard.shared.key(f"own:{name}")

    async def put(self, records: Mapping[str, str], keep_s: float) -> None:
        client = self._guard.shared.client
        commands = [("SET", self._key(name), value, "EX", int(keep_s)) for name, value in records.items()]
        if await self._guard.try_shared(lambda: client.pipeline(commands)) is self._down:
            await self._local.put(records, keep_s)  # this replica still knows what it created meanwhile

    async def get(self, names: Sequence[str]) -> list[str | None]:
        local = await self._local.get(names)
        client = self._guard.shared.client
        shared: list[object] = []
        for start in range(0, len(names), LOOKUP_CHUNK):  # each call well within the store's timeout
            # one GET each, pipelined (not MGET: on a Redis Cluster the names hash to different slots)
            commands = [("GET", self._key(n)) for n in names[start:start + LOOKUP_CHUNK]]
            got = await self._guard.try_shared(functools.partial(client.pipeline, commands))
            if not isinstance(got, list):  # unreachable: what this replica created while it was
                return local
            shared += got
        return [value.decode() if isinstance(value, bytes) else mine for value, mine in zip(shared, local, strict=True)]

    async def delete(self, names: Sequence[str]) -> None:
        await self._local.delete(names)
        client = self._guard.shared.client
        await self._guard.try_shared(lambda: client.pipeline([("DEL", self._key(n)) for n in names]))

    async def claim(self, name: str, keep_s: float) -> bool:
        return await self._guard.claim(name, keep_s)  # SET NX; while Redis is away, this replica's own


class Ownership:
    """Teams' objects by kind: `file`, `batch`, `message_batch`; and which batch made an output file."""

    def __init__(self, records: Records):
        self.records = records

    async def own(self, team: str, kind: str, ids: Iterable[str]) -> None:
        records = {f"{kind}:{object_id}": team for object_id in ids}
        if records:
            await self.records.put(records, KEEP_S)

    async def is_owner(self, team: str, kind: str, object_id: str) -> bool:
        return (await self.records.get([f"{kind}:{object_id}"]))[0] == team

    async def owned(self, team: str, kind: str, ids: Sequence[str]) -> set[str]:
        """Which of `ids` the team owns (one round trip)."""
        if not ids:
            return set()
        values = await self.records.get([f"{kind}:{object_id}" for object_id in ids])
        return {object_id for object_id, value in zip(ids, values, strict=True) if value == team}

    async def claim(self, name: str, keep_s: float = KEEP_S) -> bool:
        """Whether this caller is the one to do what `name` stands for (a batch's results charged once):
        decided where the records are, so every worker of a host, every replica and a restarted
        proxy agree (a state backend without Redis keeps its claims in its process's memory)."""
        return await self.records.claim(name, keep_s)

    async def disown(self, kind: str, object_id: str) -> None:
        await self.records.delete([f"{kind}:{object_id}"])

    async def note_outputs(self, team: str, batch_id: str, file_ids: Sequence[str]) -> None:
        """A batch's output and error files: the team's, and priced at batch rates when read."""
        records = {f"file:{fid}": team for fid in file_ids} | {f"output:{fid}": batch_id for fid in file_ids}
        if records:
            await self.records.put(records, KEEP_S)

    async def check_files(self, team: str, bodies: Sequence[Any], size: int) -> None:
        """Refuse, with the provider's 404 for a file it does not have, request bodies that name a
        file the team does not own (`referenced_files`); `size` is their bytes, and large ones are
        read in the heavy-work pool. At most MAX_NAMED_FILES distinct files (a 400 beyond): each is
        a lookup in the store every team shares."""
        named = await off_loop_if_large(size, _named_files, bodies)
        if not named:
            return
        if len(named) > MAX_NAMED_FILES:
            raise InvalidRequestError(f"the request names {len(named)} distinct files; at most {MAX_NAMED_FILES} distinct files "
                                      "are checked for one request")
        owned = await self.owned(team, "file", named)
        missing = next((fid for fid in named if fid not in owned), None)
        if missing is not None:
            raise NotFoundError(MISSING_FILE.format(missing))

    async def note_batch_charge(self, team: str, batch_id: str, charged: SpendRecord) -> None:
        """What a budgeted team's batch was charged when created (LimitsStage.charge_created_batch),
        kept beside its owner for whichever worker or replica later reads its results."""
        record = {"usd": charged.usd, "records": charged.records, "fields": charged.fields}
        await self.records.put({f"batch-charge:{team}:{batch_id}": orjson.dumps(record).decode()}, KEEP_S)

    async def batch_charge(self, team: str, batch_id: str) -> SpendRecord | None:
        """The creation charge `note_batch_charge` kept for the team's batch, if any (a team without a
        budget is charged nothing when it creates one)."""
        found = (await self.records.get([f"batch-charge:{team}:{batch_id}"]))[0]
        if found is None:
            return None
        record = orjson.loads(found)
        return SpendRecord(float(record["usd"]), tuple((str(key), float(keep)) for key, keep in record["records"]),
                           tuple(str(name) for name in record["fields"]))

    async def file(self, team: str, file_id: str) -> tuple[bool, str | None]:
        """(whether the team owns the file, the batch it is an output of, if any) in one round trip."""
        owner, batch = await self.records.get([f"file:{file_id}", f"output:{file_id}"])
        return owner == team, batch


_FILE_PARTS = frozenset({"file", "input_file", "input_image", "container_upload"})  # parts naming a file by `file_id`
_FREE_FORM = frozenset({"parameters", "input_schema", "schema", "json_schema", "metadata", "arguments"})  # the client's own JSON


def _named_files(bodies: Sequence[Any]) -> list[str]:
    return list(dict.fromkeys(fid for body in bodies if _may_name_files(body) for fid in referenced_files(body)))


def _may_name_files(body: Any) -> bool:
    """Whether `referenced_files` can find anything: every form it reads names ids under a
    `file_id` or `file_ids` key, and orjson writes keys as they are (a client's escaped key is
    decoded by then). Serialising takes microseconds where the walk takes about one per JSON
    object, and most requests name no file (a 20-turn chat with tools: ~180 us walked)."""
    try:
        return b'"file_id' in orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):  # an integer past 64 bits: walk it
        return True


def names_files(body: Any) -> bool:
    """Whether a request body makes the provider read a file it holds by id (`referenced_files`)."""
    return _may_name_files(body) and bool(referenced_files(body))


def referenced_files(body: Any) -> list[str]:
    """The provider file ids a request body makes the provider read, wherever the wire formats put
    them: a Chat Completions `{"type": "file", "file": {"file_id"}}` part, a Responses `input_file` /
    `input_image` part, an Anthropic `{"type": "file", "file_id"}` source or `container_upload`
    block, a tool's `container.file_ids` (code interpreter) and the image generation tool's
    `input_image_mask.file_id` (the mask it edits through). Tool schemas, tool-call inputs and
    metadata are the client's own JSON and are not read."""
    found: list[str] = []
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
            continue
        if not isinstance(value, dict):
            continue
        kind = value.get("type")
        kind = kind if isinstance(kind, str) else ""  # any JSON value may stand there (a list is unhashable)
        if kind in _FILE_PARTS:
            inner = value.get("file")  # Chat Completions nests it: {"type": "file", "file": {"file_id"}}
            named: dict[str, Any] = inner if kind == "file" and isinstance(inner, dict) else value
            if isinstance(file_id := named.get("file_id"), str):
                found.append(file_id)
        ids = value.get("file_ids")
        if isinstance(ids, list):
            found += [fid for fid in ids if isinstance(fid, str)]
        mask = value.get("input_image_mask")  # a typeless object: the provider reads the file as the edit's mask
        if isinstance(mask, dict) and isinstance(mask_id := mask.get("file_id"), str):
            found.append(mask_id)
        tool_call = kind.endswith("tool_use")  # its `input` is the model's arguments
        stack.extend(v for k, v in value.items() if isinstance(v, (dict, list)) and k not in _FREE_FORM
                     and not (tool_call and k == "input"))
    return found


def account_objects(body: Any) -> list[tuple[str, str]]:
    """(kind, id) of each provider-account object a model request names and the gateway does not
    create: a Responses `conversation` (an id, or `{"id"}`) and stored `prompt` (`{"id"}`), a
    file_search tool's `vector_store_ids`, a code interpreter's or Anthropic's `container` (an id, or
    `{"id"}`), an Anthropic container's custom `skills`, the hosted shell tool's `environment` (an
    existing container it reuses, the skills it mounts), and a fine-tuned `model` (`ft:…`). They are
    request fields and tool fields, never message content, so only those places are read."""
    if not isinstance(body, dict):
        return []
    found: list[tuple[str, str]] = []
    model = body.get("model")
    if isinstance(model, str) and model.startswith(FINE_TUNED):
        found.append(("fine-tuned model", model))
    conversation = body.get("conversation")
    conversation = conversation.get("id") if isinstance(conversation, dict) else conversation
    if isinstance(conversation, str):
        found.append(("conversation", conversation))
    prompt = body.get("prompt")  # a legacy completion's prompt is text, not an object
    if isinstance(prompt, dict) and isinstance(prompt_id := prompt.get("id"), str):
        found.append(("prompt", prompt_id))
    found += _containers(body.get("container"))
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            stores = tool.get("vector_store_ids")
            found += [("vector store", store) for store in stores if isinstance(store, str)] if isinstance(stores, list) else []
            found += _containers(tool.get("container"))
            found += _environment(tool.get("environment"))
    return found


def _environment(environment: Any) -> list[tuple[str, str]]:
    """The hosted shell tool's environment (OpenAI's `shell` tool): an existing container it runs in
    (`{"type": "container_reference", "container_id"}`: its files and state are whoever made it), and
    the skills it mounts by id (`{"type": "skill_reference", "skill_id"}`; an inline bundle is the
    request's own). A new container's `file_ids` are files, checked as files."""
    if not isinstance(environment, dict):
        return []
    found = [("container", environment["container_id"])] if isinstance(environment.get("container_id"), str) else []
    skills = environment.get("skills")
    for skill in skills if isinstance(skills, list) else ():
        if isinstance(skill, dict) and skill.get("type") == "skill_reference" and isinstance(skill_id := skill.get("skill_id"), str):
            found.append(("skill", skill_id))
    return found


def _containers(container: Any) -> list[tuple[str, str]]:
    """A container named by id (`{"type": "auto", "file_ids"}` makes a new one: its files are checked
    as files), and the custom skills loaded into one (Anthropic's own skills are everyone's)."""
    if isinstance(container, str):
        return [("container", container)]
    if not isinstance(container, dict):
        return []
    found = [("container", container["id"])] if isinstance(container.get("id"), str) else []
    skills = container.get("skills")
    for skill in skills if isinstance(skills, list) else ():
        if isinstance(skill, dict) and skill.get("type") != "anthropic" and isinstance(skill_id := skill.get("skill_id"), str):
            found.append(("skill", skill_id))
    return found


def check_account_objects(listed: frozenset[str], bodies: Iterable[Any]) -> None:
    """Refuse, as not found, request bodies naming a provider-account object (`account_objects`) whose
    id the team's policy does not list under `provider_objects` (`*` lists every one)."""
    if "*" in listed:
        return
    for body in bodies:
        for kind, object_id in account_objects(body):
            if object_id not in listed:
                raise NotFoundError(f"No {kind} '{object_id}' for this team: an object on the provider account that "
                                    "Slipstream did not create is usable only when the team's policy lists it under "
                                    "provider_objects")


_DURING_OUTAGES = LocalRecords()  # one per process: what its replicas created while Redis was away


@functools.cache
def _on_this_host(path: Path) -> SQLiteRecords:
    return SQLiteRecords(path)
_by_state: weakref.WeakKeyDictionary[StateBackend, Ownership] = weakref.WeakKeyDictionary()


def ownership_of(state: StateBackend) -> Ownership:
    """The ownership records that go with a state backend."""
    found = _by_state.get(state)
    if found is None:
        records: Records = (_on_this_host(default_data_dir() / "owners.sqlite3") if state.kind == "local"
                            else SharedRecords(state, _DURING_OUTAGES))
        found = _by_state[state] = Ownership(records)
    return found


def records_of(state: StateBackend) -> Records:
    """The records that go with a state backend, for anything else every worker and replica must
    agree on beyond a restart (the status page's revoked sessions, gateway/ui/auth.py)."""
    return ownership_of(state).records
