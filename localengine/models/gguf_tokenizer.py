"""A GGUF file's tokenizer, rebuilt with `tokenizers` and saved as a Hugging Face tokenizer.

GGUF stores no tokenizer.json: llama.cpp's metadata has the vocabulary (`tokenizer.ggml.tokens`),
token types (control, user-defined, byte), merges or scores, special token ids and the name of the
pre-tokenizer (`tokenizer.ggml.pre`: the regex llama.cpp splits text with before BPE). Two models:
- `gpt2`: byte-level BPE (SmolLM, Llama 3, Qwen2/3, Mistral Nemo): split by the pre-tokenizer's
  regex, bytes spelled in GPT-2's printable alphabet, then the file's merges.
- `llama`: SentencePiece BPE (Llama 2, Mistral 7B): '▁' for spaces, byte fallback, merges derived
  from the token scores when the file has none (a merge's rank is its result's score).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp), by `tokenizer.ggml.pre`.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# (regexes applied in turn, each isolating its matches); SmolLM splits every digit first.
_PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,), "gpt-2": (_GPT2_SPLIT,), "smollm": (r"\p{N}", _GPT2_SPLIT),
    "llama3": (_LLAMA3_SPLIT,), "llama-bpe": (_LLAMA3_SPLIT,), "llama-v3": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,), "qwen2": (_QWEN2_SPLIT,), "deepseek-r1-qwen": (_QWEN2_SPLIT,),
}
_CONTROL, _USER_DEFINED = 3, 4


def save_tokenizer(reader: Any, meta: dict[str, Any], out: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for the GGUF `reader` into `out`."""
    tokens: list[str] = reader.fields["tokenizer.ggml.tokens"].contents()
    types: list[int] = (reader.fields["tokenizer.ggml.token_type"].contents()
                        if "tokenizer.ggml.token_type" in reader.fields else [1] * len(tokens))
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        merges = reader.fields["tokenizer.ggml.merges"].contents()
        tok = _byte_level(tokens, merges, str(meta.get("tokenizer.ggml.pre", "default")))
        add_bos_default = False
    elif kind == "llama":
        if "tokenizer.ggml.merges" in reader.fields:
            merges = reader.fields["tokenizer.ggml.merges"].contents()
        else:
            merges = _merges_from_scores(tokens, reader.fields["tokenizer.ggml.scores"].contents())
        tok = _sentencepiece(tokens, merges, bool(meta.get("tokenizer.ggml.add_space_prefix", True)))
        add_bos_default = True  # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    else:
        raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED])

    def special(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    bos, eos = special("bos"), special("eos")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and bos is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    pieces = ([bos] if add_bos else []) + ["$A"] + ([eos] if add_eos else [])
    if add_bos or add_eos:
        ids = [(t, tokens.index(t)) for t in {bos, eos} if t is not None]
        tok.post_processor = processors.TemplateProcessing(single=" ".join(p for p in pieces if p), special_tokens=ids)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos, "eos_token": eos, "unk_token": special("unknown"), "pad_token": special("padding"),
        "add_bos_token": add_bos, "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta.get('general.architecture')}.context_length", 4096)),
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _byte_level(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[_pair(m) for m in merges], ignore_merges=pre in ("llama3", "llama-bpe", "llama-v3")))
    splits = _PRE_SPLITS.get(pre)
    if splits is None:
        raise NotImplementedError(f"GGUF pre-tokenizer {pre!r} is not supported (supported: {sorted(_PRE_SPLITS)})")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(tokens: list[str], merges: list[str] | list[tuple[str, str]], add_space_prefix: bool) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [_pair(m) if isinstance(m, str) else m for m in merges]
    unk = "<unk>" if "<unk>" in vocab else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("▁")] if add_space_prefix else []) + [normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if add_space_prefix else []))
    return tok


def _pair(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges implied by the vocabulary: every split of a token into two tokens,
    ranked by the merged token's score (higher first), as the SentencePiece converter does."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for token, score in zip(tokens, scores, strict=True):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]
