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
from dataclasses import dataclass
from pathlib import Path

import torch
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
    out: list[list[int]] = []
    while len(out) < count:
        lines = rng.choice(docs).splitlines(keepends=True)
        start = rng.randrange(len(lines))
        ids = tokenizer.encode("".join(lines[start : start + 12]))[: rng.randint(8, 48)]
        if len(ids) >= 4:
            out.append(ids)
    return out


def generate(target: str, prompt_ids: list[list[int]], gen_tokens: int, num_sampled: int) -> list[list[int]]:
    """Greedy continuations, except the last `num_sampled` prompts' (temperature 0.8, top-k 50):
    sampled requests visit states greedy decoding never reaches, and are speculated too."""
    llm = LLM(target, num_threads=1, max_num_seqs=64)
    greedy = SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=True)
    params = [greedy] * (len(prompt_ids) - num_sampled) + [
        SamplingParams(temperature=0.8, top_k=50, max_tokens=gen_tokens, ignore_eos=True, seed=i)
        for i in range(num_sampled)]
    outs = llm.generate(prompt_ids, params)
    return [o.prompt_token_ids + o.outputs[0].token_ids for o in outs]


@dataclass(slots=True)
class Examples:
    """Every generated position t of every text: `hidden[at]` is the target's hidden state at t,
    `tokens` the token at t+1 it produced and the n after it (IGNORE past the text's end);
    `hidden[at + 1 + i]` gives the target's distribution over the token that stage i predicts."""

    hidden: torch.Tensor  # [all positions of all texts, D]
    at: torch.Tensor  # [N]
    tokens: torch.Tensor  # [N, n + 1]


@torch.inference_mode()
def examples(hf: LlamaForCausalLM, texts: list[list[int]], prompt_lens: list[int], n: int) -> Examples:
    hiddens, ats, tokens, offset = [], [], [], 0
    for text, plen in zip(texts, prompt_lens, strict=True):
        ids = torch.tensor(text)
        hiddens.append(hf.model(input_ids=ids[None]).last_hidden_state[0])
        padded = torch.cat([ids, torch.full((n + 1,), IGNORE)])
        starts = torch.arange(plen - 1, len(text) - 1)
        ats.append(starts + offset)
        tokens.append(padded[starts[:, None] + 1 + torch.arange(n + 1)])
        offset += len(text)
    return Examples(torch.cat(hiddens), torch.cat(ats), torch.cat(tokens))


def accepted_length(model: MLPSpeculator, ex: Examples) -> list[float]:
    """Per stage i: the share of positions whose first i+1 proposals are all right (greedy
    acceptance, on greedy texts), over positions with all n targets inside the text."""
    keep = (ex.tokens != IGNORE).all(dim=1)
    with torch.no_grad():
        pred = model(ex.hidden[ex.at[keep]], ex.tokens[keep, :-1]).argmax(-1)
    right = (pred == ex.tokens[keep, 1:]).int().cumprod(dim=1)
    return right.float().mean(0).tolist()


def train(model: MLPSpeculator, ex: Examples, lm_head: torch.Tensor, minutes: float, greedy_weight: float,
          batch_size: int = 512) -> int:
    """Cross-entropy against the target's own next-token distribution at each predicted position
    (soft labels from its hidden state and LM head), so sampled requests get a q close to p, plus
    `greedy_weight` times the cross-entropy against that distribution's argmax, which is all a
    greedy request's proposal is judged by."""
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    budget, start, step = minutes * 60, time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < budget:
        for group in opt.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 100) * max(0.05, 1 - elapsed / budget)
        idx = torch.randint(0, len(ex.at), (batch_size,), generator=gen)
        at, tokens = ex.at[idx], ex.tokens[idx]
        # Inputs past a text's end are never scored (their targets are IGNORE too): any id will do.
        logits = model(ex.hidden[at], tokens[:, :-1].clamp_min(0))
        n = logits.shape[1]
        target_rows = (at[:, None] + 1 + torch.arange(n)).clamp_max(len(ex.hidden) - 1)
        with torch.no_grad():
            p = (ex.hidden[target_rows] @ lm_head.T).softmax(dim=-1)
        scored = tokens[:, 1:] != IGNORE
        logq = logits.log_softmax(dim=-1)
        ce = -(p * logq).sum(dim=-1) - greedy_weight * logq.gather(-1, p.argmax(dim=-1, keepdim=True))[..., 0]
        loss = (ce * scored).sum() / scored.sum()
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
    ap.add_argument("--sampled-share", type=float, default=0.5,
                    help="share of training texts continued by sampling (temperature 0.8, top-k 50) instead of greedily")
    ap.add_argument("--n-predict", type=int, default=6)
    ap.add_argument("--inner-dim", type=int, default=0, help="0: the target's hidden size")
    ap.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                    help="one set of stage weights for stages 2..n (4x smaller, about as accurate for demo)")
    ap.add_argument("--minutes", type=float, default=6.0, help="wall-clock training budget")
    ap.add_argument("--greedy-weight", type=float, default=0.0,
                    help="weight of the target's argmax as a hard label, beside its whole distribution")
    ap.add_argument("--out", type=Path, default=HERE / "demo-speculator")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target_dir = BUNDLED_MODELS.get(args.target, Path(args.target))
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)

    t0 = time.perf_counter()
    prompt_ids = prompts(tokenizer, args.prompts)
    held_out = max(1, len(prompt_ids) // 10)  # the first texts, all greedy
    num_sampled = min(int(args.sampled_share * len(prompt_ids)), len(prompt_ids) - held_out)
    texts = generate(args.target, prompt_ids, args.gen_tokens, num_sampled)
    t1 = time.perf_counter()
    print(f"generated {len(texts)} x {args.gen_tokens} tokens ({num_sampled} sampled) in {t1 - t0:.0f}s", flush=True)
    lens = [len(p) for p in prompt_ids]
    hf = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    train_ex = examples(hf, texts[held_out:], lens[held_out:], args.n_predict)
    eval_ex = examples(hf, texts[:held_out], lens[:held_out], args.n_predict)
    print(f"{len(train_ex.at):,} training positions, {len(eval_ex.at):,} held out ({time.perf_counter() - t1:.0f}s)",
          flush=True)

    config = MLPSpeculatorConfig(vocab_size=hf.config.vocab_size, emb_dim=hf.config.hidden_size,
                                 inner_dim=args.inner_dim, n_predict=args.n_predict, tie_weights=args.tie_weights)
    model = MLPSpeculator(config)
    if (args.inner_dim or hf.config.hidden_size) == hf.config.hidden_size:
        # Start the token embeddings and output heads from the target's own (tied) embedding.
        with torch.no_grad():
            for module in [*model.emb, *model.head]:
                module.weight.copy_(hf.get_input_embeddings().weight)
    t2 = time.perf_counter()
    steps = train(model, train_ex, hf.get_output_embeddings().weight.detach(), args.minutes, args.greedy_weight)
    print(f"trained {steps} steps in {time.perf_counter() - t2:.0f}s", flush=True)
    model.eval()
    acc = accepted_length(model, eval_ex)
    print("held-out greedy acceptance (first i proposals all right): "
          + ", ".join(f"{i + 1}: {a:.3f}" for i, a in enumerate(acc))
          + f"; mean accepted per step at k={args.n_predict}: {sum(acc):.2f}", flush=True)
    model.save(args.out)
    print(f"saved {args.out} ({sum(p.numel() for p in model.parameters()):,} parameters); "
          f"total {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
