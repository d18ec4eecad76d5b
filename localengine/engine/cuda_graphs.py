"""CUDA graphs for decode steps (nano-vllm's `capture_cudagraph`; vLLM's full-graph decode).

A decode step of a small model, or of any model at a small batch, is bound by the host launching
kernels one by one (a few microseconds each, dozens per layer). A captured graph replays every
kernel of the forward pass with one launch. Graphs are captured once, after the KV cache is
allocated, for a set of batch sizes (1, 2, 4, 8, then every 16 up to max_num_seqs, at most 512);
a decode step of n sequences replays the smallest graph of at least n, its extra rows padded.

What a graph needs, and how it gets it:
- Static inputs: token ids, positions, slots, sequence lengths, query starts and block tables live
  in device buffers allocated here, sized for the largest graph; every replay copies the step's
  values into their first n rows. The hidden states land in a static output buffer; the LM head
  runs eagerly on the n real rows.
- Padding rows must not touch real data: they write their K/V into a scratch block (one block
  past the block manager's, allocated with the cache and never handed out) and attend to it
  alone (sequence length 1).
- Host-side choices are frozen at capture: the attention launch sees a decode batch (query length
  1) whose sequences are max_model_len long, so anything it derives from lengths on the host (the
  split-KV segment count) is the most general one; the kernels read the real lengths on the device.
- One memory pool shared by every graph (captured largest first, so the smaller ones reuse it).

Eager instead: prefill and mixed steps, speculative verification (query length > 1), batches
larger than the largest graph, the PyTorch attention backend (its gather sizes come from host
lengths), tensor parallelism (the ranks would have to replay in lockstep), and `enforce_eager=True`.
Only on CUDA; nothing here runs on CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from localengine.engine.input_batch import StepInputs
from localengine.layers.attention import AttentionMetadata

if TYPE_CHECKING:
    from localengine.models.llama import LlamaForCausalLM

MAX_CAPTURE_SIZE = 512


def capture_sizes(max_num_seqs: int) -> list[int]:
    largest = min(max_num_seqs, MAX_CAPTURE_SIZE)
    return [n for n in (1, 2, 4, 8) if n < largest] + list(range(16, largest, 16)) + [largest]


class DecodeGraphs:
    def __init__(self, model: LlamaForCausalLM, sizes: list[int], max_blocks: int, max_model_len: int,
                 scratch_block: int, block_size: int, device: torch.device, dtype: torch.dtype):
        self.model = model
        self.sizes = sorted(sizes)
        self.max_model_len = max_model_len
        self.scratch_block = scratch_block
        self.scratch_slot = scratch_block * block_size
        n = self.sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), self.scratch_slot, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)  # decode: one token each
        self.block_tables = torch.full((n, max_blocks), scratch_block, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(n, model.args.hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: Any = None  # torch's graph memory pool handle, shared by every captured size
        self.pool_bytes = 0  # what capturing added to the allocator's reservation (the graphs' pool)
        self.num_replays = 0

    def _meta(self, n: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:n], query_start_loc=self.query_start_loc[: n + 1],
            seq_lens=self.seq_lens[:n], block_tables=self.block_tables[:n],
            query_start_loc_cpu=list(range(n + 1)), seq_lens_cpu=[self.max_model_len] * n,
            num_decodes=n, max_query_len=1, use_triton=True,
        )

    def _forward(self, n: int) -> None:
        self.hidden[:n] = self.model(self.input_ids[:n], self.positions[:n], self._meta(n))

    @torch.inference_mode()
    def capture(self) -> None:
        device = self.hidden.device
        reserved = None
        for n in reversed(self.sizes):
            self._forward(n)  # warm-up outside the graph: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize(device)
            if reserved is None:
                reserved = torch.cuda.memory_reserved(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, self.pool):
                self._forward(n)
            if self.pool is None:
                self.pool = graph.pool()
            self.graphs[n] = graph
        torch.cuda.synchronize(device)
        self.pool_bytes = torch.cuda.memory_reserved(device) - (reserved or 0)

    def size_for(self, num_seqs: int) -> int | None:
        """The smallest captured batch size that holds num_seqs (None: run eagerly)."""
        return next((n for n in self.sizes if n >= num_seqs), None)

    def usable(self, step: StepInputs) -> bool:
        num_seqs = len(step.seq_lens)
        return (step.max_query_len == 1 and step.num_decodes == num_seqs
                and len(step.logit_rows) == num_seqs and self.size_for(num_seqs) is not None)

    def run(self, step: StepInputs, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
            seq_lens: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        """Replay the graph for a decode step whose inputs are already on the device; returns the
        hidden states of its rows."""
        num_seqs = len(step.seq_lens)
        size = self.size_for(num_seqs)
        assert size is not None
        self.input_ids[:num_seqs] = input_ids
        self.positions[:num_seqs] = positions
        self.slot_mapping[:num_seqs] = slot_mapping
        self.seq_lens[:num_seqs] = seq_lens
        self.block_tables[:num_seqs, : block_tables.shape[1]] = block_tables
        if size > num_seqs:
            # A previous, larger step may have left real rows here: padding writes the scratch block only.
            self.slot_mapping[num_seqs:size] = self.scratch_slot
            self.seq_lens[num_seqs:size] = 1
            self.block_tables[num_seqs:size, 0] = self.scratch_block
        self.graphs[size].replay()
        self.num_replays += 1
        return self.hidden[:num_seqs]
