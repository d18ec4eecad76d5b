"""The proxy with the official clients: point `base_url` at `slipstream serve`, send the team key.

    slipstream emulate --port 8081 &                       # or real providers in the policy
    slipstream serve --policy my-team.yaml --port 8080 &
    SLIPSTREAM_PROXY_URL=http://127.0.0.1:8080 SLIPSTREAM_TEAM_KEY=... python examples/proxy_clients.py

Without SLIPSTREAM_PROXY_URL, this script starts an emulator and a proxy itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import anthropic
import openai
from _local import TEAM_KEY, emulator_url, policy_file


@contextlib.contextmanager
def proxy() -> Iterator[tuple[str, str]]:
    if url := os.environ.get("SLIPSTREAM_PROXY_URL"):
        yield url.rstrip("/"), os.environ["SLIPSTREAM_TEAM_KEY"]
        return
    from gateway.testing import running_proxy

    with emulator_url() as upstream, running_proxy([policy_file(upstream)]) as running:
        yield running.url, TEAM_KEY


def main() -> None:
    with proxy() as (url, key):
        gpt = openai.OpenAI(base_url=f"{url}/v1", api_key=key)
        raw = gpt.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": "Hello"}])
        print("openai:", raw.parse().choices[0].message.content)
        print("  answered by", raw.headers["x-slipstream-route"], "in", raw.headers["x-slipstream-overhead-ms"], "ms of proxy time")

        claude = anthropic.Anthropic(base_url=url, api_key=key)
        with claude.messages.stream(model="claude-sonnet-5", max_tokens=64, messages=[{"role": "user", "content": "Hello"}]) as stream:
            print("anthropic:", "".join(stream.text_stream))
            print("  usage:", stream.get_final_message().usage.model_dump(exclude_none=True))

        try:
            openai.OpenAI(base_url=f"{url}/v1", api_key="not-a-team-key", max_retries=0).models.list()
        except openai.AuthenticationError as error:
            print("wrong key ->", error.status_code, error.body)


if __name__ == "__main__":
    main()
