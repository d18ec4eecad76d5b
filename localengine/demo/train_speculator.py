"""Train the demo model's MLP speculator on the demo model's own greedy outputs.

Self-distillation: windows of the standard library's sources (the demo's training text) are the
prompts, the demo model continues each greedily with this engine, and the speculator learns to
predict the tokens 2..n+1 ahead from the target's final hidden state at each generated position
and the token that position produced (teacher-forced: a proposal only counts while every earlier
one was accepted, and then the inputs are exactly those tokens). Hidden states come from one
Hugging Face forward pass per batch over the finished texts. Held-out texts give each stage's
acceptance, which is what speculation gets for greedy requests.

    python -m localengine.demo.train_speculator [--prompts 1536] [--gen-tokens 192] [--minutes 6]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaForCausalLM

from localengine import LLM, SamplingParams
from localengine.config import BUNDLED_MODELS
from localengine.demo.train import corpus
from localengine.spec_decode.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

HERE = Path(__file__).parent
IGNORE = -100


def prompts(tokenizer, count: int, seed: int = 1) -> list[list[int]]:
    """Random windows of 8-48 tokens from the corpus, starting at a line start."""
    rng = random.Random(seed)
    docs = corpus(6_000_000, seed=seed)
    out = []
    while len(out) < count:
        lines = rng.choice(docs).splitlines(keepends=True)
        start = rng.randrange(len(lines))
        ids = tokenizer.encode("".join(lines[start : start + 12]))[: rng.randint(8, 48)]
        if len(ids) >= 4:
            out.append(ids)
    return out


def generate(target: str, prompt_ids: list[list[int]], gen_tokens: int) -> list[list[int]]:
    llm = LLM(target, num_threads=1, max_num_seqs=64)
    params = SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True)
    outs = llm.generate(prompt_ids, params)
    return [o.prompt_token_ids + o.outputs[0].token_ids for o in outs]


@torch.inference_mode()
def examples(target_dir: Path, texts: list[list[int]], prompt_lens: list[int], n: int):
    """(hidden [N, D], tokens [N, n+1]) for every generated position: the hidden state at t,
    the token at t+1 it produced, then the n tokens after it (IGNORE past the text's end)."""
    hf = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    hiddens, tokens = [], []
    for text, plen in zip(texts, prompt_lens, strict=True):
        ids = torch.tensor(text)
        hidden = hf.model(input_ids=ids[None]).last_hidden_state[0]
        padded = torch.cat([ids, torch.full((n + 1,), IGNORE)])
        starts = torch.arange(plen - 1, len(text) - 1)
        hiddens.append(hidden[starts])
        tokens.append(padded[starts[:, None] + 1 + torch.arange(n + 1)])
    return torch.cat(hiddens), torch.cat(tokens)


def accepted_length(model: MLPSpeculator, hidden: torch.Tensor, tokens: torch.Tensor) -> list[float]:
    """Per stage i: the share of positions whose first i+1 proposals are all right (greedy
    acceptance), over positions with all n targets inside the text."""
    keep = (tokens != IGNORE).all(dim=1)
    with torch.no_grad():
        pred = model(hidden[keep], tokens[keep, :-1]).argmax(-1)
    right = (pred == tokens[keep, 1:]).int().cumprod(dim=1)
    return right.float().mean(0).tolist()


def train(model: MLPSpeculator, hidden: torch.Tensor, tokens: torch.Tensor, minutes: float,
          batch_size: int = 512) -> int:
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    budget, start, step = minutes * 60, time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < budget:
        for group in opt.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 100) * max(0.05, 1 - elapsed / budget)
        idx = torch.randint(0, len(hidden), (batch_size,), generator=gen)
        # Inputs past a text's end are never scored (their targets are IGNORE too): any id will do.
        logits = model(hidden[idx], tokens[idx, :-1].clamp_min(0))
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[idx, 1:].flatten(), ignore_index=IGNORE)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 500 == 0:
            print(f"step {step:6d}  {elapsed:5.0f}s  loss {loss.item():.3f}", flush=True)
        step += 1
    return step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo")
    ap.add_argument("--prompts", type=int, default=1536)
    ap.add_argument("--gen-tokens", type=int, default=192)
    ap.add_argument("--n-predict", type=int, default=6)
    ap.add_argument("--inner-dim", type=int, default=0, help="0: the target's hidden size")
    ap.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                    help="one set of stage weights for stages 2..n (4x smaller, about as accurate for demo)")
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-clock training budget")
    ap.add_argument("--out", type=Path, default=HERE / "demo-speculator")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target_dir = BUNDLED_MODELS.get(args.target, Path(args.target))
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)

    t0 = time.perf_counter()
    prompt_ids = prompts(tokenizer, args.prompts)
    texts = generate(args.target, prompt_ids, args.gen_tokens)
    t1 = time.perf_counter()
    print(f"generated {len(texts)} x {args.gen_tokens} tokens in {t1 - t0:.0f}s", flush=True)
    held_out = max(1, len(texts) // 10)
    lens = [len(p) for p in prompt_ids]
    hidden, tokens = examples(target_dir, texts[held_out:], lens[held_out:], args.n_predict)
    eval_hidden, eval_tokens = examples(target_dir, texts[:held_out], lens[:held_out], args.n_predict)
    print(f"{len(hidden):,} training positions, {len(eval_hidden):,} held out ({time.perf_counter() - t1:.0f}s)",
          flush=True)

    hf = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    config = MLPSpeculatorConfig(vocab_size=hf.config.vocab_size, emb_dim=hf.config.hidden_size,
                                 inner_dim=args.inner_dim, n_predict=args.n_predict, tie_weights=args.tie_weights)
    model = MLPSpeculator(config)
    if (args.inner_dim or hf.config.hidden_size) == hf.config.hidden_size:
        # Start the token embeddings and output heads from the target's own (tied) embedding.
        with torch.no_grad():
            for module in [*model.emb, *model.head]:
                module.weight.copy_(hf.get_input_embeddings().weight)
    t2 = time.perf_counter()
    steps = train(model, hidden, tokens, args.minutes)
    print(f"trained {steps} steps in {time.perf_counter() - t2:.0f}s", flush=True)
    model.eval()
    acc = accepted_length(model, eval_hidden, eval_tokens)
    print("held-out greedy acceptance (first i proposals all right): "
          + ", ".join(f"{i + 1}: {a:.3f}" for i, a in enumerate(acc))
          + f"; mean accepted per step at k={args.n_predict}: {sum(acc):.2f}", flush=True)
    model.save(args.out)
    print(f"saved {args.out} ({sum(p.numel() for p in model.parameters()):,} parameters); "
          f"total {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
