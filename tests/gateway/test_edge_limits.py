"""Issue 25, bounded work before authentication: a real proxy on 127.0.0.1, served by the server
`slipstream serve` runs (gateway/serving.py: httptools with the edge limits of gateway/edge.py), two
teams sharing one provider key on the emulator. Each test asserts on status codes, counters and log
records; the only time bounds are the PATIENCE_S limits that turn a hang into a failure.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway import refusals
from gateway.app import create_app
from gateway.edge import EdgeLimits
from gateway.refusals import AUTH_FAILURES, EDGE_REFUSALS, RateLimitedLog
from gateway.testing import RunningServer, free_port, running_proxy, running_redis, serve_in_thread
from tests.gateway.test_cli import ROOT, _command
from tests.helpers import PATIENCE_S, requires_extra, skip_without_redis, write_policy

KEY_A, KEY_B = "sk-edge-alpha", "sk-edge-beta"
ADMIN = "edge-admin-key"
HELLO = b'{"model": "gpt-4o", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}'
LIMITS = EdgeLimits(max_header_bytes=16 * 1024, max_headers=50, max_connections=64)
# Only the head-timeout tests run against a short timeout: on a loaded machine the test process can
# stall long enough between connect and send that a 1-second head timeout closed a prompt request.
SHORT_HEAD_TIMEOUT = EdgeLimits(header_timeout_s=2.0)


@pytest.fixture(scope="module")
def policies(tmp_path_factory, emulator) -> Path:
    directory = tmp_path_factory.mktemp("edge")
    write_policy(directory, "alpha", KEY_A, emulator.url, upstream_key="shared-org-key")
    write_policy(directory, "beta", KEY_B, emulator.url, upstream_key="shared-org-key")
    return directory


@pytest.fixture(scope="module")
def proxy(policies) -> Iterator[RunningServer]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLIPSTREAM_ADMIN_KEY", ADMIN)
        with running_proxy([policies], watch_interval_s=None, edge=LIMITS) as running:
            yield running


@pytest.fixture(scope="module")
def short_head_timeout(policies) -> Iterator[RunningServer]:
    with running_proxy([policies], watch_interval_s=None, edge=SHORT_HEAD_TIMEOUT) as running:
        yield running


def _edge(reason: str) -> float:
    return EDGE_REFUSALS.labels(reason)._value.get()


def _auth(door: str, reason: str) -> float:
    return AUTH_FAILURES.labels(door, reason)._value.get()


def _connect(proxy: RunningServer) -> socket.socket:
    port = int(proxy.url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    return sock


def _flood(sock: socket.socket, fill: bytes, most: int) -> int:
    """How many bytes of `fill` went out, 64 KiB at a time, before `most` or the proxy's close."""
    sent, chunk = 0, fill * 65536
    try:
        while sent < most:
            sock.sendall(chunk)
            sent += len(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def _read_all(sock: socket.socket) -> bytes:
    """What the server sent until it closed (a reset after the answer counts as the close)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _request_id(answer: bytes) -> str:
    """The x-slipstream-request-id of a raw answer (every answer names one, the edge's refusals too)."""
    head = answer.split(b"\r\n\r\n", 1)[0].decode()
    ids = [line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("x-slipstream-request-id:")]
    assert len(ids) == 1 and len(ids[0]) == 16, head
    return ids[0]


def _beta_answers(proxy: RunningServer) -> int:
    """Another team's authenticated request (its prompt-cache report: answered by the proxy itself)."""
    return httpx.get(f"{proxy.url}/v1/slipstream/cache-report", headers={"authorization": f"Bearer {KEY_B}"}, timeout=PATIENCE_S).status_code


# --- the head ---------------------------------------------------------------------------------------


def test_a_head_over_the_size_limit_is_431(proxy):
    before = _edge("header_too_large")
    with _connect(proxy) as sock:
        # Exactly one byte over, and no end of head: the server has read all of it when it answers.
        head = b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: "
        sock.sendall(head + b"a" * (LIMITS.max_header_bytes + 1 - len(head)))
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert b'"request_refused"' in answer
    assert _request_id(answer)
    assert _edge("header_too_large") == before + 1
    assert _beta_answers(proxy) == 200


def test_a_complete_head_over_the_size_limit_is_431(proxy):
    """The same limit for a head that arrives whole, in one read."""
    before = _edge("header_too_large")
    response = httpx.get(f"{proxy.url}/healthz", headers={"x-big": "a" * (LIMITS.max_header_bytes + 1)}, timeout=PATIENCE_S)
    assert response.status_code == 431 and response.json()["error"]["type"] == "request_refused"
    assert len(response.headers["x-slipstream-request-id"]) == 16
    assert _edge("header_too_large") == before + 1


def test_a_64_mib_header_is_refused_while_it_arrives(proxy):
    """The issue's finding: one 64 MiB header held the loop for seconds. Now the connection is closed
    after the limit; the sender finds it closed long before it has sent its 64 MiB."""
    before = _edge("header_too_large")
    with _connect(proxy) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: ")
        sent = _flood(sock, b"a", 64 * 1024 * 1024)
    assert sent < 32 * 1024 * 1024, f"the proxy kept reading: {sent} bytes of header accepted"
    assert _edge("header_too_large") == before + 1
    assert _beta_answers(proxy) == 200


def test_a_request_that_cannot_be_parsed_is_a_named_400(proxy):
    with _connect(proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost x\r\n\r\n")  # a header field without its colon
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:80]
    assert b'"request_refused"' in answer and _request_id(answer)


def test_too_many_header_fields_are_431(proxy):
    before = _edge("too_many_headers")
    with _connect(proxy) as sock:
        fields = b"".join(b"x-h%d: v\r\n" % i for i in range(LIMITS.max_headers + 1))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + fields + b"\r\n")
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:80]
    assert _edge("too_many_headers") == before + 1


def test_a_head_sent_slowly_is_closed_at_the_header_timeout(short_head_timeout):
    """Slowloris: a header line now and then keeps a connection open forever without a head timeout."""
    before = _edge("header_timeout")
    with _connect(short_head_timeout) as dribbler, _connect(short_head_timeout) as silent:
        dribbler.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        stop = threading.Event()

        def dribble() -> None:
            try:
                while not stop.wait(0.2):
                    dribbler.sendall(b"x-slow: 1\r\n")
            except OSError:
                return

        feeder = threading.Thread(target=dribble)
        feeder.start()
        try:
            answer = _read_all(dribbler)
        finally:
            stop.set()
            feeder.join()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:80]
        assert _request_id(answer)
        assert _read_all(silent) == b""  # a connection that sent nothing is closed without an answer
    assert _edge("header_timeout") == before + 2


def test_a_kept_alive_connection_gets_a_new_head_timeout_per_request(short_head_timeout):
    with _connect(short_head_timeout) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the second head never ends
        assert _read_all(sock).startswith(b"HTTP/1.1 408 ")


# --- connections ------------------------------------------------------------------------------------


def test_at_the_connection_cap_a_slow_head_makes_room_then_503(policies):
    """Past the cap, a new connection closes the oldest one still reading its head; when every
    connection has sent its head (here: requests waiting for their body), the new one gets 503."""
    cap = 4
    # the door is not told the cap (each request's part of the body budget is the default's, 1/4096): one
    # team's requests may then hold every place, as the edge must handle (test_connection_shares.py: told)
    app = create_app([policies], watch_interval_s=None)
    with serve_in_thread(app, edge=EdgeLimits(max_connections=cap, header_timeout_s=600)) as proxy:
        evicted, refused = _edge("evicted"), _edge("connection_cap")
        idle = [_connect(proxy) for _ in range(cap)]
        try:
            assert _beta_answers(proxy) == 200  # the cap was full of connections that had sent nothing
            assert _edge("evicted") == evicted + 1
            assert _read_all(idle[0]) == b""  # the oldest one made room (closed: it had sent nothing)
        finally:
            for sock in idle:
                sock.close()
        busy = [_connect(proxy) for _ in range(cap)]
        try:
            for sock in busy:  # a head, then a body that does not come
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + KEY_A.encode()
                             + b"\r\ncontent-length: 100\r\n\r\n")
            deadline = time.monotonic() + PATIENCE_S
            while sum(1 for protocol in list(proxy.server.server_state.connections) if protocol.cycle is not None) < cap:
                assert time.monotonic() < deadline, "the busy connections' heads were not read"  # each request now waits for its body
                time.sleep(0.01)
            with _connect(proxy) as late:
                late.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                assert _read_all(late).startswith(b"HTTP/1.1 503 ")
            assert _edge("connection_cap") == refused + 1
        finally:
            for sock in busy:
                sock.close()


# --- bodies -----------------------------------------------------------------------------------------


def _send_big_body(proxy: RunningServer, path: str, headers: bytes) -> tuple[bytes, int]:
    """POST a 400 MiB body (announced; 64 KiB at a time); the answer, and how much went out before the
    proxy closed."""
    with _connect(proxy) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-length: 419430400\r\n" + headers + b"\r\n")
        sent = _flood(sock, b"k", 400 * 1024 * 1024)
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:
            answer = b""
    return answer, sent


def test_ui_login_refuses_a_400_mib_body_without_reading_it(proxy):
    before = _edge("body_not_read")
    answer, sent = _send_big_body(proxy, "/ui/login", b"content-type: application/x-www-form-urlencoded\r\n")
    assert sent < 64 * 1024 * 1024, f"the proxy read {sent} bytes of a login form"
    assert _edge("body_not_read") == before + 1
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413 "), answer[:80]
    # The small case, answered in full: a form over the login limit is 413.
    response = httpx.post(f"{proxy.url}/ui/login", data={"key": "k" * 8192}, timeout=PATIENCE_S)
    assert response.status_code == 413


def test_a_bad_key_with_a_400_mib_body_is_not_read(proxy):
    before = _edge("body_not_read")
    answer, sent = _send_big_body(proxy, "/v1/chat/completions", b"authorization: Bearer sk-wrong\r\n")
    assert sent < 64 * 1024 * 1024
    assert _edge("body_not_read") == before + 1
    assert answer == b"" or answer.startswith(b"HTTP/1.1 401 "), answer[:80]


# --- bad keys ---------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bad_team_keys_are_counted_and_logged_once_per_interval(proxy, monkeypatch, caplog):
    clock = FakeClock()
    monkeypatch.setattr(refusals, "AUTH_LOG", RateLimitedLog(refusals.log, interval_s=10, clock=clock))
    caplog.set_level(logging.WARNING, logger="slipstream.refusals")
    invalid, missing = _auth("team", "invalid"), _auth("team", "missing")
    for _ in range(12):
        response = httpx.post(f"{proxy.url}/v1/chat/completions", content=HELLO, timeout=PATIENCE_S,
                              headers={"authorization": "Bearer sk-guess", "content-type": "application/json"})
        assert response.status_code == 401
    assert httpx.get(f"{proxy.url}/v1/models", timeout=PATIENCE_S).status_code == 401  # the Litestar door, no key
    assert httpx.get(f"{proxy.url}/v1/files", headers={"authorization": "Bearer sk-guess"}, timeout=PATIENCE_S).status_code == 401  # the pass-through door
    assert _auth("team", "invalid") == invalid + 13 and _auth("team", "missing") == missing + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "slipstream.refusals"]
    assert len(lines) == 1 and "team key refused (invalid) from 127.0.0.1" in lines[0] and "sk-guess" not in lines[0]
    clock.now += 11
    httpx.post(f"{proxy.url}/v1/chat/completions", content=HELLO, headers={"authorization": "Bearer sk-guess"}, timeout=PATIENCE_S)
    lines = [r.getMessage() for r in caplog.records if r.name == "slipstream.refusals"]
    assert len(lines) == 2 and "(13 more from team:127.0.0.1 not logged in the last 10 s)" in lines[1]


def test_admin_key_guessing_is_throttled_per_address(proxy, monkeypatch, caplog):
    clock = FakeClock()
    admin = proxy.app.state.admin_key
    monkeypatch.setattr(admin.throttle, "clock", clock)
    monkeypatch.setattr(admin.throttle, "_failures", {})
    monkeypatch.setattr(refusals, "AUTH_LOG", RateLimitedLog(refusals.log, clock=clock))
    caplog.set_level(logging.WARNING, logger="slipstream.refusals")
    invalid, throttled = _auth("admin", "invalid"), _auth("admin", "throttled")
    login = f"{proxy.url}/ui/login"
    for _ in range(admin.throttle.free_failures):
        assert httpx.post(login, data={"key": "guess"}, timeout=PATIENCE_S).status_code == 401
    refused = httpx.post(login, data={"key": ADMIN}, timeout=PATIENCE_S)  # even the right key waits now
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    metrics = httpx.get(f"{proxy.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=PATIENCE_S)
    assert metrics.status_code == 429  # one throttle for every door the admin key opens
    assert _auth("admin", "invalid") == invalid + 5 and _auth("admin", "throttled") == throttled + 2
    assert any("admin key refused (invalid) from 127.0.0.1 on /ui/login" in r.getMessage() for r in caplog.records)
    clock.now += 1.5
    assert httpx.post(login, data={"key": "guess"}, timeout=PATIENCE_S).status_code == 401  # the 6th failure: 2 s now
    clock.now += 1.5
    assert httpx.post(login, data={"key": ADMIN}, timeout=PATIENCE_S).status_code == 429
    clock.now += 1.0
    assert httpx.post(login, data={"key": ADMIN}, timeout=PATIENCE_S, follow_redirects=False).status_code == 303
    assert admin.throttle._failures == {}  # the right key forgets the address


def test_logout_revokes_the_session_server_side(proxy):
    signed_in = httpx.post(f"{proxy.url}/ui/login", data={"key": ADMIN}, timeout=PATIENCE_S)
    cookie = signed_in.cookies["slipstream_ui"]
    copied = {"slipstream_ui": cookie}
    assert httpx.get(f"{proxy.url}/ui/data", cookies=copied, timeout=PATIENCE_S).status_code == 200
    other = httpx.post(f"{proxy.url}/ui/login", data={"key": ADMIN}, timeout=PATIENCE_S).cookies["slipstream_ui"]
    out = httpx.post(f"{proxy.url}/ui/logout", cookies=copied, timeout=PATIENCE_S)
    assert out.status_code == 303
    assert httpx.get(f"{proxy.url}/ui/data", cookies=copied, timeout=PATIENCE_S).status_code == 401
    # Another sign-in is a session of its own: still open.
    assert httpx.get(f"{proxy.url}/ui/data", cookies={"slipstream_ui": other}, timeout=PATIENCE_S).status_code == 200


def test_logout_revokes_the_session_on_every_replica(policies, monkeypatch):
    """Two replicas over Redis: a session signed in on A and copied to B ends on both after logout on A."""
    skip_without_redis()
    monkeypatch.setenv("SLIPSTREAM_ADMIN_KEY", ADMIN)
    with running_redis() as redis:
        state_url = f"{redis.url}?prefix=t{uuid.uuid4().hex[:8]}&timeout_ms=5000"
        with running_proxy([policies], watch_interval_s=None, state_url=state_url) as a, \
                running_proxy([policies], watch_interval_s=None, state_url=state_url) as b:
            copied = {"slipstream_ui": httpx.post(f"{a.url}/ui/login", data={"key": ADMIN}, timeout=PATIENCE_S).cookies["slipstream_ui"]}
            assert httpx.get(f"{b.url}/ui/data", cookies=copied, timeout=PATIENCE_S).status_code == 200
            assert httpx.post(f"{a.url}/ui/logout", cookies=copied, timeout=PATIENCE_S).status_code == 303
            assert httpx.get(f"{a.url}/ui/data", cookies=copied, timeout=PATIENCE_S).status_code == 401
            deadline = time.monotonic() + PATIENCE_S
            while httpx.get(f"{b.url}/ui/data", cookies=copied, timeout=PATIENCE_S).status_code != 401:  # B's next sync
                assert time.monotonic() < deadline, "replica B still accepts the revoked session"
                time.sleep(0.1)


# --- the admin key's source -------------------------------------------------------------------------


@requires_extra("engine")  # `serve` with no policy argument builds the default team (the local engine)
def test_admin_key_on_the_command_line_is_warned_about(tmp_path):
    with socket.socket() as taken:  # a busy port: the CLI stops after its warnings, before serving
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        given = subprocess.run([*_command(), "serve", "--port", port, "--admin-key", "visible-in-ps"],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
        key_file = tmp_path / "admin-key"
        key_file.write_text("from-a-file\n")
        filed = subprocess.run([*_command(), "serve", "--port", port, "--admin-key-file", str(key_file)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "warning: --admin-key puts the admin key in the command line" in given.stderr
    assert "--admin-key" not in filed.stderr and filed.returncode == 1


def test_admin_key_file_opens_metrics_on_a_served_proxy(tmp_path, policies):
    key_file = tmp_path / "admin-key"
    key_file.write_text("from-a-file\n")
    port = free_port()
    server = subprocess.Popen([*_command(), "serve", "--policy-dir", str(policies), "--port", str(port), "--admin-key-file",
                               str(key_file)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert "serving teams" in server.stdout.readline()
        url = f"http://127.0.0.1:{port}/metrics"
        while True:
            try:
                refused = httpx.get(url, headers={"authorization": "Bearer wrong"}, timeout=PATIENCE_S)
                break
            except httpx.ConnectError:
                continue
        assert refused.status_code == 401
        assert httpx.get(url, headers={"authorization": "Bearer from-a-file"}, timeout=PATIENCE_S).status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=PATIENCE_S)
