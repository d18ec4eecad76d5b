"""`rediss://` against a redis-server that speaks only TLS, wants a password and a client certificate:
Slipstream's client (sdk/state/redis_client.py) and redis-py (the test's independent reader) read the
same URL options."""

from __future__ import annotations

import anthropic
import pytest

from tests.helpers import skip_without_redis, write_policy

skip_without_redis()

import redis  # noqa: E402

from gateway.testing import running_proxy  # noqa: E402
from sdk.state import open_state  # noqa: E402
from sdk.state.backend import Admission, Rate  # noqa: E402
from sdk.state.redis import split_url  # noqa: E402


def tls_url(server, files, **options: str) -> str:
    query = {"ssl_certfile": files["client"], "ssl_keyfile": files["client_key"], "timeout_ms": 2000, **options}
    return f"{server.url.replace('/0', '/2')}?" + "&".join(f"{k}={v}" for k, v in query.items())


async def test_rediss_with_a_password_a_ca_file_and_a_client_certificate(tls_redis, tls_files):
    url = tls_url(tls_redis, tls_files, ssl_ca_certs=tls_files["ca"], prefix="tls")
    state = open_state(url)
    assert await state.admit(Admission("", (Rate("rpm", 1, 1),))) is None
    assert (await state.admit(Admission("", (Rate("rpm", 1, 1),)))).kind == "rate"  # the bucket is in Redis
    assert state.status()["up"] is True
    await state.close()
    plain_url, _, _ = split_url(url)
    with redis.Redis.from_url(plain_url) as client:  # the same URL, read by redis-py: same server and database
        assert client.exists("tls:rpm") == 1


async def test_rediss_checks_the_servers_certificate(tls_redis, tls_files):
    untrusted = open_state(tls_url(tls_redis, tls_files))  # the system's trust store does not know the test CA
    assert await untrusted.admit(Admission("", (Rate("rpm", 1, 1),))) is None  # served locally
    status = untrusted.status()
    assert status["mode"] == "degraded" and "CERTIFICATE_VERIFY_FAILED" in status["last_error"]
    await untrusted.close()
    unchecked = open_state(tls_url(tls_redis, tls_files, ssl_cert_reqs="none"))
    assert await unchecked.admit(Admission("", (Rate("rpm", 5, 1),))) is None
    assert unchecked.status()["up"] is True
    await unchecked.close()
    with pytest.raises(ValueError, match="ssl_cert_reqs"):
        open_state(tls_url(tls_redis, tls_files, ssl_cert_reqs="sometimes"))
    with pytest.raises(ValueError, match="rediss://"):
        open_state(f"redis://127.0.0.1:6379/0?ssl_ca_certs={tls_files['ca']}")


def test_two_proxies_share_a_limit_over_tls(tmp_path, fresh_emulator, tls_redis, tls_files):
    write_policy(tmp_path, "t", "sk-t", fresh_emulator.url, extra="limits: {requests_per_minute: 2}\n")
    url = tls_url(tls_redis, tls_files, ssl_ca_certs=tls_files["ca"], prefix="tlsproxies")
    with running_proxy([tmp_path], state_url=url) as a, running_proxy([tmp_path], state_url=url) as b:
        answered = 0
        for proxy in (a, b, a, b):
            client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-t", max_retries=0)
            try:
                client.messages.create(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
                answered += 1
            except anthropic.RateLimitError:
                pass
        assert answered == 2  # 4 with a limit per replica
