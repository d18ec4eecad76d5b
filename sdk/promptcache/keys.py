"""Provider prompt-cache keys and salts that no other team can guess or reuse.

One organisation key serves every team, so the provider's prompt cache is shared by all of them.
OpenAI routes cached prefixes by `prompt_cache_key`: the gateway's own key is a keyed digest (HMAC-
SHA-256 with a server secret) of the team and its stable prefix, and a key the client sends is
replaced by a digest of (team, that key), so a team can neither guess another team's key nor send
it. End-user ids (`user`, `safety_identifier`, Anthropic's `metadata.user_id`) are namespaced the
same way: the provider's abuse detection reads them, and one account serves every team. `isolate`
goes further: a per-team salt line leads the cached prefix, so identical prompts from two teams
never share a provider cache entry (docs/prompt-cache.md, "Teams and the provider's cache").

The secret is `SLIPSTREAM_SECRET` when set (replicas on several hosts set the same value), else 32
random bytes created once under the data directory (`server-secret`, mode 0600), which every worker
on the host shares. Replicas with different secrets still answer correctly; they only send the same
prefix under different keys, so the provider caches it once per replica.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import logging
import os
import secrets
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdk.types import LLMRequest, Protocol

SECRET_ENV = "SLIPSTREAM_SECRET"
SECRET_BYTES = 32
_FILE = "server-secret"
_END_USER_FIELDS = ("user", "safety_identifier")  # OpenAI's names for the end user, read by its abuse detection
log = logging.getLogger("slipstream.prompt_cache")
_secret: bytes | None = None


def server_secret(data_dir: Path | None = None) -> bytes:
    """The server secret: $SLIPSTREAM_SECRET, else the data directory's (created on first use)."""
    global _secret
    if _secret is not None:
        return _secret
    value = os.environ.get(SECRET_ENV)
    if value:
        _secret = value.encode()
        return _secret
    from sdk.services import default_data_dir

    path = (data_dir or default_data_dir()) / _FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            _create(path)
        _secret = path.read_bytes()
        if len(_secret) < SECRET_BYTES:
            _secret = _repair(path)
    except OSError as exc:  # a read-only data directory: keys stay unguessable, only not stable across restarts
        log.warning("cannot keep the server secret under %s (%s): using one for this process only; set %s",
                    path.parent, type(exc).__name__, SECRET_ENV)
        _secret = secrets.token_bytes(SECRET_BYTES)
        return _secret
    if os.environ.get("SLIPSTREAM_STATE_URL"):
        log.warning("%s is not set: replicas on other hosts derive other prompt-cache keys (set the same %s on every replica)",
                    SECRET_ENV, SECRET_ENV)
    return _secret


def _create(path: Path) -> None:
    """Make `path` hold 32 random bytes unless another process made it first: the bytes are written to
    a file of their own, then linked at `path` (atomic, and refused when it exists), so the workers of
    `--workers N` starting together all read the same whole secret. Created in place (O_EXCL, then
    written), the file could be read by another worker between the two, empty: that worker keyed its
    digests with no secret, and so unlike the others."""
    spare = _spare_secret(path)
    try:
        os.link(spare, path)
    except FileExistsError:
        pass  # another process was first: its secret is every worker's
    finally:
        os.unlink(spare)


def _spare_secret(path: Path) -> str:
    """A new secret in a file of its own beside `path` (mode 0600), on disk before it is linked or
    moved into place: a crash leaves no empty secret."""
    fd, spare = tempfile.mkstemp(dir=path.parent, prefix=f".{_FILE}-")
    with os.fdopen(fd, "wb") as file:
        file.write(secrets.token_bytes(SECRET_BYTES))
        file.flush()
        os.fsync(file.fileno())
    return spare


def _repair(path: Path) -> bytes:
    """A secret file shorter than a secret (empty: left by a process that crashed between creating it
    and writing it, or by an older release's race) would key every digest with next to nothing, so
    every team's keys and user ids could be computed by anyone. It is replaced by a new secret once,
    under a lock every worker takes, and re-read: workers repairing together all read the same one."""
    with open(path.with_name(f".{_FILE}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (size := len(path.read_bytes())) < SECRET_BYTES:
            log.warning("the server secret under %s was %d bytes: replaced by a new one (provider prompt-cache keys "
                        "and end-user ids change once)", path.parent, size)
            os.replace(_spare_secret(path), path)
        return path.read_bytes()


def _digest(*parts: str, length: int = 32) -> str:
    return hmac.new(server_secret(), "\x00".join(parts).encode(), hashlib.sha256).hexdigest()[:length]


def gateway_key(team: str, prefix_digest: str) -> str:
    """The key the gateway sets when the client sent none: stable per (team, stable prefix), unguessable."""
    return f"slipstream-{_digest('gateway', team, prefix_digest)}"


def team_key(team: str, client_key: str) -> str:
    """A client's own key, namespaced to its team: the same key from another team lands elsewhere."""
    return f"team-{_digest('client', team, client_key)}"


def team_salt(team: str) -> str:
    """The line that leads an isolated team's cached prefix (about 12 cl100k tokens)."""
    return f"[cache scope {_digest('salt', team, length=16)}]"


def team_user(team: str, user_id: str) -> str:
    """An end user's id as the provider sees it (37 characters, within OpenAI's 64): namespaced to
    `team`, so one team's "alice" is not another's to the provider's abuse detection, and no team can
    send another's user id to have that user flagged; and a digest, so no email or name a client
    uses as its id leaves the gateway."""
    return f"user-{_digest('user', team, user_id)}"


def scoped_ids(body: dict[str, Any], team: str, protocol: Protocol) -> dict[str, Any]:
    """What a body tells the shared provider account about who sent it, namespaced to `team`: the
    fields to replace (none: an empty dict), for a client `prompt_cache_key` and the end user
    (OpenAI's `user` and `safety_identifier`, Anthropic's `metadata.user_id`)."""
    changes: dict[str, Any] = {}
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        changes["prompt_cache_key"] = team_key(team, key)
    if protocol is Protocol.OPENAI:
        for name in _END_USER_FIELDS:
            value = body.get(name)
            if isinstance(value, str) and value:
                changes[name] = team_user(team, value)
        return changes
    metadata = body.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(metadata, dict) and isinstance(user_id, str) and user_id:
        changes["metadata"] = {**metadata, "user_id": team_user(team, user_id)}  # the client's own dict stays as it was
    return changes


def with_team_ids(request: LLMRequest, team: str) -> LLMRequest:
    """`request` with its client `prompt_cache_key` and end-user ids namespaced to `team` (`scoped_ids`);
    the request itself when it names none, as most do."""
    changes = scoped_ids(request.body, team, request.endpoint.protocol)
    return replace(request, body={**request.body, **changes}) if changes else request


def salted(protocol: Protocol, body: dict[str, Any], team: str) -> dict[str, Any]:
    """`body` with the team's salt leading its system prompt (Anthropic: the first system block;
    OpenAI: a system message before the others), so its cached prefixes are the team's alone. The
    tools, which Anthropic caches ahead of the system prompt, are not salted (docs/prompt-cache.md)."""
    salt = team_salt(team)
    if protocol is Protocol.ANTHROPIC:
        system = body.get("system")
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) and system else list(system or [])
        return {**body, "system": [{"type": "text", "text": salt}, *blocks]}
    return {**body, "messages": [{"role": "system", "content": salt}, *(body.get("messages") or [])]}
