"""The proxy's door for pass-through endpoints (sdk/passthrough/): files, batches, completions.

Raw ASGI, like the pipeline's door (gateway/proxy.py); every check is sdk/passthrough/'s, the
same for the drop-in SDK. The request body is handed upstream as it arrives from the client (`receive` is read piece by piece while the upstream write keeps up),
and the answer's body is sent on chunk by chunk, so neither side is ever held whole in memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.proxy import ClientGone, Receive, Scope, Send, authenticate, send_error, watch_disconnect
from sdk.errors import SlipstreamError
from sdk.passthrough import Door, Passed, family, forward
from sdk.runtime import TeamRegistry

log = logging.getLogger("slipstream.passthrough")


async def _received(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


def _origin(scope: Scope, headers: dict[str, str]) -> str:
    """The gateway's URL as this client reached it: where a batch's `results_url` must point."""
    host = headers.get("host") or "{}:{}".format(*(scope.get("server") or ("127.0.0.1", 80)))
    return f"{scope.get('scheme', 'http')}://{host}"


def make_passthrough_handler(registry: TeamRegistry) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        raw_path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        found = family(raw_path)
        assert found is not None, raw_path  # mounted on these prefixes only
        protocol = found[0]
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        length_header = headers.get("content-length", "")
        length = int(length_header) if length_header.isdigit() else None
        streamed = length is None and "chunked" in headers.get("transfer-encoding", "")
        task = asyncio.current_task()
        assert task is not None
        watcher: asyncio.Task[None] | None = None
        passed: Passed | None = None
        try:
            team, key_id = authenticate(registry, scope)  # a bad key is counted and logged, as on the pipeline
            body = _received(receive) if length or streamed else b""
            passed = await forward(team, scope["method"], raw_path, scope.get("query_string", b"").decode("latin-1"),
                                   headers, body, length, Door(_origin(scope, headers), key_id))
            watcher = asyncio.get_running_loop().create_task(watch_disconnect(receive, task))
            response_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in passed.headers]
            await send({"type": "http.response.start", "status": passed.status, "headers": response_headers})
            async for chunk in passed.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            passed = None  # read to the end: its connection went back to the pool
        except ClientGone:
            return
        except asyncio.CancelledError:
            if watcher is not None and watcher.done() and not watcher.cancelled():
                task.uncancel()  # the client left: the upstream connection is dropped below
                return
            raise
        except SlipstreamError as exc:
            if passed is None:
                await send_error(send, protocol, exc.status, exc.body(protocol), exc.headers)
            else:  # after the headers: the response is left incomplete, so the server drops the connection
                log.warning("pass-through %s %s failed mid-answer: %s", scope["method"], raw_path, exc)
        finally:
            if watcher is not None:
                watcher.cancel()
            if passed is not None:
                passed.abort()

    return handle
