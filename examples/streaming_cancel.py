"""Streaming with cancellation that reaches the provider.

Breaking out of a stream (or closing it, or a client timing out) drops the upstream connection at
once, so the provider stops generating — and billing — tokens nobody will read. The emulator's
counters show it.

    python examples/streaming_cancel.py
"""

from __future__ import annotations

import time

import openai
from _local import TEAM_KEY, emulator_stats, emulator_url, policy_file

from gateway.testing import running_proxy


def main() -> None:
    with emulator_url(per_output_token_ms=20, default_output_tokens=500) as upstream, running_proxy([policy_file(upstream)]) as proxy:
        before = emulator_stats(upstream)  # an emulator you started has counted earlier requests too
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY)
        stream = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "A very long essay"}], stream=True)
        for index, chunk in enumerate(stream):
            if chunk.choices and chunk.choices[0].delta.content:
                print("got:", chunk.choices[0].delta.content)
            if index == 3:
                break
        stream.close()
        closed = time.perf_counter()
        while (stats := emulator_stats(upstream))["cancelled_streams"] - before["cancelled_streams"] < 1:
            time.sleep(0.005)
        seen = 1000 * (time.perf_counter() - closed)
        print(f"upstream cancelled: {stats['cancelled_streams'] - before['cancelled_streams']} (seen {seen:.0f} ms after close)")
        print(f"upstream completed: {stats['completed_streams'] - before['completed_streams']}")


if __name__ == "__main__":
    main()
