"""Proxy CPU per request: what `slipstream serve` spends of its own process's CPU on each request.

Wall-clock throughput on a shared machine moves with the load; the CPU time the proxy process
spends per request moves much less (it is the work the proxy does, whoever else runs). This script
starts one emulator (5 ms to first byte, 16 output tokens, as bench/proxy_overhead.py) and one
proxy per `--tree` (a checkout or `git worktree` of any commit: its code is imported through
PYTHONPATH; policy, emulator and client are this checkout's, the same for all), then sends rounds
of `--requests` requests at `--concurrency` over kept-alive connections to each proxy in turn
(the order alternates by round), JSON and streamed, and reads the proxy's utime + stime from /proc
around each round. Per round and as medians it prints CPU µs per request, the part the cyclic
garbage collector took (gc.callbacks in the proxy), the part of threads other than the event
loop's, full collections per 1,000 requests, and each tree's ratio to the first one per round
(load drifts cancel within a round). A tree that does not start (a broken commit in a bisection)
is skipped and named.

With `--profile`, one more round per mode runs under cProfile (collector off, so its passes are not
charged to whichever function allocated last) and the top functions by cumulative time are
printed per request with their calls per request: calls per request do not move with the load, the
steadiest signal for bisecting. Profiles stay under `--out`.

`--endpoint` picks what is sent (bench/endpoint_overhead.py's bodies): `chat` (the default), `responses`
(the Responses API native to the emulator's OpenAI side, recorded in the proxy's response store) or
`responses-translated` (the Responses API translated to the emulator's Anthropic side); the policy
then has a `claude-*` route to the emulator's Messages API besides the OpenAI one. `--latency` and
`--include-usage` are chat's only. Each proxy has a data directory of its own under `--out` (a
response store that starts empty).

    .venv/bin/python bench/proxy_cpu.py --tree /tmp/wt-b1ad7fc --tree . [--requests 1500] [--rounds 4]
        [--mode json|stream|both] [--endpoint chat|responses|responses-translated] [--include-usage]
        [--profile --out /tmp/prof] [--latency ROUNDS]
    .venv/bin/python bench/proxy_cpu.py --ref b1ad7fc --tree .    # a commit, checked out for the run

Run from the main checkout with its venv; `git worktree add /tmp/wt-SHA SHA` gives a tree to compare,
or `--ref REV` makes one for the run (a detached worktree under the work folder, removed after).
`python -m bench all --only proxy_cpu` compares against b1ad7fc, main when issue 28 asked for a
proxy "at least as good as today's".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import marshal
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `bench.proxy_overhead` when run as a script

from bench.endpoint_overhead import ENDPOINTS  # noqa: E402
from bench.proxy_overhead import (  # noqa: E402  (after the path insert above)
    BODY,
    KEY,
    PY,
    Target,
    emulator_process,
    free_port,
    latencies,
    one,
    own_cpu_seconds,
    pct,
    stop,
    wait_ready,
    write_policy,
)

# Runs `slipstream serve` with a measuring window opened by SIGUSR1 and closed by SIGUSR2: the cyclic
# garbage collector's passes and time per generation in the window (gc.callbacks), and cProfile when
# the window's tag file asks for it (with the collector off: its passes would be charged to whichever
# function allocated last; the rounds before measure it). Written to <prefix>-<tag>.gc.json / .prof, then <prefix>-<tag>.done.
_SERVE = """
import cProfile, gc, json, signal, sys, time
prefix = sys.argv[1]
profiler, window, passes, started = cProfile.Profile(), {'tag': '', 'profile': False}, [[0, 0.0] for _ in range(3)], [0.0]
def on_gc(phase, info):
    if phase == 'start':
        started[0] = time.process_time()
    else:
        passes[info['generation']][0] += 1
        passes[info['generation']][1] += time.process_time() - started[0]
gc.callbacks.append(on_gc)
def on(signum, frame):
    tag, *flags = open(prefix + '.tag').read().split()
    window.update(tag=tag, profile='profile' in flags)
    for counter in passes:
        counter[:] = [0, 0.0]
    if window['profile']:
        gc.disable()  # a collection's time would land on whichever function allocated last
        profiler.enable()
def off(signum, frame):
    out = prefix + '-' + window['tag']
    if window['profile']:
        profiler.disable()
        gc.enable()
        profiler.dump_stats(out + '.prof')
        profiler.clear()
    open(out + '.gc.json', 'w').write(json.dumps(passes))
    open(out + '.done', 'w').close()
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, off)
from gateway.cli import main
sys.exit(main(sys.argv[2:]))
"""


@dataclass
class Proxy:
    label: str
    tree: Path
    proc: subprocess.Popen[bytes]
    target: Target
    prefix: Path  # of the files the proxy writes at the end of each window (_SERVE)
    cpu_us: dict[str, list[float]] = field(default_factory=dict)
    gc_us: dict[str, list[float]] = field(default_factory=dict)  # of cpu_us, the cyclic collector's passes
    full_gcs: dict[str, list[float]] = field(default_factory=dict)  # generation-2 passes per 1,000 requests
    off_loop_us: dict[str, list[float]] = field(default_factory=dict)  # of cpu_us, threads other than the event loop's
    profiled: dict[str, int] = field(default_factory=dict)  # requests served while profiled, per mode
    added_p50_ms: dict[str, list[float]] = field(default_factory=dict)  # --latency: p50 at concurrency 1 less direct's
    rps: dict[str, list[float]] = field(default_factory=dict)  # --latency: requests a second at concurrency 64
    failed: int = 0  # requests answered other than 200 or not at all
    endpoint: str = "chat"  # what is sent (--endpoint)


def label_of(tree: Path) -> str:
    try:
        sha = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = "?"
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    return f"{tree.name}@{sha}{'+dirty' if dirty else ''}"


def start_proxy(tree: Path, policy: Path, prefix: Path, label: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [PY, "-c", _SERVE, str(prefix), "serve", "--policy", str(policy), "--port", str(port)]
    # A data directory of its own (the response store, spend records, ownership): shared with the other
    # trees' proxies and earlier runs (~/.cache/slipstream), a run measured whatever those had left, a
    # Responses run a store grown to the team's quota (every put then evicts) and both proxies' writes
    # taking turns on one SQLite file.
    env = {"PYTHONPATH": str(tree), "SLIPSTREAM_DATA_DIR": f"{prefix}-data"}
    # The log in a temporary file, not a pipe nobody reads (full after 64 KiB, then the proxy blocks);
    # the child holds its own descriptor, so this one closes when startup is settled.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
        try:
            wait_ready(f"http://127.0.0.1:{port}/healthz", timeout_s=120)
        except RuntimeError:
            stop(proc)
            log.seek(0)
            raise RuntimeError(f"the proxy of {label} never answered: {log.read().decode(errors='replace')[-2000:]}") from None
    return proc, port


def loop_cpu_seconds(pid: int) -> float:
    """CPU time of the process's main thread (the event loop's), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def window(proxy: Proxy, tag: str, profile: bool = False) -> AsyncIterator[Path]:
    """A measuring window in the proxy process (see _SERVE); yields the prefix of the files it writes."""
    Path(f"{proxy.prefix}.tag").write_text(f"{tag} profile" if profile else tag)
    os.kill(proxy.proc.pid, signal.SIGUSR1)
    await asyncio.sleep(0.2)  # the signal is handled between two callbacks of the proxy's loop
    yield Path(f"{proxy.prefix}-{tag}")
    os.kill(proxy.proc.pid, signal.SIGUSR2)
    done = Path(f"{proxy.prefix}-{tag}.done")
    deadline = time.monotonic() + 30
    while not done.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def request_body(stream: bool, include_usage: bool = False, endpoint: str = "chat") -> bytes:
    body = BODY if endpoint == "chat" else ENDPOINTS[endpoint][2]
    return json.dumps({**body, "stream": stream, **({"stream_options": {"include_usage": True}} if stream and include_usage else {})}).encode()


def endpoint_policy(workdir: Path, emu_port: int, endpoint: str) -> Path:
    """proxy_overhead's policy; for a Responses endpoint with `claude-*` to the emulator's Messages API too."""
    policy = write_policy(workdir, emu_port)
    if endpoint != "chat":
        policy.write_text(
            f"team: bench\napi_keys: [{{value: {KEY}}}]\n"
            f"providers:\n  gpt: {{kind: openai, base_url: 'http://127.0.0.1:{emu_port}/v1', api_key: up}}\n"
            f"  claude: {{kind: anthropic, base_url: 'http://127.0.0.1:{emu_port}', api_key: up}}\n"
            "routes:\n  - match: {model: 'claude-*'}\n    targets: [{provider: claude}]\n"
            "  - match: {model: '*'}\n    targets: [{provider: gpt}]\nretry: {max_attempts: 1}\n"
        )
    return policy


async def answered(proxy: Proxy, session: aiohttp.ClientSession, body: bytes, stream: bool) -> bool:
    """One request; a failure is counted on the proxy, not fatal (the CPU was spent all the same; and
    b1ad7fc's client loses a request when the emulator closes an idle kept-alive connection under it)."""
    try:
        await one(session, proxy.target, body, stream)
        return True
    except (RuntimeError, aiohttp.ClientError) as exc:
        proxy.failed += 1
        if proxy.failed <= 3:
            print(f"{proxy.label}: {str(exc)[:200]}", file=sys.stderr)
        return False


async def load(proxy: Proxy, session: aiohttp.ClientSession, n: int, concurrency: int, stream: bool, include_usage: bool) -> int:
    """Send `n` requests at `concurrency` over the session's kept-alive connections; how many were sent."""
    body = request_body(stream, include_usage, proxy.endpoint)
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await answered(proxy, session, body, stream)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n


async def measure(proxy: Proxy, session: aiohttp.ClientSession, n: int, concurrency: int, stream: bool, include_usage: bool,
                  tag: str) -> None:
    """CPU µs per request of the proxy process over `n` requests, and what of it the collector took."""
    mode = "stream" if stream else "json"
    async with window(proxy, tag) as out:
        before, loop_before = own_cpu_seconds(proxy.proc.pid), loop_cpu_seconds(proxy.proc.pid)
        sent = await load(proxy, session, n, concurrency, stream, include_usage)
        cpu, loop_cpu = own_cpu_seconds(proxy.proc.pid) - before, loop_cpu_seconds(proxy.proc.pid) - loop_before
    passes = json.loads(Path(f"{out}.gc.json").read_text())
    proxy.cpu_us.setdefault(mode, []).append(cpu / sent * 1e6)
    proxy.off_loop_us.setdefault(mode, []).append((cpu - loop_cpu) / sent * 1e6)
    proxy.gc_us.setdefault(mode, []).append(sum(seconds for _, seconds in passes) / sent * 1e6)
    proxy.full_gcs.setdefault(mode, []).append(passes[2][0] / sent * 1000)


async def profile_round(proxy: Proxy, session: aiohttp.ClientSession, n: int, concurrency: int, stream: bool, include_usage: bool) -> None:
    mode = "stream" if stream else "json"
    async with window(proxy, f"{mode}-profile", profile=True):
        proxy.profiled[mode] = await load(proxy, session, n, concurrency, stream, include_usage)


def print_profile(proxies: list[Proxy], top: int) -> None:
    for mode in ("json", "stream"):
        for proxy in proxies:
            path = Path(f"{proxy.prefix}-{mode}-profile.prof")
            if not path.exists():
                continue
            n = proxy.profiled[mode]
            # The file is cProfile's marshalled table, {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)};
            # read directly because pstats' typed view rounds times to milliseconds and keys functions by name alone.
            table = marshal.loads(path.read_bytes())
            own_s, calls = sum(entry[2] for entry in table.values()), sum(entry[1] for entry in table.values())
            # Calls per request hardly move with the machine's load: the steadiest measure of work added between commits.
            print(f"\n### {proxy.label} {mode}: {n} requests, {calls / n:.0f} calls and {own_s / n * 1e6:.0f} µs profiled time per request; "
                  f"top {top} by cumulative")
            print("| cum µs/req | own µs/req | calls/req | function |")
            print("|---|---|---|---|")
            for (file, line, name), (_primitive, calls, own, cumulative, _callers) in sorted(table.items(), key=lambda item: item[1][3], reverse=True)[:top]:
                where = file.replace(str(proxy.tree) + "/", "").replace(str(ROOT) + "/", "")
                print(f"| {cumulative / n * 1e6:.1f} | {own / n * 1e6:.1f} | {calls / n:.2f} | {where}:{line} {name} |")


async def rounds(args: argparse.Namespace, proxies: list[Proxy], modes: list[bool]) -> None:
    # One session per proxy for the whole run: connections stay alive, as a real client's do, so a
    # round measures requests, not connection set-up.
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) for _ in proxies]
    try:
        for proxy, session in zip(proxies, sessions, strict=True):  # warm every code path before anything is measured
            for stream in modes:
                await load(proxy, session, 4 * args.concurrency, args.concurrency, stream, args.include_usage)
        for stream in modes:
            mode = "stream" if stream else "json"
            for round_ in range(args.rounds):
                order = list(zip(proxies, sessions, strict=True))
                for proxy, session in order if round_ % 2 == 0 else order[::-1]:
                    await measure(proxy, session, args.requests, args.concurrency, stream, args.include_usage, f"{mode}-{round_}")
                    print(f"{mode} round {round_ + 1} {proxy.label}: {proxy.cpu_us[mode][-1]:.0f} µs/request, collector "
                          f"{proxy.gc_us[mode][-1]:.0f} (load {os.getloadavg()[0]:.2f})", flush=True)
            if args.profile:
                for proxy, session in zip(proxies, sessions, strict=True):
                    await profile_round(proxy, session, args.requests, args.concurrency, stream, args.include_usage)
    finally:
        for session in sessions:
            await session.close()


async def requests_per_second(proxy: Proxy, seconds: float, concurrency: int, stream: bool) -> float:
    """Answered requests a second over `seconds` at `concurrency` (failures counted by `answered`)."""
    body = request_body(stream)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await load(proxy, session, concurrency, concurrency, stream, False)  # warm the connections
        done, deadline = 0, time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                if await answered(proxy, session, body, stream):  # not `done += await ...`: that reads `done` before the await
                    done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def latency_rounds(args: argparse.Namespace, proxies: list[Proxy], modes: list[bool], direct: Target) -> None:
    """Per round and tree (the order alternating): the p50 at concurrency 1 less the emulator's own p50
    measured just before it, and requests a second at concurrency 64: proxy_overhead.py's two figures,
    with the emulator and the client the same for every tree (that script runs each tree's own)."""
    for stream in modes:
        mode = "stream" if stream else "json"
        for round_ in range(args.latency):
            for proxy in proxies if round_ % 2 == 0 else proxies[::-1]:
                base = pct(await latencies(direct, args.latency_requests, 1, stream), 0.5)
                via = pct(await latencies(proxy.target, args.latency_requests, 1, stream), 0.5)
                proxy.added_p50_ms.setdefault(mode, []).append(via - base)
                proxy.rps.setdefault(mode, []).append(await requests_per_second(proxy, args.seconds, 64, stream))
                print(f"{mode} latency round {round_ + 1} {proxy.label}: added p50 {via - base:.2f} ms, "
                      f"{proxy.rps[mode][-1]:.0f} req/s at 64 (load {os.getloadavg()[0]:.2f})", flush=True)


def print_latency(proxies: list[Proxy]) -> None:
    print("\n| proxy | mode | added p50 ms, concurrency 1 (median) | req/s, concurrency 64 (median) | rounds (ms; req/s) |")
    print("|---|---|---|---|---|")
    for proxy in proxies:
        for mode, added in proxy.added_p50_ms.items():
            print(f"| {proxy.label} | {mode} | {statistics.median(added):.2f} | {statistics.median(proxy.rps[mode]):.0f} | "
                  f"{', '.join(f'{v:.2f}' for v in added)}; {', '.join(f'{v:.0f}' for v in proxy.rps[mode])} |")
    for proxy in proxies[1:]:
        for mode, added in proxy.added_p50_ms.items():
            first = proxies[0]
            rps = [v / b for v, b in zip(proxy.rps[mode], first.rps[mode], strict=True)]
            print(f"  {proxy.label} {mode}: added p50 {statistics.median(added) - statistics.median(first.added_p50_ms[mode]):+.2f} ms, "
                  f"req/s {statistics.median(rps):.3f}x {first.label}'s (per round: {', '.join(f'{r:.2f}' for r in rps)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", action="append", default=[], help="a commit to measure, checked out for the run (before the --tree ones)")
    parser.add_argument("--tree", action="append", type=Path, help="checkout whose proxy to measure (repeat to compare; default: this one)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per round and mode")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode, alternating the trees")
    parser.add_argument("--mode", choices=["json", "stream", "both"], default="both")
    parser.add_argument("--profile", action="store_true", help="after the rounds, one more per mode under cProfile; print the top functions")
    parser.add_argument("--out", type=Path, help="directory for the proxies' window files and profiles (default: a temporary one)")
    parser.add_argument("--top", type=int, default=40, help="with --profile: functions printed per profile")
    parser.add_argument("--endpoint", choices=["chat", "responses", "responses-translated"], default="chat",
                        help="what is sent: chat completions, or the Responses API native or translated to Messages")
    parser.add_argument("--include-usage", action="store_true", help="streamed requests ask for usage (no estimate needed at the end)")
    parser.add_argument("--json", dest="json_out", type=Path, help="also write the results here as JSON")
    parser.add_argument("--latency", type=int, default=0, metavar="ROUNDS",
                        help="also this many rounds per mode of added p50 at concurrency 1 and req/s at 64, alternating the trees")
    parser.add_argument("--latency-requests", type=int, default=200, help="with --latency: requests for each p50")
    parser.add_argument("--seconds", type=float, default=3.0, help="with --latency: seconds for each req/s")
    args = parser.parse_args()
    if args.endpoint != "chat" and (args.latency or args.include_usage):
        parser.error("--latency and --include-usage measure chat only")
    uvloop.install()
    modes = [False, True] if args.mode == "both" else [args.mode == "stream"]
    procs: list[subprocess.Popen[bytes]] = []
    workdir = args.out or Path(tempfile.mkdtemp(prefix="slipstream-cpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    checkouts = [workdir / f"ref-{ref}" for ref in args.ref]
    for ref, checkout in zip(args.ref, checkouts, strict=True):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--force", "--detach", str(checkout), ref],
                       check=True, capture_output=True)
    trees = checkouts + [tree.resolve() for tree in (args.tree or ([] if checkouts else [ROOT]))]
    try:
        emu_port = free_port()
        procs.append(emulator_process(emu_port, 5.0))
        wait_ready(f"http://127.0.0.1:{emu_port}/_emulator/stats")
        policy = endpoint_policy(workdir, emu_port, args.endpoint)
        proxies: list[Proxy] = []
        for index, tree in enumerate(trees):
            label = f"{index}-{label_of(tree)}"
            try:
                proc, port = start_proxy(tree, policy, workdir / label, label)
            except RuntimeError as exc:  # a commit in a bisection that does not start: skipped, said
                print(f"skipped: {exc}", file=sys.stderr)
                continue
            procs.append(proc)
            path = ENDPOINTS[args.endpoint][0]
            proxies.append(Proxy(label, tree, proc, Target(label, f"http://127.0.0.1:{port}{path}", KEY), workdir / label, endpoint=args.endpoint))
        print(f"commit {label_of(ROOT)}, {os.cpu_count()} cores; {args.requests} {args.endpoint} requests per round at concurrency {args.concurrency}")
        asyncio.run(rounds(args, proxies, modes))
        if args.latency:
            direct = Target("direct", f"http://127.0.0.1:{emu_port}/v1/chat/completions", "up")
            asyncio.run(latency_rounds(args, proxies, modes, direct))
        if args.profile:  # before the tables: the runner keeps an output's last lines
            print_profile(proxies, args.top)
        print(f"\n| proxy | mode | CPU µs/request (median of {args.rounds}) | of it, collector µs | of it, other threads µs "
              "| full collections per 1k requests | rounds |")
        print("|---|---|---|---|---|---|---|")
        for proxy in proxies if args.rounds else []:
            for mode, values in proxy.cpu_us.items():
                print(f"| {proxy.label} | {mode} | {statistics.median(values):.0f} | {statistics.median(proxy.gc_us[mode]):.0f} | {statistics.median(proxy.off_loop_us[mode]):.0f} "
                      f"| {statistics.median(proxy.full_gcs[mode]):.1f} | {', '.join(f'{v:.0f}' for v in values)} |")
        if len(proxies) > 1 and args.rounds:  # each round's ratio to the first tree's: load drifts cancel within a round
            print(f"\nratio to {proxies[0].label}, median over rounds:")
            for proxy in proxies[1:]:
                for mode, values in proxy.cpu_us.items():
                    ratios = [v / b for v, b in zip(values, proxies[0].cpu_us[mode], strict=True)]
                    print(f"  {proxy.label} {mode}: {statistics.median(ratios):.3f} ({', '.join(f'{r:.2f}' for r in ratios)})")
        for proxy in proxies:
            if proxy.failed:
                print(f"{proxy.label}: {proxy.failed} requests failed")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.json_out:
            args.json_out.write_text(json.dumps({p.label: {"cpu_us": p.cpu_us, "gc_us": p.gc_us} for p in proxies}, indent=1))
        if args.latency:
            print_latency(proxies)
    finally:
        for proc in reversed(procs):
            stop(proc)
        for checkout in checkouts:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(checkout)], check=False, capture_output=True)


if __name__ == "__main__":
    main()
