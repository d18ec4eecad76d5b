"""Prompt compression benchmark: answer retention, token reduction, compression time, and TTFT.

    .venv/bin/python -m bench.compression [--questions 200] [--ratio 0.5] [--scorer static]

Question set (built offline, deterministic from --seed): documents of 2k/4k/8k/16k tokens assembled
from Python's own documentation topics (`pydoc_data.topics`, shipped with the interpreter); one
prose sentence of the document is the answer-bearing sentence, and the question names about half of
its content words, a third of them ("What does the documentation say about ...?"), so scoring must find it among
thousands of tokens of related Python prose (the distractors are the other topics). A question
counts as retained when the answer-bearing sentence is still in the compressed document verbatim.

TTFT: the same requests (document + question as an Anthropic request) through TeamRuntime against
the emulator's realistic latency model (TTFT grows 0.05 ms per uncached input token), with
compression off and on, same run. Numbers go to docs/compression.md.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sdk.compression import extractive, tokens
from sdk.compression.scoring import score_static, static_vectors, words
from sdk.compression.splitting import split_units

SIZES = (2000, 4000, 8000, 16000)


@dataclass(frozen=True)
class Question:
    document: str
    answer: str
    question: str
    size: int


def _topics() -> list[str]:
    from pydoc_data.topics import topics

    return [text for _, text in sorted(topics.items()) if len(text) > 400]


def _candidates(text: str) -> list[str]:
    """Prose sentences that can carry an answer: 12–60 words, not code, with enough content words."""
    units = split_units(text)
    out = []
    for unit in units:
        sentence = unit.text(text)
        n = len(sentence.split())
        if not unit.code and 12 <= n <= 60 and sentence[-1:] in ".!?" and len(set(words(sentence))) >= 8:
            out.append(sentence)
    return out


def build_questions(count: int, seed: int) -> list[Question]:
    rng = random.Random(seed)
    topics = _topics()
    questions = []
    while len(questions) < count:
        size = SIZES[len(questions) % len(SIZES)]
        home = rng.choice(topics)
        candidates = _candidates(home)
        if not candidates:
            continue
        answer = rng.choice(candidates)
        content = sorted(set(words(answer)) - {"python"})
        asked = rng.sample(content, max(3, len(content) // 3))
        rng.shuffle(asked)
        parts = [home]
        while tokens.count("\n\n".join(parts)) < size:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(topics))
        document = tokens.decode(tokens.encode("\n\n".join(parts))[: size * 2])  # bound the 16k case
        if answer not in document:
            continue
        questions.append(Question(document, answer, f"What does the documentation say about {' '.join(asked)}?", size))
    return questions


def evaluate(questions: list[Question], budget: extractive.Budget) -> dict[str, float]:
    kept = before = after = 0
    per_4k_ms: list[float] = []
    refused = 0
    for q in questions:
        started = time.perf_counter()
        prepared = extractive.prepare(q.document)
        outcome = extractive.finish(prepared, score_static(q.question, prepared.units), budget)
        elapsed = time.perf_counter() - started
        per_4k_ms.append(elapsed * 1000 * 4000 / max(1, outcome.before))
        refused += bool(outcome.refused)
        kept += q.answer in outcome.text
        before += outcome.before
        after += outcome.after
    return {
        "retention": kept / len(questions),
        "reduction": 1 - after / before,
        "refused": refused / len(questions),
        "ms_per_4k_p50": statistics.median(per_4k_ms),
        "ms_per_4k_p90": statistics.quantiles(per_4k_ms, n=10)[-1],
    }


async def ttft(questions: list[Question], ratio: float) -> dict[str, float]:
    """Median TTFT through TeamRuntime against the realistic emulator, compression off vs on."""
    from emulator.app import EmulatorConfig
    from emulator.testing import running_emulator
    from sdk.policy import load_policy
    from sdk.runtime import TeamRuntime
    from sdk.types import Endpoint, LLMRequest
    from tests.helpers import write_policy

    results = {}
    with running_emulator(EmulatorConfig.realistic()) as emu, tempfile.TemporaryDirectory() as tmp:
        for name, extra in (("off", "compression: {enabled: false}\n"), ("on", f"compression: {{enabled: true, protect: [], documents: {{ratio: {ratio}}}}}\n")):
            path = write_policy(Path(tmp), f"bench-{name}", f"key-{name}", emu.url, extra + "prompt_cache: {enabled: false}\n")
            runtime = TeamRuntime.build(load_policy(path))
            samples = []
            for i, q in enumerate(questions):
                content = [{"type": "text", "text": f"<document>\n{q.document}\n</document>"}, {"type": "text", "text": q.question}]
                body = {"model": "claude-bench", "max_tokens": 16, "stream": True, "messages": [{"role": "user", "content": content}], "metadata": {"user_id": str(i)}}
                answer, ctx = await runtime.handle(LLMRequest(Endpoint.MESSAGES, body))
                async for _ in answer.events:
                    pass
                samples.append((ctx.timings.first_token or time.perf_counter()) - ctx.timings.start)
            results[name] = statistics.median(samples) * 1000
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=200)
    parser.add_argument("--ratio", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--ttft-questions", type=int, default=24)
    args = parser.parse_args()
    static_vectors()  # load once, outside the timings (the stage loads it on its first request)
    questions = build_questions(args.questions, args.seed)
    print(f"{len(questions)} questions, documents of {'/'.join(str(s) for s in SIZES)} tokens, ratio {args.ratio}")
    for protect in (("numbers", "identifiers", "entities"), ()):
        budget = extractive.Budget(args.ratio, None, True, "[…]", protect)
        row = evaluate(questions, budget)
        print(f"protect={','.join(protect) or 'none':34} " + "  ".join(f"{k}={v:.3f}" for k, v in row.items()))
    by_size = {size: [q for q in questions if q.size == size] for size in SIZES}
    budget = extractive.Budget(args.ratio, None, True, "[…]", ())
    for size, subset in by_size.items():
        row = evaluate(subset, budget)
        print(f"  {size:>5} tokens, protect=none: " + "  ".join(f"{k}={v:.3f}" for k, v in row.items()))
    if args.ttft_questions:
        sample = [q for q in questions if q.size == 16000][: args.ttft_questions]
        result = asyncio.run(ttft(sample, args.ratio))
        print(f"TTFT p50 over {len(sample)} 16k-token requests (realistic emulator): off={result['off']:.1f} ms  on={result['on']:.1f} ms")


if __name__ == "__main__":
    main()
