"""Token-level pruning: drop the words a small language model finds least surprising.

The local engine's offline API does not return prompt log-probabilities, so surprisal comes from the
bundled demo model (localengine/demo/demo, a 4-layer Llama trained on Python's own sources and
docstrings) run directly with torch on the CPU, in windows of the 128 tokens it was trained on.
Whole words are dropped (a word's score is the mean surprisal of its tokens), never inside code
blocks, never the omission marker, never a word the question uses (with `query` protection), and
never inside a unit that holds a protected item: those sentences carry the specific facts, and stay
verbatim. It runs after extractive pruning, on the sentences that were kept, in the compression
worker thread.
"""

from __future__ import annotations

import functools
import re
import threading
from pathlib import Path
from typing import Any

from sdk.compression import tokens
from sdk.compression.extractive import Budget, Outcome
from sdk.compression.protection import unit_items
from sdk.compression.scoring import words
from sdk.compression.splitting import split_units
from sdk.services import MODEL_LOAD_LOCK

WINDOW = 128  # the demo model's training length; longer windows extrapolate badly
_WORD = re.compile(r"\S+")


def demo_model_path() -> Path:
    import localengine.demo

    return Path(localengine.demo.__file__).resolve().parent / "demo"


class _Model:
    def __init__(self, path: Path):
        import torch
        from tokenizers import Tokenizer
        from transformers import LlamaForCausalLM

        self.torch = torch
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.model = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
        self.lock = threading.Lock()  # one forward at a time: the model is shared by every team

    def surprisal(self, text: str) -> tuple[list[float], list[tuple[int, int]]]:
        """−log p of each token given the tokens before it in its window, and each token's character span."""
        torch = self.torch
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets
        if not ids:
            return [], []
        # One batched forward over all windows (the last one padded): far fewer intra-op thread
        # handoffs than one call per window, which matters on a busy CPU.
        windows = [ids[start : start + WINDOW] for start in range(0, len(ids), WINDOW)]
        batch = torch.tensor([w + [0] * (WINDOW - len(w)) for w in windows])
        with self.lock, torch.inference_mode():
            logprobs = torch.log_softmax(self.model(batch).logits.float(), dim=-1)
            picked = -logprobs[:, :-1].gather(2, batch[:, 1:, None])[..., 0]
        scores: list[float] = []
        for row, window in zip(picked.tolist(), windows, strict=True):
            scores.append(float("inf"))  # a window's first token has no context: never the cheapest
            scores.extend(row[: len(window) - 1])
        return scores, list(offsets)


@functools.cache
def _model() -> _Model:
    with MODEL_LOAD_LOCK:
        return _Model(demo_model_path())


class TokenPruner:
    def __init__(self, ratio: float, protect: tuple[str, ...]):
        self.ratio = ratio
        self.protect = protect

    @staticmethod
    def load() -> None:
        """Load the demo model now (the proxy's readiness), not on the first pruned request."""
        _model()

    def prune(self, outcome: Outcome, budget: Budget, query: str) -> Outcome:
        """Drop words of `outcome.text` (see the module docstring for what is never dropped)."""
        text = outcome.text
        units = split_units(text)
        unit_words = [set(words(u.text(text))) if not u.code else set() for u in units]
        items = unit_items(text, [u.start for u in units], unit_words, self.protect, query, "")
        blocked = [(u.start, u.end) for u, held in zip(units, items, strict=True) if u.code or held]
        blocked += [(m.start(), m.end()) for m in re.finditer(re.escape(budget.marker), text)]
        asked = set(words(query)) if "query" in self.protect else set()
        words_at = [m.span() for m in _WORD.finditer(text)]
        eligible = [i for i, (s, e) in enumerate(words_at) if not any(s < be and bs < e for bs, be in blocked) and not (asked & set(words(text[s:e])))]
        if not eligible:
            return outcome
        scores, offsets = _model().surprisal(text)
        word_scores = _word_scores(words_at, scores, offsets)
        drop_count = int(len(eligible) * (1 - self.ratio))
        dropped = set(sorted(eligible, key=lambda i: (word_scores[i], i))[:drop_count])
        if not dropped:
            return outcome
        pruned = _without(text, words_at, dropped)
        return Outcome(pruned, outcome.before, tokens.count(pruned), [], [*outcome.removed, *(text[slice(*words_at[i])] for i in sorted(dropped))])


def _word_scores(words: list[tuple[int, int]], scores: list[float], offsets: list[Any]) -> list[float]:
    sums = [0.0] * len(words)
    counts = [0] * len(words)
    w = 0
    for score, (s, e) in zip(scores, offsets, strict=True):
        while w < len(words) and words[w][1] <= s:
            w += 1
        if w < len(words) and words[w][0] < e:
            sums[w] += score
            counts[w] += 1
    return [sums[i] / counts[i] if counts[i] else float("inf") for i in range(len(words))]


def _without(text: str, words: list[tuple[int, int]], dropped: set[int]) -> str:
    """The text minus the dropped words; a dropped word's following whitespace goes too, unless it
    holds a line break (layout is kept)."""
    parts, pos = [], 0
    for i, (s, e) in enumerate(words):
        if i in dropped:
            parts.append(text[pos:s])
            following_end = words[i + 1][0] if i + 1 < len(words) else len(text)
            gap = text[e:following_end]
            pos = e if "\n" in gap else following_end
    parts.append(text[pos:])
    return "".join(parts)
