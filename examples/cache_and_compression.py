"""The semantic response cache and prompt compression, with before/after numbers.

    python examples/cache_and_compression.py

The first part asks a question, then a paraphrase of it, then a near-miss that must NOT be served
from the cache (a different number). The second part sends what most RAG applications send —
reference material pasted into a plain user message, an acknowledgement, then the question — with
compression's default settings, and prints the report header: tokens before and after, and where
compression acted.
"""

from __future__ import annotations

import os
import tempfile

import openai
from _local import TEAM_KEY, emulator_url, policy_file

from gateway.testing import running_proxy

POLICY = """semantic_cache: {enabled: true, min_precision: 0.9}
compression: {enabled: true, documents: {min_tokens: 200}}
prompt_cache: {enabled: false}
"""

TOPICS = [
    "The scheduler runs decode requests first and fills the rest of the token budget with prefill chunks.",
    "Each KV block holds sixteen tokens, and blocks are reference counted so prefixes can be shared.",
    "Evicted blocks go to the back of an LRU list and are reused only when no free block remains.",
    "Speculative decoding proposes several tokens and verifies them in one forward pass of the target.",
    "The tokenizer is a byte-level BPE trained on the Python standard library's own sources.",
]


def ask(client: openai.OpenAI, question: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=[{"role": "user", "content": question}], temperature=0)
    print(f"{raw.headers['x-slipstream-cache']:>12}  {question}")


def main() -> None:
    os.environ.setdefault("SLIPSTREAM_DATA_DIR", tempfile.mkdtemp(prefix="slipstream-cache-"))
    with emulator_url() as upstream, running_proxy([policy_file(upstream, POLICY)]) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=TEAM_KEY)
        print("semantic cache:")
        ask(client, "How do I reset my password on the website?")
        ask(client, "How do I reset my password on the website?")
        ask(client, "How can I reset the password for my account on the website?")
        ask(client, "How do I reset my password on the website in 5 minutes?")

        document = " ".join(TOPICS[i % len(TOPICS)].replace("The", f"Section {i}: the", 1) for i in range(200))
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=[
                {"role": "user", "content": f"Reference documents:\n\n{document}"},
                {"role": "assistant", "content": "Thanks, I have read them."},
                {"role": "user", "content": "How many tokens does each KV block hold?"},
            ],
        )
        print(f"\ncompression: {raw.headers['x-slipstream-compression']} (input tokens before and after, where)")


if __name__ == "__main__":
    main()
