"""Tiny random-initialised Hugging Face checkpoints saved to disk, loaded by our loader."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import skip_without_extra

skip_without_extra("engine")  # the whole folder: every test here loads torch and transformers

# The Triton interpreter must be chosen before triton is first imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

TEXT = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! This is a tiny tokenizer for tests.",
    "import os\nimport sys\nprint(sys.argv)\n",
]
VOCAB = 320


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|end|>")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return fast


def hf_config(model_type: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  eos_token_id=0, bos_token_id=None, tie_word_embeddings=False)
    if model_type == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if model_type == "mistral":
        return MistralConfig(**common, sliding_window=4096)
    if model_type == "qwen2":
        return Qwen2Config(**common)
    if model_type == "qwen3":
        return Qwen3Config(**common, head_dim=16)
    raise ValueError(model_type)


def save_tiny_model(model_type: str, out: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(model_type))
    with torch.no_grad():  # bigger-than-default weights make logits decisive, so greedy ties are rare
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
            elif model_type == "qwen2" and p.dim() == 1 and p.shape[0] != 64:
                p.normal_(0, 0.1)  # random q/k/v biases, so the bias path is exercised
    model.save_pretrained(out, safe_serialization=True)
    make_tokenizer().save_pretrained(out)
    return out


def make_llm(path, **kwargs):
    """An engine over a tiny test model: fp32, small blocks, a fixed KV cache (kwargs override)."""
    from localengine import LLM

    args = dict(dtype="float32", block_size=4, max_model_len=256, max_num_seqs=16, num_kvcache_blocks=256)
    args.update(kwargs)
    return LLM(str(path), **args)


def cached_tokens(engine: Any, request_id: str, prompt: list[int], params: Any, salt: str | None) -> int:
    """Run one request alone through `engine` (an LLMEngine) to its end: how many of its prompt tokens
    came from the prefix cache."""
    engine.add_request(request_id, prompt, params, cache_salt=salt)
    cached = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                cached = out.num_cached_tokens
    return cached


@contextmanager
def ops_at_width(width: str) -> Iterator[None]:
    """The engine's CPU ops with their AVX2 ("avx2") or AVX-512 ("avx512") forms, then back to the
    engine's own choice (AVX-512 where PyTorch's CPU capability is AVX512); skips where the ops are
    not built or the CPU has no AVX-512."""
    from localengine.kernels import cpu_ops

    ops = cpu_ops.ops()
    if ops is None:
        pytest.skip("the engine's CPU ops are not built on this machine (no AVX2 or no compiler)")
    wide = torch.backends.cpu.get_cpu_capability() == "AVX512"
    if width == "avx512" and not wide:
        pytest.skip("this CPU (or ATEN_CPU_CAPABILITY) has no AVX-512")
    ops.use_avx512(width == "avx512")
    try:
        yield
    finally:
        ops.use_avx512(wide)


@pytest.fixture(params=["engine", "pytorch"])
def kernels(request, monkeypatch):
    """A test that takes it runs on the engine's own CPU ops (kernels/cpu_ops.cpp) and on PyTorch's
    (as where they cannot be built)."""
    from localengine.kernels import cpu_ops

    if request.param == "pytorch":
        monkeypatch.setattr(cpu_ops, "ops", lambda: None)
    elif cpu_ops.ops() is None:
        pytest.skip("the engine's CPU ops are not built on this machine (no AVX2 or no compiler)")
    return request.param


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """The CPU is shared with other test runs and tiny models gain nothing from more threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {t: save_tiny_model(t, root / t) for t in ("llama", "mistral", "qwen2", "qwen3")}


@pytest.fixture(scope="session")
def llama_dir(model_dirs) -> Path:
    return model_dirs["llama"]


@contextmanager
def engine_server(engine: Any, served_model_name: str) -> Iterator[str]:
    """`slipstream engine serve`'s app over `engine` on a free loopback port, in a thread; yields its URL."""
    import uvicorn

    from gateway.testing import free_port
    from localengine.server import create_app
    from tests.helpers import wait_until

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(engine, served_model_name), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    wait_until(lambda: srv.started, "the engine server started")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def tiny_client(llama_dir) -> Iterator[Any]:
    """The official `openai` client against `slipstream engine serve` over the tiny Llama (served as
    "tiny", a 128-token context), one engine per test module."""
    import openai

    from localengine.engine.async_engine import AsyncLLMEngine

    engine = AsyncLLMEngine.from_args(str(llama_dir), dtype="float32", block_size=4, max_model_len=128,
                                      num_kvcache_blocks=256)
    try:
        with engine_server(engine, "tiny") as url:
            yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    finally:
        engine.shutdown()
