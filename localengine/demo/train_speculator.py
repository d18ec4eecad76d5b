"""Train an MLP speculator on its target's own outputs (the demo model's, or SmolLM2's).

Self-distillation: the engine continues a set of prompts with the target itself (batched) and
keeps, for every generated token, the target's final hidden state that produced it
(`ModelRunner.keep_hidden`, what the speculator sees at serving time); the speculator learns to
predict the tokens 2..n+1 ahead from that hidden state and the token it produced (teacher-forced:
a proposal only counts while every earlier one was accepted, and then the inputs are exactly those
tokens). Held-out texts give each stage's greedy acceptance, which is what speculation gets for
greedy requests.

Prompts: `code`, windows of the standard library's sources (the demo's training text); `chat`,
instructions from localengine/demo/speculator_prompts.py (open questions and work on standard-library
code and docstrings), chat-templated, for instruct models.

    python -m localengine.demo.train_speculator                   # demo-speculator
    python -m localengine.demo.train_speculator --target smollm2-135m-instruct ...   # what
        `slipstream engine build-speculator smollm2-135m-instruct-speculator` runs (spec_decode/built.py)
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerFast

from localengine import LLM, SamplingParams
from localengine.demo.speculator_prompts import instructions
from localengine.demo.train import corpus
from localengine.spec_decode.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig

HERE = Path(__file__).parent
IGNORE = -100
def code_prompts(tokenizer: PreTrainedTokenizerFast, count: int, seed: int = 1) -> list[list[int]]:
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


def chat_prompts(tokenizer: PreTrainedTokenizerFast, count: int, max_len: int, seed: int = 1) -> list[list[int]]:
    """`count` instructions (localengine/demo/speculator_prompts.py) through the model's chat
    template, leaving out those longer than `max_len` tokens (a short-context target gets fewer)."""
    out = []
    for message in instructions(count, seed):
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= max_len:
            out.append(ids)
    return out


@dataclass(slots=True)
class Examples:
    """Every generated position t of every text: `hidden[at]` is the target's hidden state at t,
    `tokens` the token at t+1 it produced and the n after it (IGNORE past the text's end);
    `hidden[at + 1 + i]` gives the target's distribution over the token that stage i predicts."""

    hidden: torch.Tensor  # [all generated positions of all texts, D]
    at: torch.Tensor  # [N]
    tokens: torch.Tensor  # [N, n + 1]


@dataclass(slots=True)
class Text:
    prompt_len: int
    token_ids: list[int]  # prompt and output
    hidden: torch.Tensor  # [output tokens, D]: row j produced output token j


def generate(llm: LLM, prompt_ids: list[list[int]], gen_tokens: int, num_sampled: int, ignore_eos: bool) -> list[Text]:
    """Greedy continuations, except the last `num_sampled` prompts' (temperature 0.8, top-k 50):
    sampled requests visit states greedy decoding never reaches, and are speculated too. The
    engine runs them batched and hands back each token's hidden state as it is generated."""
    engine = llm.llm_engine
    engine.model_runner.keep_hidden = True
    greedy = SamplingParams(temperature=0, max_tokens=gen_tokens, ignore_eos=ignore_eos)
    params = [greedy] * (len(prompt_ids) - num_sampled) + [
        SamplingParams(temperature=0.8, top_k=50, max_tokens=gen_tokens, ignore_eos=ignore_eos, seed=i)
        for i in range(num_sampled)]
    seqs = []
    for prompt, p in zip(prompt_ids, params, strict=True):
        rid = engine.new_request_id()
        engine.add_request(rid, prompt, p)
        seqs.append(engine.scheduler.requests[rid])
    hiddens: list[list[torch.Tensor]] = [[] for _ in seqs]
    start, reported = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        for seq, rows in zip(seqs, hiddens, strict=True):
            if seq.num_output_tokens > len(rows) and seq.last_hidden is not None:
                rows.append(seq.last_hidden.detach().float().clone())  # one token a step: no speculation here
        # A long build says how far it is (a tenth of the answers at a time), not only when it ends.
        done = sum(seq.is_finished for seq in seqs)
        if done * 10 // len(seqs) > reported:
            reported = done * 10 // len(seqs)
            print(f"answered {done} of {len(seqs)} in {time.perf_counter() - start:.0f}s", flush=True)
    engine.model_runner.keep_hidden = False
    return [Text(len(p), list(s.token_ids), torch.stack(h)) for p, s, h in zip(prompt_ids, seqs, hiddens, strict=True)]


def examples(texts: list[Text], n: int) -> Examples:
    hiddens, ats, tokens, offset = [], [], [], 0
    for text in texts:
        ids, plen = torch.tensor(text.token_ids), text.prompt_len
        padded = torch.cat([ids, torch.full((n + 1,), IGNORE)])
        starts = torch.arange(plen - 1, len(ids) - 1)  # the positions whose hidden state the engine kept
        hiddens.append(text.hidden)
        ats.append(torch.arange(len(starts)) + offset)
        tokens.append(padded[starts[:, None] + 1 + torch.arange(n + 1)])
        offset += len(starts)
    return Examples(torch.cat(hiddens), torch.cat(ats), torch.cat(tokens))


def accepted_length(model: MLPSpeculator, ex: Examples) -> list[float]:
    """Per stage i: the share of positions whose first i+1 proposals are all right (greedy
    acceptance, on greedy texts), over positions with all n targets inside the text."""
    keep = (ex.tokens != IGNORE).all(dim=1)
    with torch.no_grad():
        pred = model.token_ids(model(ex.hidden[ex.at[keep]], ex.tokens[keep, :-1]).argmax(-1))
    right = (pred == ex.tokens[keep, 1:]).int().cumprod(dim=1)
    return right.float().mean(0).tolist()


def train(model: MLPSpeculator, ex: Examples, lm_head: torch.Tensor, minutes: float, soft_weight: float,
          greedy_weight: float, batch_size: int = 512) -> int:
    """`soft_weight` times the cross-entropy against the target's own next-token distribution at
    each predicted position (soft labels from its hidden state and LM head, over the head's
    vocabulary), so sampled requests get a q close to p, plus `greedy_weight` times the
    cross-entropy against that distribution's argmax, which is all a greedy request's proposal is
    judged by. Without soft labels the argmax is read from the text: right for greedy texts only."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    vocab = model.draft_vocab if model.config.draft_vocab_size else None
    head_rows = lm_head[vocab] if vocab is not None else lm_head
    # Target token id -> head index (-1: outside the draft vocabulary, never a right proposal).
    index_of = torch.full((model.config.vocab_size,), -1, dtype=torch.int64)
    index_of[vocab if vocab is not None else torch.arange(model.config.vocab_size)] = torch.arange(len(head_rows))
    # A budget of CPU time, not wall-clock: on a shared machine the same command trains as much.
    budget, start, step = minutes * 60, time.process_time(), 0
    while (elapsed := time.process_time() - start) < budget:
        for group in opt.param_groups:
            group["lr"] = 2e-3 * min(1.0, (step + 1) / 100) * max(0.05, 1 - elapsed / budget)
        idx = torch.randint(0, len(ex.at), (batch_size,), generator=gen)
        at, tokens = ex.at[idx], ex.tokens[idx]
        # Inputs past a text's end are never scored (their targets are IGNORE too): any id will do.
        logits = model(ex.hidden[at], tokens[:, :-1].clamp_min(0))
        n = logits.shape[1]
        logq = logits.log_softmax(dim=-1)
        scored = tokens[:, 1:] != IGNORE
        ce = torch.zeros_like(logq[..., 0])
        if soft_weight:
            target_rows = (at[:, None] + 1 + torch.arange(n)).clamp_max(len(ex.hidden) - 1)
            with torch.no_grad():
                p = (ex.hidden[target_rows] @ head_rows.T).softmax(dim=-1)
            ce = ce - soft_weight * (p * logq).sum(dim=-1)
            hard = p.argmax(dim=-1)
        else:
            hard = index_of[tokens[:, 1:].clamp_min(0)]
            scored &= hard >= 0
        if greedy_weight:
            ce = ce - greedy_weight * logq.gather(-1, hard.clamp_min(0)[..., None])[..., 0]
        loss = (ce * scored).sum() / scored.sum().clamp_min(1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0:
            print(f"step {step:6d}  {elapsed:5.0f}s  loss {loss.item():.3f}", flush=True)
        step += 1
    return step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo")
    ap.add_argument("--prompt-set", choices=["auto", "code", "chat"], default="auto",
                    help="auto: chat when the target's tokenizer has a chat template")
    ap.add_argument("--prompts", type=int, default=1536)
    ap.add_argument("--gen-tokens", type=int, default=192)
    ap.add_argument("--sampled-share", type=float, default=0.5,
                    help="share of training texts continued by sampling (temperature 0.8, top-k 50) instead of greedily")
    ap.add_argument("--n-predict", type=int, default=6)
    ap.add_argument("--inner-dim", type=int, default=0, help="0: the target's hidden size")
    ap.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=True,
                    help="one set of stage weights for stages 2..n (4x smaller, about as accurate for demo)")
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="heads over the target's N most frequent generated tokens (0: the whole vocabulary)")
    ap.add_argument("--target-embeddings", action="store_true",
                    help="embed tokens with the target's own embedding (not trained, not stored)")
    ap.add_argument("--minutes", type=float, default=6.0, help="training budget in CPU minutes (all threads together)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for generating and training")
    ap.add_argument("--soft-weight", type=float, default=1.0,
                    help="weight of the target's whole next-token distribution as a soft label")
    ap.add_argument("--greedy-weight", type=float, default=0.0,
                    help="weight of the target's argmax as a hard label, beside its whole distribution")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=64, help="the engine's batch while generating")
    ap.add_argument("--out", type=Path, default=HERE / "demo-speculator")
    ap.add_argument("--texts", type=Path, help="keep the generated texts in this file and reuse them when it exists "
                    "(to train again with other settings on the same answers)")
    args = ap.parse_args(argv)
    if not args.soft_weight and args.sampled_share:
        ap.error("without soft labels the argmax is read from the texts: use --sampled-share 0")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    llm = LLM(args.target, num_threads=args.threads, max_num_seqs=args.max_num_seqs, dtype="float32")
    tokenizer = llm.get_tokenizer()
    chat = args.prompt_set == "chat" or (args.prompt_set == "auto" and getattr(tokenizer, "chat_template", None))
    max_prompt = llm.llm_engine.max_model_len - args.gen_tokens
    prompt_ids = chat_prompts(tokenizer, args.prompts, max_prompt) if chat else code_prompts(tokenizer, args.prompts)
    held_out = max(1, len(prompt_ids) // 10)  # the first texts, all greedy
    num_sampled = min(int(args.sampled_share * len(prompt_ids)), len(prompt_ids) - held_out)
    # Chat answers end at the end-of-turn token; the demo model never stops on its own.
    if args.texts and args.texts.exists():
        texts = [Text(**t) for t in torch.load(args.texts)]
    else:
        texts = generate(llm, prompt_ids, args.gen_tokens, num_sampled, ignore_eos=not chat)
        if args.texts:
            torch.save([{"prompt_len": t.prompt_len, "token_ids": t.token_ids, "hidden": t.hidden} for t in texts],
                       args.texts)
    target = llm.llm_engine.model_runner.model
    with torch.no_grad():  # the rows as the target uses them, whatever its weights' format
        rows = torch.arange(target.args.vocab_size)
        embedding, lm_head = (layer(rows).float().clone() for layer in (target.model.embed_tokens, target.lm_head))
    del llm
    train_ex, eval_ex = examples(texts[held_out:], args.n_predict), examples(texts[:held_out], args.n_predict)
    print(f"generated {len(texts)} texts ({num_sampled} sampled): {len(train_ex.at):,} training positions, "
          f"{len(eval_ex.at):,} held out, in {time.perf_counter() - t0:.0f}s", flush=True)

    vocab_size, hidden_size = embedding.shape
    config = MLPSpeculatorConfig(vocab_size=vocab_size, emb_dim=hidden_size, inner_dim=args.inner_dim,
                                 n_predict=args.n_predict, tie_weights=args.tie_weights,
                                 draft_vocab_size=args.draft_vocab, target_embeddings=args.target_embeddings)
    model = MLPSpeculator(config)
    if args.draft_vocab:
        # The tokens the target generates most often (ties: lower id first), in id order.
        counts = torch.bincount(torch.tensor([t for x in texts[held_out:] for t in x.token_ids[x.prompt_len:]]),
                                minlength=vocab_size)
        top = torch.sort(counts, descending=True, stable=True).indices[: args.draft_vocab].sort().values
        model.draft_vocab.copy_(top)
        covered = counts[top].sum().item() / counts.sum().item()
        print(f"draft vocabulary: {args.draft_vocab} tokens cover {covered:.3f} of the generated tokens", flush=True)
    if args.target_embeddings:
        model.attach_target_embedding(lambda ids: F.embedding(ids, embedding))
    if (args.inner_dim or hidden_size) == hidden_size:
        # Start the heads (and token embeddings) from the target's own: its LM head's rows for the
        # head's vocabulary, its input embedding (tied in both targets).
        with torch.no_grad():
            for head in model.head:
                cast(nn.Linear, head).weight.copy_(lm_head[model.draft_vocab] if args.draft_vocab else lm_head)
            for emb in model.emb or []:
                cast(nn.Embedding, emb).weight.copy_(embedding)
    t2 = time.process_time()
    steps = train(model, train_ex, lm_head, args.minutes, args.soft_weight, args.greedy_weight, args.batch_size)
    print(f"trained {steps} steps in {time.process_time() - t2:.0f} CPU s", flush=True)
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
