"""Proxy overhead: the same requests sent straight to the emulator and through `slipstream serve`.

Everything is measured in one run on one machine: the emulator, the proxy and the load generator
are separate processes, so the ratios hold even where absolute times drift. Reports the latency the
proxy adds (p50/p99) at concurrency 1 and 32, and requests/s at concurrency 64, streaming and not.
A bare ASGI forwarder (bench/bare_forwarder.py) runs too, as the floor any Python forwarder pays
here. With `--litellm PATH_TO_LITELLM_BIN`, LiteLLM's proxy runs against the same emulator too.
With `--traced`, a second Slipstream proxy runs with OpenTelemetry tracing on, exporting over OTLP
HTTP/protobuf (the real exporter, BatchSpanProcessor defaults) to bench/otlp_sink.py, and the two
proxies are also measured against each other: what tracing adds per request and to throughput.

    .venv/bin/python bench/proxy_overhead.py [--requests 400] [--seconds 10] [--litellm /tmp/litellm-venv/bin/litellm] [--traced]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.plots` when run as a script
PY = sys.executable
KEY = "sk-bench"
LITELLM_KEY = "sk-litellm-bench-0123456789abcdef0123456789abcdef"
BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello in one short sentence."}], "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def wait_ready(url: str, timeout_s: float = 60) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answered
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} never answered")


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The process in its own session, its log in an unnamed temporary file (kept while the process
    runs): a pipe nobody reads fills after 64 KiB and then blocks the process's next log line (the
    isolation benchmark's proxy hung so after ~350 requests that each logged a line)."""
    with tempfile.TemporaryFile() as log:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass
class Target:
    name: str
    url: str  # full chat-completions URL
    key: str


async def one(session: aiohttp.ClientSession, target: Target, body: bytes, stream: bool) -> float:
    started = time.perf_counter()
    async with session.post(target.url, data=body, headers={"authorization": f"Bearer {target.key}", "content-type": "application/json"}) as response:
        if response.status != 200:
            raise RuntimeError(f"{target.name}: {response.status} {await response.text()}")
        if stream:
            async for _ in response.content.iter_any():
                pass
        else:
            await response.read()
    return time.perf_counter() - started


async def latencies(target: Target, n: int, concurrency: int, stream: bool) -> list[float]:
    body = json.dumps({**BODY, "stream": stream}).encode()
    results: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for _ in range(min(20, n)):  # warm connections and caches
            await one(session, target, body, stream)

        async def worker(count: int) -> None:
            for _ in range(count):
                results.append(await one(session, target, body, stream))

        await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    return results


async def throughput(target: Target, seconds: float, concurrency: int, stream: bool) -> float:
    body = json.dumps({**BODY, "stream": stream}).encode()
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        for _ in range(concurrency):
            await one(session, target, body, stream)
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await one(session, target, body, stream)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its live descendants, from /proc (Linux)."""
    ticks, parents, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(fields[1])
            cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    family, grew = {pid}, True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    return sum(cpu.get(member, 0.0) for member in family)


def own_cpu_seconds(pid: int) -> float:
    """CPU time of the process alone (its children excluded)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def interleaved(direct: Target, via: Target, n: int, concurrency: int, stream: bool, rounds: int = 4) -> tuple[list[float], list[float]]:
    """Alternate blocks of direct and proxied requests so machine noise hits both sides alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a += await latencies(direct, n // rounds, concurrency, stream)
        b += await latencies(via, n // rounds, concurrency, stream)
    return a, b


def write_policy(workdir: Path, emu_port: int) -> Path:
    """The benchmark team's policy: every model to the emulator's OpenAI endpoint, no retries."""
    policy = workdir / "bench.yaml"
    policy.write_text(
        f"team: bench\napi_keys: [{{value: {KEY}}}]\n"
        f"providers:\n  gpt: {{kind: openai, base_url: 'http://127.0.0.1:{emu_port}/v1', api_key: up}}\n"
        "routes:\n  - match: {model: '*'}\n    targets: [{provider: gpt}]\nretry: {max_attempts: 1}\n"
    )
    return policy


def emulator_process(port: int, ttft_ms: float) -> subprocess.Popen[bytes]:
    code = (
        "from emulator.app import EmulatorConfig, serve;"
        f"serve('127.0.0.1', {port}, EmulatorConfig(ttft_base_ms={ttft_ms}, default_output_tokens=16))"
    )
    return start([PY, "-c", code])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--ttft-ms", type=float, default=5.0, help="emulator time to first byte")
    parser.add_argument("--litellm", help="path of a `litellm` executable to compare against")
    parser.add_argument("--plot", help="write latency percentiles at concurrency 1 (JSON) as a PNG here")
    parser.add_argument("--traced", action="store_true", help="also a proxy with OpenTelemetry tracing on, and on vs off")
    parser.add_argument("--only-traced", action="store_true", help="with --traced: only the tracing on vs off comparison")
    args = parser.parse_args()
    uvloop.install()
    procs: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="slipstream-bench-"))
    try:
        emu_port, proxy_port = free_port(), free_port()
        procs.append(emulator_process(emu_port, args.ttft_ms))
        wait_ready(f"http://127.0.0.1:{emu_port}/_emulator/stats")
        policy = write_policy(workdir, emu_port)
        untraced_proc = start([PY, "-m", "gateway.cli", "serve", "--policy", str(policy), "--port", str(proxy_port)])
        procs.append(untraced_proc)
        wait_ready(f"http://127.0.0.1:{proxy_port}/healthz")
        floor_port = free_port()
        procs.append(start([PY, str(ROOT / "bench" / "bare_forwarder.py"), f"http://127.0.0.1:{emu_port}", str(floor_port)]))
        wait_ready(f"http://127.0.0.1:{floor_port}/v1/models")
        direct = Target("direct", f"http://127.0.0.1:{emu_port}/v1/chat/completions", "up")
        untraced = Target("slipstream", f"http://127.0.0.1:{proxy_port}/v1/chat/completions", KEY)
        targets = [Target("bare-forwarder", f"http://127.0.0.1:{floor_port}/v1/chat/completions", "up"), untraced]
        traced, sink = None, ""
        if args.traced:
            sink_port, traced_port = free_port(), free_port()
            sink = f"http://127.0.0.1:{sink_port}"
            procs.append(start([PY, str(ROOT / "bench" / "otlp_sink.py"), str(sink_port)]))
            wait_ready(f"{sink}/stats")
            traced_proc = start([PY, "-m", "gateway.cli", "serve", "--policy", str(policy), "--port", str(traced_port)],
                                env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{sink}/v1/traces"})
            procs.append(traced_proc)
            wait_ready(f"http://127.0.0.1:{traced_port}/healthz")
            traced = Target("slipstream-traced", f"http://127.0.0.1:{traced_port}/v1/chat/completions", KEY)
            targets = [] if args.only_traced else [*targets, traced]
        if args.litellm:
            litellm_port = free_port()
            config = workdir / "litellm.yaml"
            config.write_text(
                "model_list:\n  - model_name: gpt-4o\n    litellm_params:\n      model: openai/gpt-4o\n"
                f"      api_base: http://127.0.0.1:{emu_port}/v1\n      api_key: up\n"
                "litellm_settings:\n  num_retries: 0\n  telemetry: false\n"
            )
            procs.append(start([args.litellm, "--config", str(config), "--port", str(litellm_port), "--num_workers", "1"], env={"LITELLM_LOG": "ERROR", "LITELLM_MASTER_KEY": LITELLM_KEY}))
            wait_ready(f"http://127.0.0.1:{litellm_port}/health/liveliness", timeout_s=180)
            targets.append(Target("litellm", f"http://127.0.0.1:{litellm_port}/v1/chat/completions", LITELLM_KEY))

        rows = []
        curves: dict[str, list[float]] = {}  # latencies at concurrency 1, JSON, for the plot
        for target in targets:
            for stream in (False, True):
                mode = "stream" if stream else "json"
                for concurrency in (1, 32):
                    n = args.requests if concurrency == 1 else args.requests * 4
                    base, via = asyncio.run(interleaved(direct, target, n, concurrency, stream))
                    if concurrency == 1 and not stream:
                        curves.setdefault("direct", base)
                        curves[target.name] = via
                    rows.append(
                        {
                            "proxy": target.name, "mode": mode, "concurrency": concurrency,
                            "direct_p50_ms": pct(base, 0.5), "proxied_p50_ms": pct(via, 0.5),
                            "added_p50_ms": pct(via, 0.5) - pct(base, 0.5),
                            "added_p99_ms": pct(via, 0.99) - pct(base, 0.99),
                        }
                    )
                    print(json.dumps(rows[-1]), flush=True)
                rps_direct = asyncio.run(throughput(direct, args.seconds, 64, stream))
                rps_via = asyncio.run(throughput(target, args.seconds, 64, stream))
                rows.append({"proxy": target.name, "mode": mode, "concurrency": 64, "direct_rps": rps_direct, "proxied_rps": rps_via, "ratio": rps_via / rps_direct})
                print(json.dumps(rows[-1]), flush=True)

        if traced is not None:
            print("\ntracing on against off (the two proxies interleaved; CPU per request: the proxy process + its export child):")
            print("| mode | concurrency | off p50 ms | on p50 ms | added p50 ms | added p99 ms | off CPU µs | on CPU µs | off req/s | on req/s |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            for stream in (False, True):
                mode = "stream" if stream else "json"
                for concurrency in (1, 32):
                    n = args.requests if concurrency == 1 else args.requests * 4
                    cpu_before = cpu_seconds(untraced_proc.pid), own_cpu_seconds(traced_proc.pid), cpu_seconds(traced_proc.pid)
                    off, on = asyncio.run(interleaved(untraced, traced, n, concurrency, stream))
                    time.sleep(0.6)  # the export child's share of these requests (the proxy sends a batch 0.25 s after its first)
                    served = len(off) + 4 * min(20, n // 4)  # measured requests and each block's warm-up ones
                    cpu_off = (cpu_seconds(untraced_proc.pid) - cpu_before[0]) / served * 1e6
                    cpu_proxy = (own_cpu_seconds(traced_proc.pid) - cpu_before[1]) / served * 1e6
                    cpu_on = (cpu_seconds(traced_proc.pid) - cpu_before[2]) / served * 1e6
                    print(f"| {mode} | {concurrency} | {pct(off, 0.5):.3f} | {pct(on, 0.5):.3f} | {pct(on, 0.5) - pct(off, 0.5):+.3f} "
                          f"| {pct(on, 0.99) - pct(off, 0.99):+.3f} | {cpu_off:.0f} | {cpu_proxy:.0f} + {cpu_on - cpu_proxy:.0f} | | |", flush=True)
                rps_off = asyncio.run(throughput(untraced, args.seconds, 64, stream))
                rps_on = asyncio.run(throughput(traced, args.seconds, 64, stream))
                print(f"| {mode} | 64 | | | | | | | {rps_off:.0f} | {rps_on:.0f} ({rps_on / rps_off:.2f}x) |", flush=True)
            time.sleep(6)  # the batch processor exports every 5 s: let the last batch arrive
            import urllib.request

            print("OTLP sink received:", urllib.request.urlopen(f"{sink}/stats", timeout=5).read().decode())

        if args.plot:
            from bench.plots import line_chart

            quantiles = [q / 100 for q in range(1, 100)]
            line_chart(args.plot, "Latency at concurrency 1 (emulator answers after 5 ms)", "percentile", "ms",
                       {name: ([q * 100 for q in quantiles], [pct(values, q) for q in quantiles]) for name, values in curves.items()})
        print("\n| proxy | mode | concurrency | direct p50 ms | proxied p50 ms | added p50 ms | added p99 ms | direct req/s | proxied req/s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            if row["concurrency"] == 64:
                print(f"| {row['proxy']} | {row['mode']} | 64 | | | | | {row['direct_rps']:.0f} | {row['proxied_rps']:.0f} |")
            else:
                print(
                    f"| {row['proxy']} | {row['mode']} | {row['concurrency']} | {row['direct_p50_ms']:.2f} | {row['proxied_p50_ms']:.2f} "
                    f"| {row['added_p50_ms']:.2f} | {row['added_p99_ms']:.2f} | | |"
                )
        if args.litellm:
            ours = {(r["mode"], r["concurrency"]): r for r in rows if r["proxy"] == "slipstream"}
            theirs = {(r["mode"], r["concurrency"]): r for r in rows if r["proxy"] == "litellm"}
            for key in ours:
                if key[1] == 1:
                    print(f"added p50 at c=1 ({key[0]}): litellm / slipstream = {float(theirs[key]['added_p50_ms']) / max(float(ours[key]['added_p50_ms']), 1e-3):.1f}x")
                if key[1] == 64:
                    print(f"req/s at c=64 ({key[0]}): slipstream / litellm = {float(ours[key]['proxied_rps']) / float(theirs[key]['proxied_rps']):.1f}x")
    finally:
        for proc in reversed(procs):
            stop(proc)


if __name__ == "__main__":
    main()
