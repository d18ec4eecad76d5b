"""The engine's own CPU ops (cpu_ops.cpp: weight-only int8/int4 matmuls and fp32 norms for decode),
built on first use.

`ops()` compiles the C++ file once per machine and PyTorch version with PyTorch's extension builder
(a C++ compiler and ninja are needed; the build lands in PyTorch's extension cache and later
starts load it in well under a second). It returns None, and the engine keeps PyTorch's own kernels
(layers/quantization.py), when the CPU lacks AVX2/FMA, the build fails, or
`SLIPSTREAM_CPU_KERNELS=0` says not to try. Why the engine has its own: see the C++ file's header.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("cpu_ops.cpp")
# Rows up to this many go through the kernels; longer (prefill) chunks dequantize the layer's
# weight and use PyTorch's fp32 GEMM, which reuses each weight across rows far better.
MAX_ROWS = 8


def _build_dir() -> Path:
    """PyTorch's extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions), one folder per
    PyTorch version: the build is per machine, not per data directory."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    return Path(root) / f"slipstream-cpu-ops-torch-{torch.__version__}".replace("+", "_")


@functools.cache
def ops() -> Any:
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
        cpp_extension.load(name="slipstream_cpu_ops", sources=[str(SOURCE)], build_directory=str(build),
                           extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build: the engine still runs
        log.warning("CPU kernels could not be built (%s); PyTorch's ops are used", exc)
        return None
    return torch.ops.slipstream_cpu


def for_fp32(x: torch.Tensor) -> Any:
    """The ops when they serve x (fp32 on CPU), else None."""
    return ops() if x.dtype == torch.float32 and x.device.type == "cpu" else None
