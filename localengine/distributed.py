"""Tensor parallelism's process group: one process per rank, over torch.distributed.

Rank 0 is the engine's own process (scheduler, sampler, detokenizer); ranks 1..N-1 are worker
processes (engine/tp_worker.py) that hold their shard of the weights and KV cache and run the
same forward pass in lock step. NCCL on CUDA, gloo on CPU (so the suite proves TP on this
machine). Layers take their rank and size from the model's args, never from here, so an
unsharded model (a draft) can live in a TP process.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


def init(rank: int, world_size: int, port: int, device: torch.device) -> None:
    if dist.is_initialized():
        raise RuntimeError("this process already runs a tensor-parallel engine; one per process")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(rank)
    # How long a rank waits for the others at a collective: a rank still loading its shard on a
    # loaded CPU machine took more than 120 s (gloo's recv timed out beside `stress --cpu 4`).
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def all_reduce_min(value: int) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def gather_to_first(x: torch.Tensor, world_size: int) -> torch.Tensor | None:
    """Concatenate every rank's `x` along the last dim on rank 0; None on the others."""
    parts = [torch.empty_like(x) for _ in range(world_size)] if dist.get_rank() == 0 else None
    dist.gather(x, parts, dst=0)
    return torch.cat(parts, dim=-1) if parts is not None else None


def broadcast_from_first(obj: Any = None) -> Any:
    """Rank 0 sends `obj` (pickled) to every rank; every rank returns it."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
