"""The async engine: streaming per request, abort by id and by leaving the loop, model off the loop."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest

from localengine import AsyncLLMEngine, SamplingParams

LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(llama_dir):
    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=256,
                                      num_kvcache_blocks=128)
    yield engine
    engine.shutdown()


def all_blocks_free(engine: AsyncLLMEngine) -> bool:
    bm = engine.engine.block_manager
    return not engine.engine.has_unfinished_requests() and bm.num_free_blocks == bm.num_blocks


async def wait_idle(engine: AsyncLLMEngine) -> None:
    for _ in range(500):
        if all_blocks_free(engine):
            return
        await asyncio.sleep(0.01)


async def test_streams_are_cumulative_and_repeatable(engine):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    seen = [out async for out in engine.generate([5, 6, 7, 8], params, "s1")]
    lengths = [len(o.outputs[0].token_ids) for o in seen]
    assert lengths == sorted(set(lengths)) and lengths[-1] == 6  # outputs a reader did not take yet are merged
    assert all(o.outputs[0].token_ids == seen[-1].outputs[0].token_ids[:n] for o, n in zip(seen, lengths, strict=True))
    assert seen[-1].finished and not any(o.finished for o in seen[:-1])
    again = [o async for o in engine.generate([5, 6, 7, 8], params, "s2")]
    assert again[-1].outputs[0].token_ids == seen[-1].outputs[0].token_ids


async def test_model_steps_run_in_the_engine_thread(engine, monkeypatch):
    runner = engine.engine.model_runner
    threads = []
    execute = runner.execute

    def recording(out):
        threads.append(threading.current_thread())
        return execute(out)

    monkeypatch.setattr(runner, "execute", recording)
    outs = [o async for o in engine.generate(list(range(3, 40)), SamplingParams(temperature=0, max_tokens=5), "t")]
    assert outs[-1].finished and threads
    assert all(t.name == "localengine-engine" for t in threads)
    assert threading.current_thread() not in threads


async def test_abort_by_id_ends_only_that_stream(engine):
    async def victim() -> list:
        outs = []
        async for out in engine.generate([9, 10, 11], LONG, "victim"):
            if not outs:
                engine.abort("victim")  # after its first token, while the survivor keeps going
            outs.append(out)
        return outs

    survivor = asyncio.create_task(_collect(engine.generate([9, 10, 11, 12], LONG, "survivor")))
    outs = await victim()
    assert outs[-1].outputs[0].finish_reason == "abort" and len(outs[-1].outputs[0].token_ids) < 200
    assert (await survivor)[-1].outputs[0].finish_reason == "length"
    await wait_idle(engine)
    assert all_blocks_free(engine)


async def _collect(stream) -> list:
    return [o async for o in stream]


async def test_leaving_the_loop_aborts(engine):
    stream = engine.generate([12, 13, 14], LONG, "leaver")
    async for _ in stream:
        break
    await stream.aclose()
    await wait_idle(engine)
    assert all_blocks_free(engine)


async def test_bad_request_raises_in_the_caller(engine):
    with pytest.raises(ValueError, match="max_model_len"):
        async for _ in engine.generate(list(range(300)), LONG, "too-long"):
            pass


async def test_a_slow_reader_holds_its_latest_output_only(engine):
    """Outputs are cumulative and the engine does not wait for readers: a stream whose reader was slow
    (a client reading its SSE slowly) queued one output per step, each a copy of the prompt and of all
    generated so far, so a request of n tokens held about n squared / 2 tokens in the memory of the
    process every team shares. A stream now keeps only its newest output (vLLM merges a reader's
    pending outputs likewise), and the chat stream's merge of n choices waits for its reader."""
    from localengine.serving_chat import ChatRequest, chat_completion_events

    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    stream = engine.generate(list(range(3, 40)), params, "slow")
    first = await anext(stream)
    await wait_idle(engine)  # the engine finished while the reader read nothing
    rest = [out async for out in stream]
    # Usually the first output holds one token and the rest is the finished one (before: 59 outputs);
    # on a loaded machine the engine's thread may run steps before the reader wakes, and those merge
    # into the first.
    final = [first, *rest][-1]
    assert len(rest) <= 1 and final.finished and len(final.outputs[0].token_ids) == 60

    req = ChatRequest("chatcmpl-slow", "m", list(range(3, 40)), params, n=2, stream=True, include_usage=False,
                      cache_salt=None, top_logprobs=None, created=0)
    events = chat_completion_events(engine, req)
    chunks = [await anext(events) for _ in range(3)]  # the two role chunks, then the first token's
    await wait_idle(engine)
    late = [chunk async for chunk in events]
    # What can wait for a reader, whatever the engine did meanwhile: the merge's queue (one item a
    # choice), an item each choice's pump holds while the queue is full, and each stream's newest
    # output, then [DONE]: 3 n + 1 = 7 (a quiet machine shows 6). Before: a chunk per token of each choice, about 120.
    assert len(late) <= 3 * req.n + 1
    texts = ["", ""]
    for chunk in chunks + late:
        if chunk.startswith(b"data: {"):
            for choice in orjson.loads(chunk[6:])["choices"]:
                texts[choice["index"]] += choice["delta"]["content"]
    assert texts == [final.outputs[0].text] * 2
