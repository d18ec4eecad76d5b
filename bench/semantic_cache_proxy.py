"""The semantic cache as a user meets it: held-out QQP pairs through the proxy, beside the library (not a test).

    nice -n 10 .venv/bin/python bench/semantic_cache_proxy.py [--population pairs|components] [--pairs 400]
                                                              [--data qqp-dev.jsonl.gz] [--min-precision X]

Both paths replay exactly the same requests, in the same order, at the shipped defaults
(`semantic_cache: {enabled: true}`, nothing else set): each distinct first question is asked once
(its answer stored), then each second question is asked; an answer to a missed question is stored
too, as a user's would be. "proxy" is the Slipstream proxy over HTTP (official Anthropic client,
the emulator upstream); "library" is `ResponseCache` called directly, as bench/semantic_cache.py does.
A hit is right when the question it was stored for is the same text or a labelled duplicate
(transitively, within the pairs replayed); recall is over lookups that have such an entry.

Populations — the reason the two published figures differed (docs/semantic-cache.md, "Measured through
the proxy"):
- `components`: the held-out sample as shipped, whole connected components of the question graph.
  Popular questions recur: many lookups were asked before word for word (an exact-tier hit, always
  right), and a duplicate cluster offers several right entries.
- `pairs` (default): one pair per component — independent pairs, as a random sample of QQP gives
  them and as a user measuring from outside meets them. With `--data`, a seeded random sample of the
  full set's held-out `test` split instead.
Recall is printed whole and split into word-for-word repeats and paraphrases. Precision is printed
twice: by QQP's labels, and by reading — each semantic hit looked up in `data/qqp-read-heldout.jsonl`
(hits of the sample's independent pairs judged by a reader blind to the label, sdk/cache/readings.py;
exact hits are right by construction); hits no reading covers are counted and left out. The last
column is recall over the labelled duplicates a reader confirmed (`data/qqp-read-duplicates.jsonl`:
90 of the sample's labelled duplicates judged blind; about one in nine asks another question), so
that label noise on the duplicate side is seen too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPOSITORY))

from sdk.cache import qqp, readings  # noqa: E402  (after the path: the script runs from a checkout)

MODEL = "claude-sonnet-4-5"
KEY = "sk-bench"


def body(question: str) -> dict[str, Any]:
    # What a plain client sends: the emulator's answer (48 tokens) ends on its own well under 256, so it is stored.
    return {"model": MODEL, "max_tokens": 256, "temperature": 0, "messages": [{"role": "user", "content": question}]}


@dataclass(frozen=True, slots=True)
class Reply:
    status: str  # miss | exact-hit | semantic-hit
    key: str | None  # x-slipstream-cache-key: the entry served, or the one a miss stored (None: not stored)


def replay(pairs: list[qqp.Pair], ask: Callable[[str], Reply]) -> list[tuple[str, str | None, str]]:
    """(lookup, question whose entry was served or None, status) per second question."""
    stored_for: dict[str, str] = {}  # entry key → the question whose answer it holds
    for question in dict.fromkeys(p.a for p in pairs):
        reply = ask(question)
        if reply.status == "miss" and reply.key:
            stored_for[reply.key] = question
    rows: list[tuple[str, str | None, str]] = []
    for pair in pairs:
        reply = ask(pair.b)
        if reply.status == "miss":
            if reply.key:
                stored_for[reply.key] = pair.b
            rows.append((pair.b, None, reply.status))
        else:
            rows.append((pair.b, stored_for.get(reply.key or "", "<entry of another run>"), reply.status))
    return rows


def through_proxy(pairs: list[qqp.Pair], min_precision: float | None, folder: Path) -> list[tuple[str, str | None, str]]:
    import anthropic

    from emulator.testing import running_emulator
    from gateway.testing import running_proxy

    os.environ["SLIPSTREAM_DATA_DIR"] = str(folder / "data")
    cache = "{enabled: true}" if min_precision is None else f"{{enabled: true, min_precision: {min_precision}}}"
    with running_emulator() as emulator:
        (folder / "bench.yaml").write_text(
            f"""team: bench
api_keys: [{{value: "{KEY}"}}]
providers:
  claude: {{kind: anthropic, base_url: "{emulator.url}", api_key: "up-anthropic"}}
routes:
  - match: {{model: "claude-*"}}
    targets: [{{provider: claude}}]
semantic_cache: {cache}
"""
        )
        with running_proxy([folder / "bench.yaml"]) as proxy:
            client = anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0, timeout=120)

            def ask(question: str) -> Reply:
                sent = body(question)  # temperature is no keyword of this client's create(): sent as extra_body
                raw = client.messages.with_raw_response.create(model=sent["model"], max_tokens=sent["max_tokens"], messages=sent["messages"],
                                                               extra_body={"temperature": sent["temperature"]})
                return Reply(raw.headers["x-slipstream-cache"], raw.headers.get("x-slipstream-cache-key"))

            return replay(pairs, ask)


def through_library(pairs: list[qqp.Pair], min_precision: float | None, folder: Path) -> list[tuple[str, str | None, str]]:
    from sdk.cache.keys import cache_keys
    from sdk.policy import SemanticCachePolicy
    from sdk.services import Services
    from sdk.types import Endpoint, LLMRequest

    config = SemanticCachePolicy(enabled=True) if min_precision is None else SemanticCachePolicy(enabled=True, min_precision=min_precision)
    cache = Services(data_dir=folder / "library").response_cache()
    loop = asyncio.new_event_loop()

    def ask(question: str) -> Reply:
        keys = cache_keys("bench", LLMRequest(Endpoint.MESSAGES, body(question)))
        found = loop.run_until_complete(cache.lookup("bench", keys, config.exact, config.semantic, config.min_precision))
        if found.entry is not None:
            return Reply(found.status, found.entry.exact_key)
        answer = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": question}], "stop_reason": "end_turn", "usage": {}}
        loop.run_until_complete(cache.put("bench", keys, "bench/model", answer, found.vector, config))
        return Reply("miss", keys.exact)

    try:
        return replay(pairs, ask)
    finally:
        loop.close()
        cache.close()


@dataclass(frozen=True, slots=True)
class Figures:
    hits: int
    right: int
    answerable: int
    precision: float
    recall: float
    repeat_recall: float | None  # of answerable lookups asked before word for word (an exact-tier hit); None: there were none
    paraphrase_recall: float | None  # of the other answerable lookups


def figures(rows: list[tuple[str, str | None, str]], pairs: list[qqp.Pair]) -> Figures:
    workload = qqp.Workload.of(pairs)
    asked = {qqp.normalize(p.a) for p in pairs}  # every question asked before this lookup, in replay order
    marks = []  # (answerable, right, asked before word for word) per lookup
    for question, served, _ in rows:
        marks.append((workload.answerable(question), served is not None and workload.correct(question, served), qqp.normalize(question) in asked))
        asked.add(qqp.normalize(question))
    hits = sum(served is not None for _, served, _ in rows)
    right = sum(r for _, r, _ in marks)
    answerable = sum(a for a, _, _ in marks)

    def recall_of(repeat: bool) -> float | None:
        group = [r for a, r, same in marks if a and same == repeat]
        return sum(group) / len(group) if group else None

    return Figures(hits, right, answerable, right / max(hits, 1), right / max(answerable, 1), recall_of(True), recall_of(False))


def _verdict(question: str, served: str, status: str, judged: dict[tuple[str, str], bool]) -> bool | None:
    """Whether a hit was right by reading (None: nobody judged it); exact hits are right by construction."""
    return True if status == "exact-hit" else judged.get((question, served))


def read_precision(rows: list[tuple[str, str | None, str]], judged: dict[tuple[str, str], bool]) -> tuple[int, int, int]:
    """(right by reading, hits judged, hits no reading covers)."""
    same = covered = missing = 0
    for question, served, status in rows:
        if served is None:
            continue
        verdict = _verdict(question, served, status, judged)
        if verdict is None:
            missing += 1
        else:
            covered += 1
            same += verdict
    return same, covered, missing


def read_recall(rows: list[tuple[str, str | None, str]], judged: dict[tuple[str, str], bool]) -> tuple[int, int]:
    """(lookups served an answer judged the same, lookups replayed) over the labelled duplicates a reader
    confirmed (`data/qqp-read-duplicates.jsonl`): recall where QQP's duplicate labels are trusted."""
    confirmed = readings.confirmed_duplicates()
    last = {question: (served, status) for question, served, status in rows if question in confirmed}  # a question asked twice: its last answer
    right = sum(served is not None and bool(_verdict(question, served, status, judged)) for question, (served, status) in last.items())
    return right, len(last)


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def population(kind: str, size: int, data: Path | None) -> list[qqp.Pair]:
    if data is not None:
        test = qqp.split(qqp.load_pairs(qqp.full_set(data)))["test"]
        chosen = test if kind == "components" else random.Random(qqp.SEED).sample(test, min(size or len(test), len(test)))
    else:
        sample = qqp.load_pairs(qqp.HELD_OUT_SAMPLE)
        chosen = sample if kind == "components" else readings.independent(sample)
    return chosen[:size] if size else chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--population", choices=("pairs", "components"), default="pairs")
    parser.add_argument("--pairs", type=int, default=400, help="replay the first N pairs of the population (0: all)")
    parser.add_argument("--data", type=Path, default=os.environ.get("SLIPSTREAM_QQP"), help="the full QQP development set (default: the repository's held-out sample)")
    parser.add_argument("--min-precision", type=float, help="set in the policy (default: the shipped default)")
    args = parser.parse_args()
    pairs = population(args.population, args.pairs, args.data)
    print(f"{len(pairs)} held-out pairs ({args.population}), {sum(p.duplicate for p in pairs)} labelled duplicates;"
          f" min_precision {args.min_precision or 'shipped default'}", flush=True)
    print("| path | hits (exact / semantic) | precision (QQP labels) | precision (read; hits not read) | recall | recall: repeats / paraphrases |"
          " recall (duplicates confirmed by reading) |")
    print("|---|---|---|---|---|---|---|")
    judged = readings.judged(readings.load(readings.HELD_OUT))
    for name, run in (("library", through_library), ("proxy", through_proxy)):
        with tempfile.TemporaryDirectory() as tmp:
            rows = run(pairs, args.min_precision, Path(tmp))
        got = figures(rows, pairs)
        exact = sum(status == "exact-hit" for _, _, status in rows)
        same, covered, missing = read_precision(rows, judged)
        confirmed_right, confirmed = read_recall(rows, judged)
        print(f"| {name} | {got.hits} ({exact} / {got.hits - exact}) | {got.precision:.3f} ({got.right}/{got.hits}) |"
              f" {same / max(covered, 1):.3f} ({same}/{covered}; {missing}) |"
              f" {got.recall:.3f} ({got.right}/{got.answerable}) | {_share(got.repeat_recall)} / {_share(got.paraphrase_recall)} |"
              f" {_share(confirmed_right / confirmed if confirmed else None)} ({confirmed_right}/{confirmed}) |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
