"""What vLLM's tests ask that `slipstream engine serve` with a bundled model cannot do, and why.

Each pattern (fnmatch, on the test's name with its parameters; `[[]` is a literal `[`) is marked
xfail with its reason, so a run shows which fail as expected and which pass anyway (XPASS).
docs/localengine.md lists them.
"""

VLLM_INTERNALS = "calls vLLM's own Python classes (request models, SamplingParams), not the HTTP server"
# Tests of vLLM's own functions that fail on the stand-ins before they could skip themselves
# (mocks specced on vLLM classes, pytest.raises on vLLM's exception types): skipped by name.
VLLM_INTERNAL_TESTS = ["test_load_prompt_embeds*", "test_disable_prompt_embeds*"]

_PROMPT_LOGPROBS = "prompt logprobs are not computed by this engine (refused with a 400 naming the field)"
_GUIDED = "guided decoding / structured outputs are not supported (refused with a 400 naming the field)"
_SMOLLM2_STOPS = ("SmolLM2-135M-Instruct answers the bare question 'What is an LLM?' with <|im_end|> at once "
                  "(Qwen3-0.6B continues it): finish_reason 'stop' and empty completions")

EXPECTED_FAILURES: dict[str, str] = {
    # chat_completion/test_chat.py (vLLM serves HuggingFaceH4/zephyr-7b-beta and a LoRA adapter)
    "*[[]zephyr-lora]": "LoRA adapters are not supported: `zephyr-lora` is not served (404 model_not_found)",
    "test_prompt_logprobs_chat[[]*beta-[01]]": _PROMPT_LOGPROBS,
    "test_more_than_one_prompt_logprobs_chat*": _PROMPT_LOGPROBS,
    "test_single_chat_session[[]HuggingFaceH4*": (
        "compares usage to zephyr's 37 prompt tokens and to no prompt_tokens_details (vLLM without "
        "--enable-prompt-tokens-details); this server always reports cached_tokens"),
    "test_structured_outputs_choice_chat": _GUIDED,
    "test_structured_outputs_json_chat": _GUIDED,
    "test_structured_outputs_regex_chat": _GUIDED,
    "test_structured_outputs_choice_chat_logprobs": _GUIDED,
    "test_response_format_json_object": "JSON mode is not supported (response_format json_object is a 400)",
    "test_response_format_json_schema": "structured outputs are not supported (response_format json_schema is a 400)",
    "test_complex_message_content": "expects the 7B model's exact answer '2'; SmolLM2-135M answers with the sum written out ('1+1 = 2')",
    # completion/test_completion.py (vLLM serves Qwen/Qwen3-0.6B)
    "test_logprob_token_ids*": ("logprob_token_ids, allowed_token_ids and return_tokens_as_token_ids are not "
                                "supported (the engine reports the top-N logprobs only)"),
    "test_prompt_logprobs_completion[[]*B-[01]]": _PROMPT_LOGPROBS,
    "test_completion_streaming*": _SMOLLM2_STOPS,
    "test_parallel_no_streaming*": _SMOLLM2_STOPS,
    "test_parallel_streaming*": _SMOLLM2_STOPS,
    "test_batch_completions*": "beam search (use_beam_search) is not supported (a 400 naming the field)",
    "test_echo_logprob_completion*": "echo with logprobs needs the prompt's logprobs: " + _PROMPT_LOGPROBS,
}
