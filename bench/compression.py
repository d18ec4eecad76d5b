"""Prompt compression benchmark: needles kept, token reduction, pieces refused, time per 4,000 tokens.

    .venv/bin/python -m bench.compression [--cases 96] [--sizes 2000,4000,8000] [--settings default,none,broad]

Cases (deterministic from --seed): a document of real prose (bench/compression_corpus.py: Python's
documentation topics, standard-library docstrings, man pages, licence texts) with one invented fact
(the needle) planted at a random sentence boundary, and a question that paraphrases the fact. Each
case is sent in every position an application puts context, as an Anthropic request:
- `system`: instructions, "Reference material:", the document; the question is the user turn;
- `earlier_turns`: "Reference documents:" + the document as a user turn, an assistant
  acknowledgement, then the question;
- `latest_turn`: one plain-string user message, the document then the question (rotating through
  `Question: ...`, a trailing paragraph, `Q: ... A:`, and a last sentence with no blank line);
- `document_block`: an Anthropic `document` block and the question as a second text block.
Each request goes through the team's real Compressor (sdk/compression/compressor.py, built from a
policy as the stage builds it). A needle counts as kept when its sentence is in the compressed
request verbatim. Reduction is over all tokens of system + messages. Time is the Compressor's wall
time per request, scaled to 4,000 tokens, and its CPU time (all threads; what a request costs
when the machine is not shared, since these machines are).

Settings compare protection and scorers: `default` (the policy defaults), `none` (`protect: []`),
`broad` (the first version's default: numbers, identifiers, entities), `contextual` (full MiniLM;
`contextual_unprotected` without protection, to see what the scorer alone finds),
`tokens` (token pruning with the demo model on top of the defaults), `ratio=X` (default with
documents.ratio X). Settings the code under test rejects are skipped (so the same file measures the
previous version).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.compression_corpus import SOURCES, Needle, needle, plant, sections
from sdk.compression import tokens

POSITIONS = ("system", "earlier_turns", "latest_turn", "document_block")
QUESTION_FORMATS = ("Question: {q}", "{q}", "Q: {q}\nA:", "")  # "": the question ends the last paragraph
SETTINGS: dict[str, dict[str, Any]] = {
    "default": {},
    "none": {"protect": []},
    "broad": {"protect": ["numbers", "identifiers", "entities"]},
    "contextual": {"documents": {"scorer": "contextual"}},
    "contextual_unprotected": {"protect": [], "documents": {"scorer": "contextual"}},
    "tokens": {"token_pruning": {"enabled": True}},
}


@dataclass(frozen=True)
class Case:
    source: str
    size: int
    document: str
    needle: Needle
    format: int


def build_cases(count: int, sizes: list[int], seed: int, kinds: tuple[str, ...] = ("named", "unnamed")) -> tuple[list[Case], list[str]]:
    rng = random.Random(seed)
    available = [s for s in SOURCES if sections(s)]
    cases = []
    for i in range(count):
        source = available[i % len(available)]
        size = sizes[(i // len(available)) % len(sizes)]
        texts = sections(source)
        start = rng.randrange(len(texts))
        parts: list[str] = []
        while tokens.count("\n\n".join(parts)) < size:
            parts.append(texts[(start + len(parts)) % len(texts)])
        paragraphs = "\n\n".join(parts).split("\n\n")
        document = ""
        for paragraph in paragraphs:  # cut at a paragraph boundary near the size
            if document and tokens.count(document) >= size:
                break
            document = f"{document}\n\n{paragraph}" if document else paragraph
        fact = needle(rng, kinds)
        cases.append(Case(source, size, plant(document, fact.sentence, rng), fact, i % len(QUESTION_FORMATS)))
    return cases, [s for s in SOURCES if s not in available]


def request(case: Case, position: str) -> dict[str, Any]:
    q = case.needle.question
    body: dict[str, Any] = {"model": "claude-bench", "max_tokens": 64}
    if position == "system":
        body["system"] = ("You are a support assistant for our engineering organisation. Answer using only the reference "
                          "material below, and say so when it does not contain the answer.\n\nReference material:\n\n" + case.document)
        body["messages"] = [{"role": "user", "content": q}]
    elif position == "earlier_turns":
        body["messages"] = [
            {"role": "user", "content": "Reference documents:\n\n" + case.document},
            {"role": "assistant", "content": "Thanks, I have read the documents. What would you like to know?"},
            {"role": "user", "content": q},
        ]
    elif position == "latest_turn":
        form = QUESTION_FORMATS[case.format]
        text = f"Here are the relevant documents:\n\n{case.document}\n\n{form.format(q=q)}" if form else f"{case.document} {q}"
        body["messages"] = [{"role": "user", "content": text}]
    else:
        block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": case.document}}
        body["messages"] = [{"role": "user", "content": [block, {"type": "text", "text": q}]}]
    return body


def compressor(settings: dict[str, Any], tmp: Path):
    """The team's Compressor, built from a policy exactly as the stage is (None: the code rejects the settings)."""
    from sdk.compression.stage import build_compression
    from sdk.errors import PolicyError
    from sdk.policy import load_policy
    from sdk.services import Services

    policy = {
        "team": "bench",
        "providers": {"emu": {"kind": "anthropic", "base_url": "http://127.0.0.1:9", "api_key": "unused"}},
        "routes": [{"match": {"model": "*"}, "targets": [{"provider": "emu"}]}],
        "compression": {"enabled": True, **settings},
    }
    path = tmp / f"bench-{abs(hash(json.dumps(settings, sort_keys=True)))}.yaml"
    path.write_text(json.dumps(policy))
    try:
        stage = build_compression(load_policy(path), Services(data_dir=tmp / "data"))
    except PolicyError as error:
        print(f"  skipped: {error}".splitlines()[0])
        return None
    assert stage is not None, "the policy enables compression"
    return stage.compressor


def _sent_text(body: dict[str, Any]) -> str:
    return json.dumps({"system": body.get("system"), "messages": body["messages"]}, ensure_ascii=False)


async def evaluate(run, cases: list[Case], position: str, show_misses: bool = False) -> dict[str, float]:
    kept = before = after = refused = left = 0
    per_4k: list[float] = []
    cpu_4k: list[float] = []
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for case in cases:
        body = request(case, position)
        started, cpu = time.perf_counter(), time.process_time()
        result = await run(body)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        report = result.report
        per_4k.append(elapsed * 1000 * 4000 / max(1, report.before))
        cpu_4k.append(cpu * 1000 * 4000 / max(1, report.before))
        text = _sent_text(result.body)
        hit = json.dumps(case.needle.sentence, ensure_ascii=False)[1:-1] in text
        assert json.dumps(case.needle.question, ensure_ascii=False)[1:-1] in text, "the question must reach the provider unchanged"
        kept += hit
        if not hit and show_misses:
            print(f"    missed ({case.source}, {case.size}, {case.needle.kind}): {case.needle.sentence!r} <- {case.needle.question!r}; left={getattr(report, 'left', {})}")
        by_kind[case.needle.kind][0] += hit
        by_kind[case.needle.kind][1] += 1
        before += report.before
        after += report.after
        refused += report.refused
        left += sum(n for why, n in getattr(report, "left", {}).items() if not why.endswith("protected_items"))
    return {
        "kept": kept / len(cases),
        "reduction": 1 - after / before,
        "refused": refused / len(cases),
        "left": left / len(cases),
        "ms_p50": statistics.median(per_4k),
        "ms_p90": statistics.quantiles(per_4k, n=10)[-1] if len(per_4k) > 1 else per_4k[0],
        "cpu_ms_p50": statistics.median(cpu_4k),
        **{f"kept_{kind}": k / n for kind, (k, n) in sorted(by_kind.items())},
    }


def _settings(names: list[str]) -> dict[str, dict[str, Any]]:
    chosen: dict[str, dict[str, Any]] = {}
    for name in names:
        if name.startswith("ratio="):
            chosen[name] = {"documents": {"ratio": float(name.split("=", 1)[1])}}
        else:
            chosen[name] = SETTINGS[name]
    return chosen


async def main_async(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    cases, missing = build_cases(args.cases, sizes, args.seed, tuple(args.needles.split(",")))
    counts: defaultdict[str, int] = defaultdict(int)
    for case in cases:
        counts[case.source] += 1
    print(f"{len(cases)} cases ({', '.join(f'{s}: {n}' for s, n in counts.items())}; missing sources: {missing or 'none'}), "
          f"documents of {args.sizes} tokens, seed {args.seed}")
    positions = args.positions.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for name, settings in _settings(args.settings.split(",")).items():
            print(f"[{name}] {json.dumps(settings)}")
            built = compressor(settings, Path(tmp))
            if built is None:
                continue
            subset = cases[: args.slow_cases] if name.startswith(("contextual", "tokens")) else cases
            await built.run(request(subset[0], "system"))  # load MiniLM's table (and the demo model) outside the timings
            for position in positions:
                row = await evaluate(built.run, subset, position, args.show_misses)
                print(f"  {position:15} " + "  ".join(f"{k}={v:.3f}" if not k.startswith("ms") else f"{k}={v:.1f}" for k, v in row.items()))
            if args.by_source:
                for source in SOURCES:
                    part = [c for c in subset if c.source == source]
                    if part:
                        row = await evaluate(built.run, part, "latest_turn")
                        print(f"    latest_turn, {source:10} " + "  ".join(f"{k}={v:.3f}" for k, v in row.items() if not k.startswith("ms")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=96)
    parser.add_argument("--sizes", default="2000,4000,8000")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--settings", default="default,none,broad")
    parser.add_argument("--positions", default=",".join(POSITIONS))
    parser.add_argument("--slow-cases", type=int, default=24, help="cases for the contextual and token-pruning settings")
    parser.add_argument("--by-source", action="store_true", help="also break the latest_turn position down by source")
    parser.add_argument("--needles", default="named,unnamed", help="needle kinds: named (the question keeps the subject's name or code), unnamed (no shared word)")
    parser.add_argument("--show-misses", action="store_true", help="print each needle that was not kept")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
