"""Train the bundled demo model and its draft on text that ships with Python itself.

The corpus is the standard library's own sources (code + docstrings), so training needs no
network. Quality is not the point: the demo model exists so that `model="demo"` produces
plausible text-ish output in examples and tests, and the draft (same tokenizer, ~8x smaller)
exists for speculative decoding. Training is time-boxed so it finishes in minutes on 2 CPU cores.

    python -m localengine.demo.train [--minutes 3] [--draft-minutes 1]

The demo model's MLP speculator (`demo-speculator`) is trained on this model's own outputs by
`train_speculator.py`, after this script: retrain it whenever the demo model changes.
"""

from __future__ import annotations

import argparse
import random
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

HERE = Path(__file__).parent
SPECIAL = ["<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
VOCAB_SIZE = 1024
SEQ_LEN = 128


def corpus(max_bytes: int, seed: int = 0) -> list[str]:
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    random.Random(seed).shuffle(files)
    docs, total = [], 0
    for path in files:
        text = path.read_text(encoding="utf-8", errors="ignore")
        docs.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return docs


def train_tokenizer(docs: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer)
    return tok


def batches(ids: torch.Tensor, batch_size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    while True:
        starts = torch.randint(0, len(ids) - SEQ_LEN - 1, (batch_size,), generator=gen)
        yield torch.stack([ids[s : s + SEQ_LEN] for s in starts.tolist()])


def train_model(config: LlamaConfig, ids: torch.Tensor, minutes: float, batch_size: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.95))
    budget = minutes * 60
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    for step, batch in enumerate(batches(ids, batch_size, gen)):
        elapsed = time.perf_counter() - start
        if elapsed > budget:
            break
        # Warm up, then decay linearly with wall time: the step count is unknown in advance.
        lr = 3e-3 * min(1.0, (step + 1) / 50) * max(0.05, 1 - elapsed / budget)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print(f"step {step:5d}  {elapsed:6.0f}s  loss {loss.item():.3f}", flush=True)
    return model


def save(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.half().save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def model_config(hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0, help="wall-clock budget for the demo model")
    parser.add_argument("--draft-minutes", type=float, default=1.0, help="wall-clock budget for the draft")
    parser.add_argument("--corpus-mb", type=float, default=6.0)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))

    docs = corpus(int(args.corpus_mb * 1e6))
    tok = train_tokenizer(docs)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    eos = tokenizer.eos_token_id
    # Documents end with <|end|> so the model learns to stop.
    ids = torch.tensor([t for enc in tok.encode_batch(docs) for t in enc.ids + [eos]], dtype=torch.long)
    print(f"corpus: {len(docs)} files, {len(ids):,} tokens", flush=True)

    # A budget of 0 skips that model (the tokenizer is deterministic, so the two stay compatible).
    if args.minutes > 0:
        target = train_model(model_config(192, 4, 6, 2, 512, eos), ids, args.minutes, batch_size=24)
        save(target, tokenizer, args.out / "demo")
    if args.draft_minutes > 0:
        draft = train_model(model_config(64, 2, 4, 2, 192, eos), ids, args.draft_minutes, batch_size=24)
        save(draft, tokenizer, args.out / "demo-draft")


if __name__ == "__main__":
    main()
