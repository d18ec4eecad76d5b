"""Who is asking: the team a request runs for, and the id of the key that sent it.

The proxy looks the team key up in its `TeamRegistry` (`KeyedTeams`); the drop-in SDK runs its own
policy's team in the application's process, where there is no team key to check (`OneTeam`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol as TypingProtocol

from sdk.door.call import Call
from sdk.errors import AuthenticationError
from sdk.runtime import TeamRegistry, TeamRuntime


class Teams(TypingProtocol):
    def authenticate(self, call: Call) -> tuple[TeamRuntime, str]:
        """The caller's team and key id (a digest prefix, never the key); `AuthenticationError` (401) otherwise."""
        ...


# (reason, source, path) of a refused key: "two_keys", "invalid" or "missing", the peer, the path.
Refused = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True)
class KeyedTeams:
    """The proxy's teams: a team key looked up in the registry (SHA-256, then a constant-time compare).
    A missing, unknown or doubled key is reported to `refused` (the gateway counts it and logs it,
    rate-limited per client address) before it is refused."""

    registry: TeamRegistry
    refused: Refused

    def authenticate(self, call: Call) -> tuple[TeamRuntime, str]:
        # The team key from `x-api-key` or `Authorization: Bearer`. An empty value is no key (it
        # must not hide a valid one in the other header); two different keys are refused, never one
        # picked. (Read here, not in a helper: this runs for every request.)
        found: str | None = None
        for name, value in call.headers:
            if name == b"x-api-key":
                key = value.decode("latin-1").strip()
            elif name == b"authorization" and value[:7].lower() == b"bearer ":
                key = value[7:].decode("latin-1").strip()
            else:
                continue
            if key and found is not None and key != found:
                self.refused("two_keys", call.peer(), call.path)
                raise AuthenticationError("two different team keys in one request: send one key, in one header")
            found = key or found
        try:
            return self.registry.authenticate(found)
        except AuthenticationError:
            self.refused("invalid" if found else "missing", call.peer(), call.path)
            raise


@dataclass(frozen=True, slots=True)
class OneTeam:
    """The drop-in SDK's team: the client's own policy, in the application's process. Whatever key
    the official client sends (a placeholder) is not a team key; per-key limits see one key, ""."""

    team: TeamRuntime

    def authenticate(self, call: Call) -> tuple[TeamRuntime, str]:
        return self.team, ""
