"""Prompt-cache optimizer: canonical JSON, volatile content detection and moves, Anthropic breakpoint
placement / OpenAI `prompt_cache_key`, a ledger that predicts and verifies cache reads, and the
warm-then-fan-out gate. The pipeline stage that ties them together is sdk/promptcache/stage.py;
docs/prompt-cache.md documents the policy keys and the rules each part follows.
"""
