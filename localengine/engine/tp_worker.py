"""The worker processes of a tensor-parallel engine: ranks 1..N-1.

Each is spawned (not forked: CUDA and threads do not survive a fork), joins the process group,
loads its shard of the weights, sizes its KV cache with the others, then runs whatever forward
pass rank 0 broadcasts until rank 0 sends the stop (or the engine's process exits: they are
daemonic).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import torch

from localengine import distributed
from localengine.config import Config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]  # an AF_INET address: (host, port)
        return port


def _worker_main(config: Config, rank: int, port: int) -> None:
    from localengine.engine.model_runner import ModelRunner

    if config.torch_device.type == "cpu" and not config.num_threads:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.tensor_parallel_size))
    distributed.init(rank, config.tensor_parallel_size, port, config.torch_device)
    try:
        ModelRunner(config, set(), rank).run_worker_loop()
    finally:
        distributed.destroy()


class TensorParallelWorkers:
    """Starts ranks 1..N-1 and joins this process to the group as rank 0."""

    def __init__(self, config: Config):
        from localengine.models.llama import ModelArgs

        # Refuse a split the model cannot take before any process starts.
        ModelArgs.from_hf(config.hf_config, 0, config.tensor_parallel_size).check_tensor_parallel()
        port = _free_port()
        ctx = mp.get_context("spawn")
        self.processes = [ctx.Process(target=_worker_main, args=(config, rank, port), daemon=True,
                                      name=f"localengine-tp{rank}")
                          for rank in range(1, config.tensor_parallel_size)]
        for process in self.processes:
            process.start()
        distributed.init(0, config.tensor_parallel_size, port, config.torch_device)

    def join(self, timeout: float = 30.0) -> None:
        """After rank 0 has sent the stop: wait for the workers, then leave the group."""
        for process in self.processes:
            process.join(timeout)
            if process.is_alive():
                process.terminate()
        distributed.destroy()
