"""The floor: a bare ASGI forwarder (no framework, no policy, no metrics) with aiohttp upstream.

Run by bench/proxy_overhead.py beside the real proxy, so the report can say how much of the added
latency any Python forwarder on this machine pays, and how much is Slipstream's own.

    python bench/bare_forwarder.py UPSTREAM_BASE_URL PORT
"""

from __future__ import annotations

import sys

import aiohttp
import uvicorn

UPSTREAM = sys.argv[1].rstrip("/")
session: aiohttp.ClientSession | None = None


async def app(scope, receive, send):
    global session
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if session is None:
        session = aiohttp.ClientSession()
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = {"content-type": "application/json", "authorization": "Bearer up"}
    async with session.post(UPSTREAM + scope["path"], data=body, headers=headers) as response:
        await send({"type": "http.response.start", "status": response.status, "headers": [(b"content-type", response.headers["content-type"].encode())]})
        async for chunk in response.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), loop="uvloop", http="httptools", log_level="warning", access_log=False)
