"""`python -m bench all`: each run replaces only its own benchmarks' blocks in docs/benchmarks.md."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

runner = importlib.import_module("bench.__main__")


def outcome(name: str, output: str, load: float = 0.1, returncode: int | None = 0):
    benchmark = next(b for b in runner.BENCHMARKS if b.name == name)
    return runner.Outcome(benchmark, f"python {benchmark.script}", load, load, 1.0, returncode, output)


def _block(text: str, name: str) -> str:
    return text.split(f"<!-- bench:{name} -->")[1].split(f"<!-- /bench:{name} -->")[0]


def test_first_run_adds_the_section_and_a_later_run_replaces_only_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nIntro.\n\n## Older notes\n\nkept\n")
    monkeypatch.setattr(runner, "DOCS", docs)
    runner.write([outcome("routing", "routing ratio 1.50x"), outcome("startup", "ready in 2.0 s")], full=False)
    runner.write([outcome("routing", "routing ratio 1.40x", load=9.0)], full=False)
    text = docs.read_text()
    assert text.count(runner.BEGIN) == 1 and text.count(runner.END) == 1
    assert "routing ratio 1.40x" in text and "routing ratio 1.50x" not in text
    assert "ready in 2.0 s" in text  # the benchmark not rerun keeps its block
    assert "**loaded**" in _block(text, "routing")
    assert text.index("## Results from `python -m bench all`") < text.index("## Older notes")
    assert "kept" in text


def test_a_full_run_keeps_its_own_block_beside_the_quick_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The docs quote --full figures: a later quick run replaces the quick block only."""
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nIntro.\n")
    monkeypatch.setattr(runner, "DOCS", docs)
    runner.write([outcome("routing", "routing ratio 1.70x"), outcome("perplexity", "fp32 16.49")], full=True)
    runner.write([outcome("routing", "routing ratio 1.50x")], full=False)
    runner.write([outcome("routing", "routing ratio 1.45x")], full=False)
    text = docs.read_text()
    assert "1.70x" in _block(text, "routing:full") and "--full" in _block(text, "routing:full")
    assert "1.45x" in _block(text, "routing") and "1.50x" not in text
    assert text.index("<!-- /bench:routing -->") < text.index("<!-- bench:routing:full -->")  # beside its quick block
    assert "fp32 16.49" in _block(text, "perplexity") and "perplexity:full" not in text  # --full only: one block


def test_failures_and_time_outs_are_reported() -> None:
    section = runner.render([outcome("routing", "Traceback ...", returncode=1), outcome("startup", "", returncode=None)], False, {})
    assert "FAILED (exit 1)" in section and "TIMED OUT" in section and "(no output)" in section


def test_loaded_means_other_processes_used_the_cpu_not_a_high_load_average(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 2)
    busy_itself = outcome("routing", "x", load=2.4)
    busy_itself.other_cores = 0.1  # the benchmark kept both cores busy; nothing else ran
    competed = outcome("routing", "x", load=0.3)
    competed.other_cores = 0.9
    assert not runner.loaded(busy_itself) and runner.loaded(competed)
    assert "other processes 0.90 cores — **loaded**" in runner.block(competed, False, "now", "abc")
    assert runner.loaded(outcome("routing", "x", load=2.4))  # without /proc/stat: the load average decides


def test_a_benchmarks_own_cpu_and_its_childrens_is_its_own() -> None:
    before = runner.cpu_seconds()
    if before is None:
        pytest.skip("no /proc/stat on this system")
    burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 0.5: pass"
    subprocess.run([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"], check=True)
    after = runner.cpu_seconds()
    assert after is not None
    assert after[1] - before[1] >= 0.5  # the grandchild's CPU counts as the benchmark's
    assert after[0] - before[0] >= 0.5  # and as the machine's busy time
    assert runner.other_cores(before, after, 1.0) >= 0.0


def test_every_block_names_its_machine_and_older_blocks_say_it_was_not_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Machines differ between runs: a block says which one it ran on; one written before blocks
    did says the machine was not recorded, and rewriting the page again changes nothing."""
    docs = tmp_path / "benchmarks.md"
    older = "`python bench/routing.py` (--quick, 2026-11-20 10:00 UTC, commit abc1234): ok in 3 s, load average 0.1 → 0.2"
    docs.write_text(f"# Benchmarks\n\n{runner.BEGIN}\n\nMachine: 2 cores (Old CPU). A figure marked ...\n\n"
                    f"<!-- bench:routing -->\n### Routing\n\n{older}\n\n```\nratio 1.5x\n```\n<!-- /bench:routing -->\n\n"
                    f"{runner.END}\n")
    monkeypatch.setattr(runner, "DOCS", docs)
    monkeypatch.setattr(runner, "machine", lambda: "2 cores (New CPU), Linux x86_64, Python 3.11.7")
    runner.write([outcome("startup", "ready in 2.0 s")], full=False)
    text = docs.read_text()
    assert "commit abc1234, machine not recorded): ok in 3 s" in _block(text, "routing")
    assert "2 cores (New CPU)" in _block(text, "startup") and "Old CPU" not in text
    runner.write([outcome("startup", "ready in 1.9 s")], full=False)
    assert _block(docs.read_text(), "routing") == _block(text, "routing")
