"""The drop-in SDK: change one import line, and the team's policy runs in process.

    python examples/sdk_dropin.py
"""

from __future__ import annotations

import asyncio

from _local import emulator_url, policy_file

# from openai import OpenAI, AsyncOpenAI            <- before
# from anthropic import Anthropic, AsyncAnthropic
from sdk import (  # <- after: the only change
    Anthropic,
    AsyncAnthropic,
    AsyncOpenAI,
    OpenAI,
)


def sync_calls(policy: str) -> None:
    gpt = OpenAI(policy=policy)
    reply = gpt.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hello!"}])
    print("openai:", reply.choices[0].message.content)

    claude = Anthropic(policy=policy)
    message = claude.messages.create(model="claude-sonnet-5", max_tokens=64, messages=[{"role": "user", "content": "Hello!"}])
    print("anthropic:", message.content[0].text)

    # Streaming with early exit: leaving the `with` block cancels the upstream call.
    with claude.messages.stream(model="claude-sonnet-5", max_tokens=200, messages=[{"role": "user", "content": "A long story"}]) as stream:
        for index, text in enumerate(stream.text_stream):
            print("stream:", text)
            if index == 2:
                break  # the provider stops generating (and billing) now


async def async_calls(policy: str) -> None:
    async with AsyncOpenAI(policy=policy) as gpt, AsyncAnthropic(policy=policy) as claude:
        stream = await gpt.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Count"}], stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print("async openai:", chunk.choices[0].delta.content)
                break
        await stream.close()  # cancels the upstream call

        message = await claude.messages.create(model="claude-sonnet-5", max_tokens=32, messages=[{"role": "user", "content": "Hi"}])
        print("async anthropic:", message.content[0].text, f"({message.usage.output_tokens} output tokens)")


if __name__ == "__main__":
    with emulator_url(per_output_token_ms=5) as upstream:
        policy = str(policy_file(upstream))
        sync_calls(policy)
        asyncio.run(async_calls(policy))
