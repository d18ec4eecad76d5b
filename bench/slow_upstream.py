"""A plain thread-per-connection upstream (stdlib `http.server`) that waits before answering.

Real providers are slow and are not asyncio servers; this one answers every endpoint the overhead
benchmark sends (chat completions, embeddings, Responses, Anthropic messages) with a small canned
body of the provider's shape after `--delay-ms`. It is written the way such servers usually are:
`BaseHTTPRequestHandler` with its defaults (HTTP/1.0 unless `--http11`, headers and body written
with separate sends, Nagle left on unless `--nodelay`), because the point is to measure Slipstream
against upstreams it does not control.

    python bench/slow_upstream.py PORT [--delay-ms 5] [--http11] [--nodelay]
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_USAGE = {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20}
BODIES = {
    "/v1/chat/completions": {
        "id": "chatcmpl-slow", "object": "chat.completion", "created": 0, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there, friend."}, "finish_reason": "stop"}],
        "usage": _USAGE,
    },
    "/v1/embeddings": {
        "object": "list", "model": "text-embedding-3-small",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.01] * 256}],
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    },
    "/v1/responses": {
        "id": "resp_slow", "object": "response", "created_at": 0, "status": "completed", "model": "gpt-4o",
        "output": [{"type": "message", "id": "msg_slow", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hello there, friend.", "annotations": []}]}],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20},
    },
    "/v1/messages": {
        "id": "msg_slow", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
        "content": [{"type": "text", "text": "Hello there, friend."}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 8, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    },
}
ENCODED = {path: json.dumps(body).encode() for path, body in BODIES.items()}


def handler(delay_s: float, http11: bool, nodelay: bool) -> type[BaseHTTPRequestHandler]:
    class Slow(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if http11 else "HTTP/1.0"
        disable_nagle_algorithm = nodelay

        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = ENCODED.get(self.path.split("?")[0])
            time.sleep(delay_s)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - readiness probe
            self.send_response(200)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    return Slow


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--delay-ms", type=float, default=5.0)
    parser.add_argument("--http11", action="store_true", help="keep-alive (protocol_version HTTP/1.1)")
    parser.add_argument("--nodelay", action="store_true", help="TCP_NODELAY on accepted sockets")
    args = parser.parse_args()
    # The one setting changed from the stdlib's: a listen backlog of 5 overflows at concurrency 64 on
    # HTTP/1.0 (a connect per call), and the kernel then resets connections: that measures the
    # backlog, not the proxy. Production servers listen with backlogs in the hundreds.
    ThreadingHTTPServer.request_queue_size = 128
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.delay_ms / 1000, args.http11, args.nodelay))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
