"""The async engine: streaming per request, abort by id and by leaving the loop, model off the loop."""

from __future__ import annotations

import asyncio

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


async def test_streams_are_cumulative_and_match_offline(engine):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    seen = [out async for out in engine.generate([5, 6, 7, 8], params, "s1")]
    assert [len(o.outputs[0].token_ids) for o in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[-1].finished and not any(o.finished for o in seen[:-1])
    again = [o async for o in engine.generate([5, 6, 7, 8], params, "s2")]
    assert again[-1].outputs[0].token_ids == seen[-1].outputs[0].token_ids


async def test_loop_stays_responsive_while_the_model_runs(engine):
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    outs = [o async for o in engine.generate(list(range(3, 60)), SamplingParams(temperature=0, max_tokens=20), "busy")]
    task.cancel()
    assert outs[-1].finished and ticks >= len(outs)


async def test_abort_by_id_ends_only_that_stream(engine):
    async def consume(rid: str) -> list:
        return [o async for o in engine.generate([9, 10, 11], LONG, rid)]

    victim = asyncio.create_task(consume("victim"))
    survivor = asyncio.create_task(consume("survivor"))
    await asyncio.sleep(0.05)
    engine.abort("victim")
    outs = await victim
    assert outs[-1].outputs[0].finish_reason == "abort" and len(outs[-1].outputs[0].token_ids) < 200
    assert (await survivor)[-1].outputs[0].finish_reason == "length"
    await wait_idle(engine)
    assert all_blocks_free(engine)


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
