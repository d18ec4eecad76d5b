"""Run every benchmark and rewrite the results section of docs/benchmarks.md.

    .venv/bin/python -m bench all [--quick | --full] [--only NAME ...] [--no-write]
    .venv/bin/python -m bench list

Each benchmark is the script a reader would run by hand (the proxy over HTTP for proxy features,
`LLM`/`engine serve` for the engine); each measures its own baseline in the same run and prints
its ratios. The runner records the commit, the machine and the load average before and after each
benchmark, and the CPU that other processes used while it ran (the machine's busy time from
/proc/stat less the benchmark's own, its servers included); it marks a figure **loaded** when other
processes used more than a quarter of the cores on average. The load average cannot say this: a
benchmark that keeps both cores busy raises it to 2 by itself. It then
replaces the text between the two markers in docs/benchmarks.md with what each printed, grouped
by feature. `--quick` is sized to finish in about 15 minutes on 2 cores; `--full` is what the docs
quote. A few benchmarks run only with `--full`: quality figures (perplexity, agreement between KV
caches) that neither a smaller run nor the machine's load would change. A benchmark that fails or runs out of time is reported as such, never left out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import resource
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- python -m bench all: begin (generated; edit bench/__main__.py, not this block) -->"
END = "<!-- python -m bench all: end -->"
TAIL_LINES = 60  # of each benchmark's output kept in the docs: the tables are printed last


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    feature: str
    script: str  # relative to the repository root
    # None: --full only (quality figures, which a smaller run or another machine would not change; they run
    # on one thread, since two OpenMP threads spin-waiting on each other crawl when the machine is shared)
    quick: tuple[str, ...] | None
    full: tuple[str, ...]
    quick_timeout_s: int = 180
    full_timeout_s: int = 1800

    def argv(self, full: bool) -> list[str]:
        arguments = self.full if full or self.quick is None else self.quick
        return [sys.executable, str(ROOT / self.script), *arguments]


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("proxy_overhead", "Proxy overhead and throughput", "bench/proxy_overhead.py",
              ("--requests", "150", "--seconds", "3"), ()),
    Benchmark("proxy_cpu", "Proxy CPU, added latency and throughput against main when issue 28 was filed (b1ad7fc), same emulator and client", "bench/proxy_cpu.py",
              ("--ref", "b1ad7fc", "--tree", ".", "--requests", "1000", "--rounds", "3", "--latency", "2",
               "--latency-requests", "100", "--seconds", "1"),
              ("--ref", "b1ad7fc", "--tree", ".", "--rounds", "5", "--latency", "10", "--profile", "--top", "25")),
    Benchmark("endpoint_overhead", "Proxy overhead per endpoint", "bench/endpoint_overhead.py",
              ("--requests", "100", "--seconds", "2", "--clients", "aiohttp"), ()),
    Benchmark("lost_requests", "No lost requests (slow threaded upstream, small backlog)", "bench/slow_upstream.py",
              ("--lost", "--requests", "1500", "--concurrency", "64", "--backlog", "5"), ("--lost",)),
    Benchmark("upstream_client", "Upstream HTTP client", "bench/upstream_client.py", ("--requests", "160"), ()),
    Benchmark("isolation", "Isolation between teams", "bench/isolation.py",
              ("--requests", "80", "--rounds", "1", "--models", "2000"), ()),
    Benchmark("routing", "Routing with backoff", "bench/routing.py", ("--requests", "300", "--warmup", "200"), ()),
    Benchmark("prompt_cache", "Prompt-cache optimizer", "bench/prompt_cache.py", (), ()),
    Benchmark("translation_cache", "Prompt caching through a translated door", "bench/translation_cache.py", (), ()),
    Benchmark("semantic_cache", "Semantic cache, library replay against the previous cache", "bench/semantic_cache.py",
              ("--pairs", "200"), (), quick_timeout_s=300),
    Benchmark("semantic_cache_proxy", "Semantic cache through the proxy and the library on the same pairs",
              "bench/semantic_cache_proxy.py", ("--pairs", "300"), ("--pairs", "0"), quick_timeout_s=400),
    Benchmark("compression", "Prompt compression", "bench/compression.py",
              ("--cases", "16", "--slow-cases", "4", "--sizes", "2000"), (), quick_timeout_s=240),
    Benchmark("shared_state", "Shared state across replicas", "bench/shared_state.py",
              ("--seconds", "5", "--requests", "300", "--outage-s", "3"), ()),
    Benchmark("tracing_overhead", "OpenTelemetry tracing cost", "bench/tracing_overhead.py",
              ("--requests", "200", "--rounds", "5000"), ()),
    Benchmark("startup", "Time to ready", "bench/startup.py", ("--runs", "1"), ()),
    Benchmark("engine_throughput", "Local engine: mixed traffic against HF", "bench/localengine/throughput.py",
              ("--layers", "4", "--requests", "24"), (), quick_timeout_s=300),
    Benchmark("engine_throughput_smollm2", "Local engine: mixed traffic against HF on the bundled real model (fp32)",
              "bench/localengine/throughput.py", ("--model", "smollm2-135m-instruct", "--requests", "16"),
              ("--model", "smollm2-135m-instruct", "--requests", "32"), quick_timeout_s=400),
    Benchmark("smollm2", "The bundled real model at batch 1 (fp32, int8, int4 and the GGUF file's own blocks, and over "
              "an int8 KV cache, against transformers and llama.cpp on the file and an F16 copy; --full adds bf16)",
              "bench/localengine/smollm2.py",
              ("--runs", "2", "--decode-tokens", "32", "--only", "engine fp32", "engine int8 weights",
               "engine gguf (Q4_1 kept)", "engine gguf, int8 KV", "HF transformers fp32", "llama.cpp Q4_1 (file)", "llama.cpp F16 (copy)"), (),
              quick_timeout_s=500),
    Benchmark("serve_streams", "Local engine: concurrent streams through `engine serve` against llama-cpp-python's server",
              "bench/localengine/serve_streams.py", ("--streams", "8", "--max-tokens", "64", "--quantization", "gguf"), (),
              quick_timeout_s=300),
    Benchmark("perplexity", "Local engine: quality of quantized weights (perplexity over a fixed text, the capital question)",
              "bench/localengine/perplexity.py", None, ("--threads", "1"), full_timeout_s=2400),
    Benchmark("kv_cache_quality", "Local engine: quantized KV cache (blocks at the same memory, agreement with the bf16 cache)",
              "bench/localengine/kv_cache.py", None, ("--threads", "1", "--blocks", "--agreement", "--compare-scales", "--scored", "--batch-noise"),
              full_timeout_s=3600),
    Benchmark("cpu_ops", "Local engine: its own CPU ops against a dequantized GEMM, by rows", "bench/localengine/cpu_ops.py",
              ("--repeats", "2"), ()),
    Benchmark("spec_decode", "Speculative decoding (demo model, batch 1)", "bench/localengine/spec_decode.py",
              ("--batch", "1", "--max-tokens", "128", "--repeats", "9"), ("--batch", "1", "4", "8", "--repeats", "9")),
    Benchmark("spec_decode_smollm2", "Speculative decoding (smollm2-135m-instruct, batch 1, input-grounded prompts)",
              "bench/localengine/spec_decode.py",
              ("--model", "smollm2-135m-instruct", "--max-tokens", "64", "--repeats", "1", "--only", "ngram k=8"),
              ("--model", "smollm2-135m-instruct", "--max-tokens", "192", "--repeats", "3",
               "--speculator", "smollm2-135m-instruct-speculator"), quick_timeout_s=300),
    Benchmark("step_overhead", "Local engine: Python per step", "bench/localengine/step_overhead.py",
              ("--models", "demo", "--baseline", "none", "--steps", "60", "--rounds", "1"), ("--baseline", "none")),
)


@dataclass(slots=True)
class Outcome:
    benchmark: Benchmark
    command: str
    load_before: float
    load_after: float
    seconds: float
    returncode: int | None  # None: ran out of time
    output: str
    other_cores: float | None = None  # CPU other processes used while it ran, in cores (None: not on Linux)


def load_average() -> float:
    return os.getloadavg()[0]


def cpu_seconds() -> tuple[float, float] | None:
    """(seconds the machine's CPUs were busy, seconds used by this process's finished children and their
    descendants), both since boot; None without /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user nice system idle iowait irq softirq steal: all but idle and iowait
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return busy / os.sysconf("SC_CLK_TCK"), children.ru_utime + children.ru_stime


def other_cores(before: tuple[float, float] | None, after: tuple[float, float] | None, seconds: float) -> float | None:
    """Cores' worth of CPU used by processes other than the benchmark between two `cpu_seconds()` readings."""
    if before is None or after is None or seconds <= 0:
        return None
    return max(0.0, (after[0] - before[0]) - (after[1] - before[1])) / seconds


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.machine()}, Python {platform.python_version()}"


def commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        # The page this runner rewrites is not a change to the code measured.
        page = [f":!{DOCS.relative_to(ROOT)}"] if DOCS.is_relative_to(ROOT) else []
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *page],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + (" with uncommitted changes" if dirty.strip() else "")


def run(benchmark: Benchmark, full: bool) -> Outcome:
    argv = benchmark.argv(full)
    command = shlex.join([".venv/bin/python", benchmark.script, *argv[2:]])
    timeout = benchmark.full_timeout_s if full else benchmark.quick_timeout_s
    print(f"== {benchmark.name}: {command} (at most {timeout} s)", flush=True)
    before, cpu_before, started = load_average(), cpu_seconds(), time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        returncode: int | None = done.returncode
        output = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.returncode and done.stderr else "")
    except subprocess.TimeoutExpired as exc:
        returncode = None
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    seconds = time.monotonic() - started
    outcome = Outcome(benchmark, command, before, load_average(), seconds, returncode, output, other_cores(cpu_before, cpu_seconds(), seconds))
    print(f"   {status(outcome)} in {outcome.seconds:.0f} s, load {outcome.load_before:.1f} -> {outcome.load_after:.1f}{others(outcome)}", flush=True)
    return outcome


def status(outcome: Outcome) -> str:
    if outcome.returncode is None:
        return "TIMED OUT"
    return "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"


def loaded(outcome: Outcome) -> bool:
    cores = os.cpu_count() or 1
    if outcome.other_cores is None:  # no /proc/stat: the load average, which counts the benchmark too
        return max(outcome.load_before, outcome.load_after) > cores / 2
    return outcome.other_cores > cores / 4


def others(outcome: Outcome) -> str:
    return "" if outcome.other_cores is None else f", other processes {outcome.other_cores:.2f} cores"


def key(benchmark: Benchmark, full: bool) -> str:
    """A block's marker name: a benchmark with both sizes keeps its `--full` block beside the quick
    one (a quick run must not replace the figures the docs quote); a `--full`-only one has one block."""
    return f"{benchmark.name}:full" if full and benchmark.quick is not None else benchmark.name


def block(outcome: Outcome, full: bool, when: str, revision: str) -> str:
    """One benchmark's results, between its own markers so that `--only` replaces just its block."""
    mark = " — **loaded**" if loaded(outcome) else ""
    tail = outcome.output.rstrip().splitlines()[-TAIL_LINES:]
    name = key(outcome.benchmark, full)
    return "\n".join([
        f"<!-- bench:{name} -->",
        f"### {outcome.benchmark.feature}{' (--full)' if name.endswith(':full') else ''}",
        "",
        f"`{outcome.command}` ({'--full' if full else '--quick'}, {when}, commit {revision}, {machine()}): {status(outcome)} in "
        f"{outcome.seconds:.0f} s, load average {outcome.load_before:.1f} → {outcome.load_after:.1f}{others(outcome)}{mark}",
        "",
        "```",
        *(tail or ["(no output)"]),
        "```",
        f"<!-- /bench:{name} -->",
    ])


def blocks_in(section: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for name in (key(b, full) for b in BENCHMARKS for full in (False, True)):
        opening, closing = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
        if opening in section and closing in section:
            found[name] = opening + section.split(opening, 1)[1].split(closing, 1)[0] + closing
    return found


def with_machine_unknown(block_text: str) -> str:
    """A block written before blocks named their machine says so (the page named only its latest
    run's machine then, and runs from other sessions may have had others)."""
    header = next((line for line in block_text.splitlines() if line.startswith("`")), None)
    if header is None or " cores (" in header or "machine not recorded" in header:
        return block_text
    stamped = re.sub(r"(, commit \w+)\)", r"\1, machine not recorded)", header, count=1)
    return block_text.replace(header, stamped, 1)


def render(outcomes: list[Outcome], full: bool, previous: dict[str, str]) -> str:
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    revision = commit()
    fresh = {key(outcome.benchmark, full): block(outcome, full, when, revision) for outcome in outcomes}
    blocks = []
    for b in BENCHMARKS:
        blocks.append(fresh.get(b.name) or previous.get(b.name)
                      or f"<!-- bench:{b.name} -->\n### {b.feature}\n\nnot run yet\n<!-- /bench:{b.name} -->")
        if b.quick is not None and (full_block := fresh.get(key(b, True)) or previous.get(key(b, True))):
            blocks.append(full_block)
    intro = ("Each block names the machine it ran on (machines differ between runs: compare figures within a "
             "block, where each has its baseline). A figure marked **loaded** was taken while other processes used more than a "
             "quarter of the cores (the machine's busy time less the benchmark's own): read its ratios, not its "
             "absolute times, and expect noise. The load average is shown too; a benchmark raises it by itself. A "
             "benchmark run at both sizes keeps its `--full` block (the size the docs quote) after its quick one.")
    return "\n\n".join([BEGIN, intro, *blocks, END])


def write(outcomes: list[Outcome], full: bool) -> None:
    text = DOCS.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        old, tail = rest.split(END, 1)
        previous = {name: with_machine_unknown(block_text) for name, block_text in blocks_in(old).items()}
        text = head + render(outcomes, full, previous) + tail
    else:  # first run: the generated results go right after the page's introduction
        title, _, body = text.partition("\n## ")
        text = f"{title.rstrip()}\n\n## Results from `python -m bench all`\n\n{render(outcomes, full, {})}\n\n## {body}"
    DOCS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("all", "list"))
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small runs, about 15 minutes on 2 cores (the default)")
    size.add_argument("--full", action="store_true", help="the sizes the docs quote")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these benchmarks only (see `list`)")
    parser.add_argument("--no-write", action="store_true", help="print, but leave docs/benchmarks.md alone")
    args = parser.parse_args()
    if args.command == "list":
        for benchmark in BENCHMARKS:
            print(f"{benchmark.name:20} {benchmark.feature}  ({benchmark.script}{', --full only' if benchmark.quick is None else ''})")
        return
    chosen = [b for b in BENCHMARKS if not args.only or b.name in args.only]
    full_only = [b.name for b in chosen if b.quick is None and not args.full]
    if full_only:
        print(f"--full only, their blocks kept as they are: {', '.join(full_only)}", flush=True)
        chosen = [b for b in chosen if b.name not in full_only]
    unknown = set(args.only or ()) - {b.name for b in BENCHMARKS}
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; `python -m bench list` names them")
    started = time.monotonic()
    outcomes: list[Outcome] = []
    for benchmark in chosen:
        outcomes.append(run(benchmark, args.full))
        if not args.no_write:
            write(outcomes[-1:], args.full)  # each block as it finishes: a run cut short keeps what it measured
    print(f"{len(outcomes)} benchmarks in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    if args.no_write:
        print(render(outcomes, args.full, {}))
    else:
        print(f"rewrote the results in {DOCS.relative_to(ROOT)}")
    if any(outcome.returncode != 0 for outcome in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
