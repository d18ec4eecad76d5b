"""The engine's own CPU matmuls for weight-only int8/int4 decode (cpu_gemv.cpp), built on first use.

`ops()` compiles the C++ file once per machine and PyTorch version with PyTorch's extension builder
(a C++ compiler and ninja are needed; the build lands under the data directory and later starts
load it in well under a second). It returns None, and the engine keeps PyTorch's own kernels
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
SOURCE = Path(__file__).with_name("cpu_gemv.cpp")
# Rows up to this many go through the kernels; longer (prefill) chunks dequantize the layer's
# weight and use PyTorch's fp32 GEMM, which reuses each weight across rows far better.
MAX_ROWS = 8


def _build_dir() -> Path:
    from localengine.models.gguf import data_dir

    tag = f"torch-{torch.__version__}".replace("+", "_")
    return data_dir() / "kernels" / tag


@functools.cache
def ops() -> Any:
    """torch.ops.slipstream_cpu once built and loaded, else None (the reason is logged once)."""
    if os.environ.get("SLIPSTREAM_CPU_KERNELS", "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        log.info("CPU kernels skipped: this CPU lacks AVX2 (PyTorch's int8/int4 kernels are used)")
        return None
    try:
        from torch.utils import cpp_extension

        build = _build_dir()
        build.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name="slipstream_cpu_gemv", sources=[str(SOURCE)], build_directory=str(build),
                           extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"],
                           is_python_module=False, verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build: the engine still runs
        log.warning("CPU kernels could not be built (%s); PyTorch's int8/int4 kernels are used", exc)
        return None
    return torch.ops.slipstream_cpu
