"""Incremental detokenization and stop-string detection for one request.

Decoding only the new token would break multi-byte characters and SentencePiece's leading
spaces. With a Rust-backed (`tokenizers`) tokenizer the text comes from its `DecodeStream`, primed
with the prompt's last tokens (vLLM v1's fast path: one call into Rust per token, ~1 us, where the
window below costs two Python-level `decode` calls, ~30 us, every token of every request). Other
tokenizers, and those that clean up spaces after decoding (which a stream cannot reproduce), decode
a short window ending at the new token and keep the part past the previous window, holding back
text that ends in an incomplete character (vLLM's and TGI's slow path).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from localengine.sampling_params import SamplingParams

# Prompt tokens decoded in front of the first output tokens, for tokenizers whose output depends
# on the previous token (SentencePiece drops a leading space at the start of a decode).
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, params: SamplingParams, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.params = params
        self.ids = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        # Every token so far (the prompt's last few first), and how many of them the text shows: the
        # rest wait for the bytes that complete a character, and are decoded as they are at the end.
        self.history = list(self.ids)
        self.shown = len(self.history)
        self._undo = (0, self.shown)  # the text's length and `shown` before the last token
        backend = getattr(tokenizer, "_tokenizer", None)
        self.stream: DecodeStream | None = None
        if isinstance(backend, Tokenizer) and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self.backend = backend
            self.stream = DecodeStream(ids=self.ids, skip_special_tokens=params.skip_special_tokens)
        stops = params.stop if isinstance(params.stop, list) else []
        self.stops = stops
        # Streamed text may not end in the beginning of a stop string that could still complete.
        self.holdback = max((len(s) for s in stops), default=1) - 1

    def _decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=self.params.skip_special_tokens)
        return text

    def append(self, token_id: int, check_stop: bool = True) -> str | None:
        """Add a token; returns the stop string if the new text completes one (text is truncated).
        With `check_stop` False (before min_tokens, as in vLLM) stop strings are not looked for."""
        new = self.stream.step(self.backend, token_id) if self.stream is not None else self._window_step(token_id)
        self.history.append(token_id)
        self._undo = (len(self.text), self.shown)  # drop_last's
        if not new:
            return None
        self.shown = len(self.history)
        before = len(self.text)
        self.text += new
        return self._check_stop(before) if check_stop else None

    def drop_last(self) -> None:
        """Leave the last token out of the text: a stop token's, as vLLM leaves it out (unless
        include_stop_str_in_output). Tokens held before it stay held, for `flush`."""
        length, shown = self._undo
        self.text = self.text[:length]
        self.history.pop()
        self.shown = min(shown, len(self.history))

    def flush(self) -> None:
        """At the end of a request (not at a stop string: what follows it is cut): the text of the tokens
        still held back for an incomplete character, decoded as they are (U+FFFD for bytes that will
        never complete), as the whole sequence decodes. Dropped before: an answer whose last tokens were
        such bytes (a character cut by max_tokens, a run of stray bytes) lost them, streamed or not."""
        if self.shown == len(self.history):
            return
        start = max(0, self.shown - _PROMPT_CONTEXT)
        prefix = self._decode(self.history[start:self.shown])
        self.text += self._decode(self.history[start:])[len(prefix):]
        self.shown = len(self.history)

    def _window_step(self, token_id: int) -> str | None:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def _check_stop(self, before: int) -> str | None:
        for stop in self.stops:
            idx = self.text.find(stop, max(0, before - len(stop) + 1))
            if idx >= 0:
                end = idx + len(stop) if self.params.include_stop_str_in_output else idx
                self.text = self.text[:end]
                return stop
        return None

    def visible_text(self, finished: bool) -> str:
        if finished or not self.holdback:
            return self.text
        return self.text[: max(0, len(self.text) - self.holdback)]
