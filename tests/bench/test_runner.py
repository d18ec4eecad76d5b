"""`python -m bench all`: each run replaces only its own benchmarks' blocks in docs/benchmarks.md."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

runner = importlib.import_module("bench.__main__")


def outcome(name: str, output: str, load: float = 0.1, returncode: int | None = 0):
    benchmark = next(b for b in runner.BENCHMARKS if b.name == name)
    return runner.Outcome(benchmark, f"python {benchmark.script}", load, load, 1.0, returncode, output)


def test_first_run_adds_the_section_and_a_later_run_replaces_only_its_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\nIntro.\n\n## Older notes\n\nkept\n")
    monkeypatch.setattr(runner, "DOCS", docs)
    runner.write([outcome("routing", "routing ratio 1.50x"), outcome("startup", "ready in 2.0 s")], full=False)
    runner.write([outcome("routing", "routing ratio 1.70x", load=9.0)], full=True)
    text = docs.read_text()
    assert text.count(runner.BEGIN) == 1 and text.count(runner.END) == 1
    assert "routing ratio 1.70x" in text and "routing ratio 1.50x" not in text
    assert "ready in 2.0 s" in text  # the benchmark not rerun keeps its block
    assert "**loaded**" in text.split("<!-- bench:routing -->")[1].split("<!-- /bench:routing -->")[0]
    assert text.index("## Results from `python -m bench all`") < text.index("## Older notes")
    assert "kept" in text


def test_failures_and_time_outs_are_reported() -> None:
    section = runner.render([outcome("routing", "Traceback ...", returncode=1), outcome("startup", "", returncode=None)], False, {})
    assert "FAILED (exit 1)" in section and "TIMED OUT" in section and "(no output)" in section
