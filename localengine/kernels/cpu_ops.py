"""The engine's own CPU ops (cpu_matmul.cpp: weight-only int8/int4 matmuls for decode; cpu_ops.cpp:
fp32 norms, rotary embedding, silu_and_mul, decode attention over the paged cache and a whole
decoder layer in one call; cpu_speculator.cpp: the MLP speculator's greedy proposal), built on
first use.

`ops()` compiles the C++ file once per machine and PyTorch version with PyTorch's extension builder
(a C++ compiler and ninja are needed; the build lands in PyTorch's extension cache and later
starts load it in well under a second). It returns None, and the engine keeps PyTorch's own kernels
(layers/quantization.py), when the CPU lacks AVX2/FMA, the build fails, or
`SLIPSTREAM_CPU_KERNELS=0` says not to try. Why the engine has its own: see the C++ file's header.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, cast

import torch
from filelock import FileLock

log = logging.getLogger(__name__)
KERNELS = Path(__file__).parent
SOURCES = [KERNELS / "cpu_ops.cpp", KERNELS / "cpu_matmul.cpp", KERNELS / "cpu_speculator.cpp"]
HEADERS = [KERNELS / "cpu_ops.h"]
# Rows up to this many go through the kernels; longer (prefill) chunks dequantize the layer's
# weight and use PyTorch's GEMM (bf16 where `fast_bf16_gemm`, else fp32), which reuses each weight across rows far better. Measured on
# SmolLM2's 120 linears (2 threads, 2-core AVX2): at 32 rows the kernels took 104 ms (int8) and
# 124 ms (int4) against 232 and 251 ms dequantized; at 1 row 11.5 and 11.2 against 382 and 548.
MAX_ROWS = 32


class CpuOps(Protocol):
    """torch.ops.slipstream_cpu as the C++ files register it (TORCH_LIBRARY: cpu_ops.cpp, cpu_speculator.cpp)."""

    def use_avx512(self, enabled: bool) -> None: ...
    def fp32_matmul(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor: ...
    def int8_matmul(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor: ...
    def int4_matmul(self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                    group_size: int) -> torch.Tensor: ...
    def int4_dequantize(self, packed: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, group_size: int) -> torch.Tensor: ...
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...
    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None: ...
    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor: ...
    def rotary_embedding(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None: ...
    def decode_layer(self, x: torch.Tensor, residual: torch.Tensor, weights: Sequence[torch.Tensor], kinds: Sequence[int],
                     groups: Sequence[int], input_norm: torch.Tensor, post_norm: torch.Tensor, eps: float, cos: torch.Tensor,
                     sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                     block_tables: torch.Tensor, seq_lens: torch.Tensor, num_heads: int, num_kv_heads: int, scale: float,
                     kv_scales: Sequence[torch.Tensor]) -> torch.Tensor: ...
    def paged_attention_decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float) -> torch.Tensor: ...
    def mlp_speculate_greedy(self, hidden: torch.Tensor, last_tokens: torch.Tensor, proj: Sequence[torch.Tensor],
                             emb: Sequence[torch.Tensor], ln_weight: Sequence[torch.Tensor], ln_bias: Sequence[torch.Tensor],
                             head: Sequence[torch.Tensor], draft_vocab: torch.Tensor, emb_scale: float, eps: float,
                             k: int) -> torch.Tensor: ...


def _build_dir() -> Path:
    """PyTorch's extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions), one folder per
    PyTorch installation: the build is per machine, not per data directory, and two environments
    (two PyTorch installs) never build into one folder at once."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    install = hashlib.sha1(str(Path(torch.__file__).resolve()).encode()).hexdigest()[:8]
    # PyTorch's builder rebuilds when a source changes but not when a header does: the sources'
    # and headers' contents name the folder, so any change builds afresh.
    code = hashlib.sha1(b"".join(f.read_bytes() for f in SOURCES + HEADERS)).hexdigest()[:8]
    return Path(root) / f"slipstream-cpu-ops-torch-{torch.__version__}-{install}-{code}".replace("+", "_")


@contextlib.contextmanager
def _building(build: Path) -> Iterator[None]:
    """Hold the build directory. PyTorch's builder waits, without a limit, while its own lock file
    exists, and a build that was killed (a Ctrl-C during a first start) leaves it behind, so every
    later start would hang. Ours is an flock, which the kernel releases when its holder dies: while
    we hold it no other start is building here, and a PyTorch lock file found is a dead build's."""
    with FileLock(build / "slipstream.lock"):
        lock = build / "lock"
        if lock.exists():
            log.warning("removing %s, left by a build that did not finish", lock)
            lock.unlink(missing_ok=True)
        yield


@functools.cache
def ops() -> CpuOps | None:
    """torch.ops.slipstream_cpu once built and loaded, else None (the reason is logged once)."""
    if os.environ.get("SLIPSTREAM_CPU_KERNELS", "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        log.info("CPU kernels skipped: this CPU lacks AVX2 (PyTorch's ops are used)")
        return None
    try:
        from torch.utils import cpp_extension

        build = _build_dir()
        build.mkdir(parents=True, exist_ok=True)
        with _building(build):
            cpp_extension.load(name="slipstream_cpu_ops", sources=[str(f) for f in SOURCES], build_directory=str(build),
                               extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-ffp-contract=off"],
                               extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build: the engine still runs
        log.warning("CPU kernels could not be built (%s); PyTorch's ops are used", exc)
        return None
    # PyTorch's choice of vector width, so ATEN_CPU_CAPABILITY=avx2 narrows both alike.
    loaded = cast(CpuOps, torch.ops.slipstream_cpu)  # registered by the C++ files, typed by CpuOps
    loaded.use_avx512(torch.backends.cpu.get_cpu_capability() == "AVX512")
    return loaded


def built() -> CpuOps:
    """`ops()` where the caller has seen them load (`ops() is not None`, cached: the same answer)."""
    loaded = ops()
    if loaded is None:
        raise RuntimeError("the engine's CPU ops are not built (cpu_ops.ops() is None)")
    return loaded


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel reports them (/proc/cpuinfo, Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def fast_bf16_gemm() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (Intel AMX, or AVX512-BF16): PyTorch's
    bf16 GEMM (oneDNN) then runs several times its fp32 one; elsewhere bf16 is converted in software
    and runs slower than fp32."""
    return not cpu_flags().isdisjoint({"amx_bf16", "avx512_bf16"})


def for_fp32(x: torch.Tensor) -> CpuOps | None:
    """The ops when they serve x (fp32 on CPU), else None."""
    return ops() if x.dtype == torch.float32 and x.device.type == "cpu" else None
