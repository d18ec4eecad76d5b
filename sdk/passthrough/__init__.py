"""Pass-through endpoints: what a provider serves that the pipeline has nothing to decide on.

`/v1/completions`, `/v1/batches…` and `/v1/files…` go to the team's first `kind: openai` provider,
`/v1/messages/batches…` to its first `kind: anthropic` provider (policy order). The client's team
key is replaced by that provider's key; the method, path, query, body and the client's other
headers go as they came (hop-by-hop and account headers excepted), and the answer comes back as the
provider sent it. Bodies stream both ways: an upload is written upstream piece by piece as the
client sends it (bounded by `limits.max_upload_bytes`), never held whole in memory. One attempt, no
retries: a streamed body cannot be sent twice. Counted per team, provider and endpoint family, and,
with tracing on, one span per request (sdk/tracing/) whose `traceparent` goes upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass

from sdk import metrics, tracing
from sdk.errors import NotFoundError, RequestTooLargeError
from sdk.providers.base import HTTPProvider
from sdk.providers.upstream import UpstreamResponse, upstream_for_running_loop
from sdk.runtime import TeamRuntime
from sdk.tracing import Parent, RequestTrace
from sdk.types import Protocol

# (path prefix, provider kind, family label for metrics)
_FAMILIES = (
    ("/v1/completions", Protocol.OPENAI, "completions"),
    ("/v1/batches", Protocol.OPENAI, "batches"),
    ("/v1/files", Protocol.OPENAI, "files"),
    ("/v1/messages/batches", Protocol.ANTHROPIC, "messages_batches"),
)
PREFIXES = tuple(prefix for prefix, _, _ in _FAMILIES)
# Not forwarded upstream: framing and connection state (the upstream client sets its own), the
# team's credentials, and headers that name the client's own account or Slipstream.
_DROP_REQUEST = frozenset({
    "host", "authorization", "x-api-key", "content-length", "transfer-encoding", "connection", "keep-alive",
    "te", "trailer", "upgrade", "proxy-authorization", "accept-encoding", "cookie", "openai-organization", "openai-project",
})
_DROP_RESPONSE = frozenset({"connection", "keep-alive", "transfer-encoding", "set-cookie", "trailer", "upgrade"})


def family(path: str) -> tuple[Protocol, str] | None:
    """The provider kind and family of a pass-through path, or None when it is not one."""
    for prefix, protocol, name in _FAMILIES:
        if path == prefix or path.startswith(prefix + "/"):
            return protocol, name
    return None


@dataclass(slots=True)
class Passed:
    """The provider's answer: status, headers to send on, and the body as it arrives.

    Its trace span (when tracing is on) ends when the body has passed in full, or when it is aborted.
    """

    status: int
    headers: list[tuple[str, str]]
    response: UpstreamResponse
    trace: RequestTrace | None = None

    def body(self) -> AsyncIterator[bytes]:
        if self.trace is None:
            return self.response.iter_chunks()
        return self._traced_body()

    async def _traced_body(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.response.iter_chunks():
                yield chunk
        except (GeneratorExit, asyncio.CancelledError):
            tracing.end_passthrough(self.trace, "cancelled", self.status)
            raise
        except BaseException as exc:
            tracing.end_passthrough(self.trace, "failed", self.status, exc)
            raise
        tracing.end_passthrough(self.trace, "ok", self.status)

    def abort(self) -> None:
        self.response.abort()
        tracing.end_passthrough(self.trace, "cancelled", self.status)


def provider_for(team: TeamRuntime, protocol: Protocol) -> HTTPProvider:
    for name in team.policy.providers:
        provider = team.providers[name]
        if isinstance(provider, HTTPProvider) and provider.protocol is protocol:
            return provider
    raise NotFoundError(f"team {team.team} has no {protocol} provider with a key to pass this request to")


async def forward(team: TeamRuntime, method: str, raw_path: str, query: str, headers: Mapping[str, str],
                  body: bytes | AsyncIterable[bytes], length: int | None = None, caller: Parent | None = None) -> Passed:
    """Send one pass-through request upstream; `raw_path` as the client wrote it (still percent-encoded).
    `caller`: the application's current span, when the drop-in SDK forwards in process."""
    found = family(raw_path)
    assert found is not None, raw_path
    protocol, name = found
    provider = provider_for(team, protocol)
    limit = team.policy.limits.max_upload_bytes
    if length is not None and length > limit:
        raise RequestTooLargeError(f"upload of {length} bytes is over this team's limit of {limit} bytes")
    upstream_path = raw_path.removeprefix("/v1") if protocol is Protocol.OPENAI else raw_path  # OpenAI's base_url has /v1
    url = provider.base_url + upstream_path + (f"?{query}" if query else "")
    sent = {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST and not k.lower().startswith("x-slipstream-")}
    trace, sent = tracing.begin_passthrough(team.team, method, name, provider, sent, caller)
    sent = {**provider.dialect.auth(provider.keys.keys[provider.keys.order()[0]]), **sent}
    if not isinstance(body, bytes):
        body = _bounded(body, limit)
    client = provider.client or upstream_for_running_loop()
    started = time.perf_counter()
    try:
        response = await client.request(method, url, sent, body, provider.timeouts, length)
    except BaseException as exc:
        metrics.PASSTHROUGH.labels(team.team, provider.name, name, "error").inc()
        tracing.end_passthrough(trace, "failed", error=exc)
        raise
    metrics.PASSTHROUGH.labels(team.team, provider.name, name, str(response.status)).inc()
    metrics.PASSTHROUGH_SECONDS.labels(team.team, name).observe(time.perf_counter() - started)
    forwarded = [(k, v) for k, v in response.headers.items() if k not in _DROP_RESPONSE]
    forwarded.append(("x-slipstream-route", f"{provider.name}/{name}"))
    if trace is not None:
        trace.root.attributes["slipstream.route"] = f"{provider.name}/{name}"
    return Passed(response.status, forwarded, response, trace)


async def _bounded(body: AsyncIterable[bytes], limit: int) -> AsyncIterator[bytes]:
    size = 0
    async for piece in body:
        size += len(piece)
        if size > limit:
            raise RequestTooLargeError(f"upload is over this team's limit of {limit} bytes")
        yield piece
