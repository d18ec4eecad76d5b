"""The MLP speculator (`method: "mlp_speculator"`): checkpoint layout, the target's sampling
distribution kept exactly, refusal of a mismatched speculator, and the training script end to end.
Greedy equality, preemption, abort and metrics run with the other proposers in test_spec_decode.py."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from localengine import LLM, SamplingParams
from localengine.config import BUNDLED_MODELS
from localengine.kernels import cpu_ops
from localengine.layers.vocab_parallel import VocabParallelEmbedding
from localengine.spec_decode.mlp_speculator import MLPSpeculator, MLPSpeculatorConfig, load_speculator

MLP = {"method": "mlp_speculator", "model": "demo-speculator", "num_speculative_tokens": 4, "adaptive": False}


@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_round_trip_in_the_published_layout(tmp_path, tied):
    torch.manual_seed(0)
    model = MLPSpeculator(MLPSpeculatorConfig(vocab_size=50, emb_dim=24, inner_dim=16, n_predict=3,
                                              tie_weights=tied, scale_input=True)).eval()
    model.save(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    stages = [0] if tied else [0, 1, 2]
    expected = {f"{part}.{i}.weight" for part in ("emb", "head", "ln") for i in stages}
    expected |= {f"ln.{i}.bias" for i in stages} | {f"proj.{i}.weight" for i in ([0, 1] if tied else stages)}
    assert names == expected
    loaded = load_speculator(tmp_path, torch.float32, torch.device("cpu"))
    hidden, last = torch.randn(5, 24), torch.randint(0, 50, (5,))
    # Weights go through fp16 on disk: compare against the same rounding.
    model.half().float()
    assert torch.equal(loaded.propose_greedy(hidden, last, 3), model.propose_greedy(hidden, last, 3))


def test_draft_vocabulary_and_target_embeddings_round_trip(tmp_path):
    """FR-Spec's draft vocabulary (heads over a subset of token ids) and the target's own
    embedding (not stored): proposals are target ids from the subset, q covers the whole
    vocabulary with zeros outside it."""
    torch.manual_seed(0)
    config = MLPSpeculatorConfig(vocab_size=50, emb_dim=24, n_predict=3, tie_weights=True,
                                 draft_vocab_size=8, target_embeddings=True)
    model = MLPSpeculator(config).eval()
    model.draft_vocab.copy_(torch.tensor([1, 4, 9, 16, 25, 36, 42, 49]))
    target_embedding = torch.randn(50, 24)
    model.attach_target_embedding(lambda ids: torch.nn.functional.embedding(ids, target_embedding))
    model.save(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "draft_vocab" in names and not any(name.startswith("emb.") for name in names)
    loaded = load_speculator(tmp_path, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="attach_target_embedding"):
        loaded.propose_greedy(torch.randn(2, 24), torch.tensor([3, 7]), 3)
    loaded.attach_target_embedding(lambda ids: torch.nn.functional.embedding(ids, target_embedding))
    hidden, last = torch.randn(5, 24), torch.randint(0, 50, (5,))
    model.half().float()
    proposals = loaded.propose_greedy(hidden, last, 3)
    assert torch.equal(proposals, model.propose_greedy(hidden, last, 3))
    assert set(proposals.flatten().tolist()) <= set(model.draft_vocab.tolist())
    _, head_logits = loaded.stage(0, loaded.start(hidden), last)
    q = loaded.full_vocab_logits(head_logits).softmax(-1)
    assert q.shape == (5, 50) and torch.allclose(q[:, loaded.draft_vocab].sum(-1), torch.ones(5))


@pytest.mark.skipif("cpu_ops.ops() is None", reason="the engine's CPU ops are not built here")
@pytest.mark.parametrize("variant", ["own tables", "tied, draft vocabulary", "target embedding"])
def test_one_call_greedy_proposal_is_the_stages(monkeypatch, variant):
    """kernels/cpu_speculator.cpp proposes what the PyTorch stages propose, batch 1 to MAX_ROWS; a
    target embedding it cannot read as plain rows (int8) leaves the proposal to PyTorch."""
    torch.manual_seed(0)
    config = MLPSpeculatorConfig(vocab_size=300, emb_dim=40, inner_dim=0 if variant == "target embedding" else 24,
                                 n_predict=4, tie_weights=variant != "own tables", scale_input=True,
                                 draft_vocab_size=64 if variant.endswith("draft vocabulary") else 0,
                                 target_embeddings=variant == "target embedding")
    model = MLPSpeculator(config).eval()
    if config.draft_vocab_size:
        model.draft_vocab.copy_(torch.randperm(300)[:64])
    target = VocabParallelEmbedding(300, 40)
    torch.nn.init.normal_(target.weight)
    model.attach_target_embedding(target)
    calls = []
    real = cpu_ops.for_fp32
    monkeypatch.setattr(cpu_ops, "for_fp32", lambda x: calls.append(x) or real(x))
    for rows in (1, 3, cpu_ops.MAX_ROWS):
        hidden, last = torch.randn(rows, 40) * 2, torch.randint(0, 300, (rows,))
        assert model._native_greedy(hidden, last, 4) is not None
        native = model.propose_greedy(hidden, last, 4)
        with monkeypatch.context() as pytorch_only:
            pytorch_only.setattr(cpu_ops, "for_fp32", lambda x: None)
            assert torch.equal(native, model.propose_greedy(hidden, last, 4))
    assert calls
    if config.target_embeddings:
        target.quantize("int8")
        assert model._native_greedy(torch.randn(1, 40), torch.tensor([5]), 4) is None


def test_speculator_for_another_target_is_refused(llama_dir):
    with pytest.raises(ValueError, match="trained for hidden size 192"):
        LLM(str(llama_dir), dtype="float32", num_kvcache_blocks=256, speculative_config=MLP)


def exact_paths(prompt: list[int], depth: int, top_k: int) -> dict[tuple[int, ...], float]:
    """The target's exact law of its first `depth` sampled tokens (temperature 1, top-k)."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(BUNDLED_MODELS["demo"], dtype=torch.float32).eval()
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for path, prob in law.items():
            with torch.no_grad():
                logits = hf(input_ids=torch.tensor([prompt + list(path)])).logits[0, -1]
            values, ids = logits.topk(top_k)
            for v, t in zip(values.softmax(-1).tolist(), ids.tolist(), strict=True):
                nxt[path + (t,)] = prob * v
        law = nxt
    return law


def test_sampled_output_keeps_the_targets_distribution():
    """1,200 sampled requests of 4 tokens (top-k 2: 16 possible outputs): the first is sampled
    plainly, then the speculator proposes 2 drawn from its own distribution, verified by the
    rejection sampler. The joint law of all 4 must be the target's, computed exactly."""
    llm = LLM("demo", speculative_config=MLP)
    prompt = llm.llm_engine.tokenizer.encode("def main(")
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=4, ignore_eos=True)
    n = 1200
    outs = llm.generate([prompt] * n, params)
    stats = llm.spec_decode_stats()
    assert stats.num_drafts >= n and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        key = tuple(o.outputs[0].token_ids)
        counts[key] = counts.get(key, 0) + 1
    law = exact_paths(prompt, 4, 2)
    assert set(counts) <= set(law)
    tv = 0.5 * sum(abs(counts.get(path, 0) / n - p) for path, p in law.items())
    assert tv < 0.1, tv  # sampling noise alone is ~0.05 here


@pytest.mark.parametrize("flags", [[], ["--draft-vocab", "64", "--target-embeddings", "--soft-weight", "0",
                                         "--greedy-weight", "1", "--sampled-share", "0"]],
                         ids=["published-layout", "draft-vocab"])
def test_training_script_end_to_end(llama_dir, tmp_path, flags):
    """Self-distillation on a tiny target: generate (hidden states from the engine), train, save;
    the engine then loads the result and greedy output is unchanged."""
    from localengine.demo.train_speculator import main

    out = tmp_path / "speculator"
    main(["--target", str(llama_dir), "--prompts", "12", "--gen-tokens", "24", "--n-predict", "3",
          "--minutes", "0.02", "--out", str(out), *flags])
    common = {"dtype": "float32", "num_kvcache_blocks": 256, "max_model_len": 128}
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10], [40, 41, 42]]
    ref = LLM(str(llama_dir), **common).generate(prompts, params)
    spec = {"method": "mlp_speculator", "model": str(out), "num_speculative_tokens": 3, "adaptive": False}
    llm = LLM(str(llama_dir), speculative_config=spec, **common)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == [r.outputs[0].token_ids for r in ref]
    assert llm.spec_decode_stats().num_drafts > 0


def test_training_script_reuses_the_answers_it_kept(llama_dir, tmp_path, monkeypatch):
    """`--texts FILE` keeps the generated answers with their hidden states; a second run with the
    same file trains on them and does not generate again."""
    from localengine.demo import train_speculator

    texts = tmp_path / "texts.pt"
    args = ["--target", str(llama_dir), "--prompts", "12", "--gen-tokens", "16", "--n-predict", "3",
            "--minutes", "0.01", "--texts", str(texts)]
    train_speculator.main([*args, "--out", str(tmp_path / "first")])
    kept = torch.load(texts)
    assert 0 < len(kept) <= 12 and all(t["hidden"].shape[0] == len(t["token_ids"]) - t["prompt_len"] for t in kept)
    monkeypatch.setattr(train_speculator, "generate", lambda *a, **k: pytest.fail("generated again"))
    train_speculator.main([*args, "--out", str(tmp_path / "second")])
    assert (tmp_path / "second" / "model.safetensors").is_file()


@pytest.mark.parametrize("lookup", [False, True])
def test_prompt_lookup_leaves_the_speculator_the_rows_lookup_cannot_serve(monkeypatch, lookup):
    """Two requests, one whose context repeats as soon as it is continued (lookup finds what
    followed) and one with nothing repeated: with `prompt_lookup` the speculator drafts only for the
    second; greedy tokens equal decoding without speculation either way."""
    spec = {**MLP, "prompt_lookup": lookup}
    llm = LLM("demo", speculative_config=spec)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode("import os\nimport sys\nimport os\nimport sys\nimport"), tokenizer.encode("def main(")]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    model = llm.llm_engine.proposer.model
    rows: list[int] = []
    real = model.propose_greedy
    monkeypatch.setattr(model, "propose_greedy", lambda hidden, last, k: rows.append(len(hidden)) or real(hidden, last, k))
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert out == [o.outputs[0].token_ids for o in LLM("demo").generate(prompts, params)]
    assert rows[0] == (1 if lookup else 2)
    assert llm.spec_decode_stats().num_drafts > 0


def test_prompt_lookup_is_for_the_speculator_only():
    with pytest.raises(ValueError, match="prompt_lookup"):
        LLM("demo", speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup": True})


def test_training_instructions_are_varied_and_fixed():
    """The SmolLM2 speculator's prompts: the same list every run, open questions and grounded
    work on standard-library code and docstrings, none of the speculation benchmark's prompts."""
    from localengine.demo.speculator_prompts import instructions

    first = instructions(400)
    assert first == instructions(400) and len(first) == 400 and len(set(first)) == 400
    grounded = [m for m in first if "\n\n" in m]
    assert 0.3 < len(grounded) / len(first) < 0.5
    assert any("def " in m for m in grounded) and any("def " not in m for m in grounded)
    assert not any("refrigerator" in m or "moving_average" in m or "The lighthouse stood" in m for m in first)
