"""Which pass-through operation a request is, and what of the client's request may go upstream.

A path is matched against the operations the pass-through serves (files, batches, message
batches, legacy completions), segment by segment, on the path as the client wrote it. Dot
segments, empty segments, backslashes and any percent-encoding are refused before anything is
sent: no id the providers issue needs them, and an upstream that normalizes `..` or decodes
`%2f` would otherwise be sent somewhere else with the provider key
(`/v1/files/../chat/completions`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sdk.errors import InvalidRequestError, NotFoundError, SlipstreamError
from sdk.types import Protocol

# (path prefix, provider kind, family label for metrics and the access log, kind of object it holds)
_FAMILIES = (
    ("/v1/completions", Protocol.OPENAI, "completions", ""),
    ("/v1/batches", Protocol.OPENAI, "batches", "batch"),
    ("/v1/files", Protocol.OPENAI, "files", "file"),
    ("/v1/messages/batches", Protocol.ANTHROPIC, "messages_batches", "message_batch"),
)
PREFIXES = tuple(prefix for prefix, *_ in _FAMILIES)
# (family, sub-path shape) → {method: action}; "ID" stands for one object id
_ACTIONS: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {
    ("completions", ()): {"POST": "complete"},
    ("files", ()): {"GET": "list", "POST": "create"},
    ("files", ("ID",)): {"GET": "retrieve", "DELETE": "delete"},
    ("files", ("ID", "content")): {"GET": "content"},
    ("batches", ()): {"GET": "list", "POST": "create"},
    ("batches", ("ID",)): {"GET": "retrieve"},
    ("batches", ("ID", "cancel")): {"POST": "cancel"},
    ("messages_batches", ()): {"GET": "list", "POST": "create"},
    ("messages_batches", ("ID",)): {"GET": "retrieve", "DELETE": "delete"},
    ("messages_batches", ("ID", "cancel")): {"POST": "cancel"},
    ("messages_batches", ("ID", "results")): {"GET": "results"},
}
_ID = re.compile(r"[A-Za-z0-9_-]{1,200}")

# Not forwarded upstream: framing and connection state (the upstream client sets its own; `expect`
# would make the provider send an interim 100 the client never asked it for), the team's
# credentials, headers that name the client's own account or Slipstream, and what a proxy in front
# says about the client (`forwarded`, `via`, `x-forwarded-*`, `x-real-ip`): none of it is the
# provider's business.
_DROP_REQUEST = frozenset({
    "host", "authorization", "x-api-key", "content-length", "transfer-encoding", "connection", "keep-alive",
    "proxy-connection", "te", "trailer", "upgrade", "proxy-authorization", "expect", "accept-encoding", "cookie",
    "openai-organization", "openai-project", "forwarded", "via", "x-real-ip",
})
_DROP_PREFIXES = ("x-slipstream-", "x-forwarded-")


@dataclass(frozen=True, slots=True)
class Operation:
    family: str  # completions | files | batches | messages_batches
    protocol: Protocol  # the provider kind it goes to, and the shape of its errors
    kind: str  # the kind of object the family holds ("" for completions)
    action: str  # complete | list | create | retrieve | delete | content | cancel | results
    object_id: str = ""
    upstream_path: str = ""  # the path below the provider's base_url

    @property
    def spends(self) -> bool:
        """Whether it runs a model (checked against routes and the budget)."""
        return self.action == "complete" or (self.action == "create" and self.kind in ("batch", "message_batch"))


def family(path: str) -> tuple[Protocol, str] | None:
    """The provider kind and family of a pass-through path, or None when it is not one."""
    for prefix, protocol, name, _ in _FAMILIES:
        if path == prefix or path.startswith(prefix + "/"):
            return protocol, name
    return None


def operation(method: str, raw_path: str) -> Operation:
    """The operation `method raw_path` asks for; raises the provider-shaped 400 (traversal), 404
    (no such endpoint) or 405 (wrong method)."""
    found = next((entry for entry in _FAMILIES if raw_path == entry[0] or raw_path.startswith(entry[0] + "/")), None)
    if found is None:
        raise NotFoundError(f"{method} {raw_path} is not an endpoint Slipstream serves")
    prefix, protocol, name, kind = found
    rest = raw_path[len(prefix):].split("/")[1:]
    if "%" in raw_path or "\\" in raw_path or any(part in ("", ".", "..") for part in rest):
        raise InvalidRequestError(f"{raw_path!r}: dot segments, empty segments and percent-encoding are not allowed in "
                                  "this path; send the object's id as the provider issued it")
    shape = tuple("ID" if i == 0 else part for i, part in enumerate(rest))
    actions = _ACTIONS.get((name, shape))
    if actions is None or (rest and not _ID.fullmatch(rest[0])):
        raise NotFoundError(f"{method} {raw_path} is not an endpoint Slipstream serves")
    action = actions.get(method)
    if action is None:
        raise SlipstreamError(f"{method} is not allowed on {raw_path}: use {' or '.join(actions)}", status=405)
    upstream = raw_path.removeprefix("/v1") if protocol is Protocol.OPENAI else raw_path  # OpenAI's base_url has /v1
    return Operation(name, protocol, kind, action, rest[0] if rest else "", upstream)


def upstream_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's headers that may go to the provider (names as sent, values unchanged)."""
    listed = {token.strip().lower() for name, value in headers.items() if name.lower() == "connection"
              for token in value.split(",")}  # hop-by-hop by the client's own declaration (RFC 9110 §7.6.1)
    return {name: value for name, value in headers.items()
            if (low := name.lower()) not in _DROP_REQUEST and low not in listed and not low.startswith(_DROP_PREFIXES)}
