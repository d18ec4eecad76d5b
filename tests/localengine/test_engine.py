"""Engine behaviour: batching invariance, chunking, preemption, prefix caching, abort, sampling."""

from __future__ import annotations

import pytest

from localengine import LLM, SamplingParams
from localengine.engine.sequence import SequenceStatus
from tests.localengine.conftest import cached_tokens, make_llm

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = [list(range(3, 3 + n)) for n in (5, 23, 40, 9, 17, 64)]


@pytest.fixture(scope="module")
def llm(llama_dir) -> LLM:
    return make_llm(llama_dir)


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    """Each prompt generated on its own: the reference for every batching variant."""
    llm.llm_engine.block_manager.reset_prefix_cache()
    return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_batch_composition_does_not_change_results(llm, alone):
    assert tokens(llm.generate(PROMPTS, GREEDY)) == alone
    assert tokens(llm.generate(PROMPTS[::-1], GREEDY)) == alone[::-1]


def test_chunked_prefill_and_preemption_give_same_tokens(llama_dir, alone):
    # A tiny token budget chunks every long prompt; 24 blocks of 4 tokens cannot hold all six
    # sequences (one of max_model_len fits), so the scheduler must preempt and recompute.
    llm = make_llm(llama_dir, max_num_batched_tokens=16, num_kvcache_blocks=24, max_model_len=96,
                   enable_prefix_caching=False)
    assert tokens(llm.generate(PROMPTS, GREEDY)) == alone
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prefix_cache_queries_count_admissions_not_attempts(llama_dir):
    # 24 blocks of 4 tokens hold one 56-token prompt and its 10 new tokens (17 blocks) but not two
    # prompts (28): the second waits, asking for room at every step, and is looked up once, when
    # it is admitted.
    llm = make_llm(llama_dir, num_kvcache_blocks=24, max_model_len=96)
    prompts = [list(range(3, 59)), list(range(60, 116))]
    llm.generate(prompts, GREEDY)
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions == 0
    assert engine.block_manager.prefix_cache_queries == 112
    assert engine.block_manager.prefix_cache_hits == 0


def test_prefix_cache_hits_and_same_tokens(llama_dir, alone):
    llm = make_llm(llama_dir)
    bm = llm.llm_engine.block_manager
    first = llm.generate([PROMPTS[5]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    second = llm.generate([PROMPTS[5]], GREEDY)[0]
    # 64 prompt tokens: 15 full blocks hit; the last block is recomputed to get logits.
    assert second.num_cached_tokens == 60
    assert second.outputs[0].token_ids == first.outputs[0].token_ids == alone[5]
    assert bm.prefix_cache_hits == 60
    extended = llm.generate([PROMPTS[5] + [7, 8, 9, 10, 11]], GREEDY)[0]
    assert extended.num_cached_tokens == 64


def test_cache_salt_isolates_tenants(llama_dir):
    engine = make_llm(llama_dir).llm_engine
    prompt = list(range(10, 50))

    def run(rid: str, salt: str | None) -> int:
        return cached_tokens(engine, rid, prompt, GREEDY, salt)

    assert run("a1", "team-a") == 0
    assert run("b1", "team-b") == 0  # same prompt, other tenant: no hit
    assert run("n1", None) == 0
    assert run("a2", "team-a") == 36


def test_abort_frees_blocks_at_once(llama_dir):
    engine = make_llm(llama_dir).llm_engine
    bm = engine.block_manager
    engine.add_request("x", PROMPTS[5], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    engine.add_request("y", PROMPTS[2], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
    engine.step()
    engine.step()
    assert bm.num_free_blocks < bm.num_blocks
    seq = engine.scheduler.requests["x"]
    [out] = engine.abort_request("x")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert seq.status is SequenceStatus.FINISHED and seq.block_table == []
    engine.abort_request("y")
    assert bm.num_free_blocks == bm.num_blocks
    assert not engine.has_unfinished_requests()


def test_max_tokens_and_stop_token(llm, alone):
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == alone[0][:3]
    assert out.outputs[0].finish_reason == "length"
    stop_tok = alone[0][4]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop_tok]))[0]
    first = alone[0].index(stop_tok)
    assert out.outputs[0].token_ids == alone[0][: first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_tok


def test_min_tokens_holds_back_stop_tokens(llm, alone):
    stop_tok = alone[0][0]
    params = SamplingParams(temperature=0, max_tokens=5, min_tokens=3, stop_token_ids=[stop_tok])
    out = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    assert stop_tok not in out.token_ids[:3] and len(out.token_ids) >= 3


def test_stop_string_truncates_text(llm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    full = llm.generate(["hello world"], params)[0].outputs[0].text
    assert len(full) > 4
    stop = full[2:4]
    idx = full.find(stop)
    out = llm.generate(["hello world"], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0]
    assert out.outputs[0].text == full[:idx]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    kept = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=stop, include_stop_str_in_output=True)
    assert llm.generate(["hello world"], kept)[0].outputs[0].text == full[: idx + len(stop)]


def test_seed_is_deterministic_and_independent_of_batch(llm):
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    solo = llm.generate([PROMPTS[1]], params)[0].outputs[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    batched = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[3]], [other, params, other])
    assert batched[1].outputs[0].token_ids == solo
    different = SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True)
    assert llm.generate([PROMPTS[1]], different)[0].outputs[0].token_ids != solo


def test_top_k_one_is_greedy(llm, alone):
    params = SamplingParams(temperature=0.8, top_k=1, max_tokens=10, ignore_eos=True)
    assert llm.generate([PROMPTS[2]], params)[0].outputs[0].token_ids == alone[2]


def test_string_prompt_and_outputs_shape(llm):
    out = llm.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
    assert out.prompt == "def add(a, b):"
    assert out.prompt_token_ids == llm.get_tokenizer().encode("def add(a, b):")
    assert len(out.outputs[0].token_ids) == 4 and isinstance(out.outputs[0].text, str)


def test_speculative_config_is_validated(llama_dir):
    with pytest.raises(ValueError, match="method"):
        LLM(str(llama_dir), speculative_config={"method": "medusa", "num_speculative_tokens": 3})


def test_a_tenants_long_queue_does_not_hold_another_tenant(llama_dir):
    """The gateway salts each team's requests (tenant = the salt up to ':'). Admission was first come,
    first served: team b's one request waited until all eight of team a's had run, two at a time.
    A free place now goes to the waiting tenant that runs fewest."""
    engine = make_llm(llama_dir, max_num_seqs=2).llm_engine
    params = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0)
    for i in range(8):
        engine.add_request(f"a{i}", "hello there", params, cache_salt="team-a")
    engine.add_request("b0", "hello there", params, cache_salt="team-b:its-own")
    engine.abort_request("a7")  # a waiting request leaves the queue's count as well
    finished_before_b = 0
    while "b0" not in {seq.request_id for seq in engine.scheduler.running}:
        finished_before_b += sum(out.finished for out in engine.step() if out.request_id != "b0")
    assert finished_before_b == 0  # first come, first served: 7
    while engine.has_unfinished_requests():
        engine.step()
    assert not engine.scheduler._waiting_tenants  # every count back to nothing


def test_a_tenant_holding_every_place_makes_room_for_another(llama_dir):
    """Admission was fair but nothing preempted: a tenant whose long generations held every running
    place (here both, as one request with n=2 does on the server) made another tenant's request wait
    until one of them finished. A tenant waiting below its share (places / tenants) now takes the
    place of the most recently admitted request of a tenant above it, which is recomputed later."""
    engine = make_llm(llama_dir, max_num_seqs=2).llm_engine
    long = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0)
    for i in range(2):
        engine.add_request(f"a{i}", "hello there", long, cache_salt="team-a")
    engine.step()
    engine.step()
    engine.add_request("b0", "hello there", SamplingParams(max_tokens=4, ignore_eos=True, temperature=0),
                       cache_salt="team-b")
    finished_before_b = 0
    while "b0" not in {seq.request_id for seq in engine.scheduler.running}:
        finished_before_b += sum(out.finished for out in engine.step())
    assert finished_before_b == 0  # before: one of team a's 60-token generations first
    assert engine.scheduler.num_preemptions == 1
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
    assert len(outputs["a0"]) == len(outputs["a1"]) == 60  # the preempted one is recomputed, not cut
    assert engine.scheduler.num_preemptions == 1  # the shares hold: no request goes back and forth


def test_a_full_cache_preempts_the_tenant_running_most(llama_dir):
    """When a growing request needs a block and none is free, the victim was the most recently
    admitted request, whoever's: another tenant's one request, admitted last, was preempted again and
    again by the growth of a tenant running many. It is now the most recently admitted request of
    the tenant running most."""
    engine = make_llm(llama_dir, num_kvcache_blocks=40, max_model_len=128).llm_engine
    long = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0)
    for i in range(3):
        engine.add_request(f"a{i}", list(range(3 + i, 23 + i)), long, cache_salt="team-a")
    engine.step()
    engine.add_request("b0", list(range(50, 70)), long, cache_salt="team-b")
    preempted: list[str] = []
    while engine.has_unfinished_requests():
        before = {seq.request_id for seq in engine.scheduler.running}
        engine.step()
        waiting = {seq.request_id for seq in engine.scheduler.waiting}
        preempted += sorted(before & waiting)
    assert preempted and "b0" not in preempted  # before: b0 first


def test_a_tenants_flood_of_prompts_does_not_evict_another_tenants_prefixes(llama_dir):
    """Freed blocks keep their prefixes until the allocator reuses them, least recently used first,
    whoever's: a tenant sending many distinct prompts pushed every other tenant's cached prefixes out
    (team b's prompt, sent again, read 0 cached tokens). A block is now taken from the tenant holding
    the most cached free blocks, so one tenant's flood evicts its own prefixes first."""
    engine = make_llm(llama_dir, num_kvcache_blocks=40, max_model_len=128).llm_engine
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)

    def run(request_id: str, prompt: list[int], salt: str) -> int:
        return cached_tokens(engine, request_id, prompt, params, salt)

    b_prompt = list(range(100, 117))
    run("b0", b_prompt, "team-b")
    for i in range(30):  # 30 distinct prompts of 24 tokens: the cache over many times
        run(f"a{i}", [3 + (i + 7 * j) % 90 for j in range(24)], "team-a")
    assert run("b1", b_prompt, "team-b") == 16  # before: 0
