"""A step's flat inputs, written into host buffers that live as long as the model runner.

Building a step used to allocate a dozen small tensors and numpy arrays per request (an arange
and an array per sequence, concatenations, a fresh block-table matrix); at batch 16 on the demo
model that was a visible share of the step. Here every step writes into the same buffers
(token ids, positions, cache slots, block tables), a decode costs a few integer stores, and the
step's tensors are views of the buffers. On CUDA the buffers are pinned, so the copies to the
device are asynchronous (vLLM's and nano-vllm's rule); an event recorded after those copies keeps
the next step from overwriting a buffer the GPU has not read yet. Buffers grow when a step
needs more (a draft model's catch-up can exceed the token budget), never shrink.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from localengine.engine.scheduler import ScheduledSequence


@dataclass(slots=True)
class StepInputs:
    """One forward pass's inputs, on the CPU: what rank 0 sends the other tensor-parallel ranks."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: list[int]
    seq_lens: list[int]
    num_decodes: int
    max_query_len: int
    logit_rows: list[int]  # flat token positions whose logits are needed, in sampling order
    # query_start_loc and seq_lens as int32 tensors, when the builder already wrote them (else
    # the forward pass makes them from the lists)
    query_start_tensor: torch.Tensor | None = None
    seq_lens_tensor: torch.Tensor | None = None


class InputBuffers:
    def __init__(self, block_size: int, pin: bool, num_tokens: int = 256, num_seqs: int = 64,
                 num_table_entries: int = 1024):
        self.block_size = block_size
        self.pin = pin
        # Recorded after each step's copies to the device; the next step waits for it before writing.
        self.copied = torch.cuda.Event() if pin else None
        self._allocate(num_tokens, num_seqs, num_table_entries)

    def _allocate(self, num_tokens: int, num_seqs: int, num_table_entries: int) -> None:
        def buffer(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, pin_memory=self.pin)

        self.query_start = buffer(num_seqs + 1, torch.int32)
        self.seq_lens = buffer(num_seqs, torch.int32)
        self.input_ids = buffer(num_tokens, torch.long)
        self.positions = buffer(num_tokens, torch.long)
        self.slot_mapping = buffer(num_tokens, torch.long)
        # Flat: each step views its first seqs x width entries as its (contiguous) block table.
        self.block_tables = buffer(num_table_entries, torch.int32)
        # numpy views of the same memory: element stores from Python are several times cheaper
        # through numpy than through torch's indexing.
        self.ids_np, self.pos_np = self.input_ids.numpy(), self.positions.numpy()
        self.slots_np, self.tables_np = self.slot_mapping.numpy(), self.block_tables.numpy()
        self.query_start_np, self.seq_lens_np = self.query_start.numpy(), self.seq_lens.numpy()

    def _reserve(self, num_tokens: int, num_seqs: int, num_table_entries: int) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # the device has read the previous step's inputs
        have = (self.input_ids.shape[0], self.seq_lens.shape[0], self.block_tables.shape[0])
        if num_tokens > have[0] or num_seqs > have[1] or num_table_entries > have[2]:
            self._allocate(max(num_tokens, have[0]), max(num_seqs, have[1]), max(num_table_entries, have[2]))

    def mark_copied(self) -> None:
        """CUDA: called once this step's inputs have been queued for copying to the device."""
        if self.copied is not None:
            self.copied.record()

    def build(self, items: list[ScheduledSequence]) -> StepInputs:
        """The flat batch for `items` (decodes first, as ModelRunner.execute orders them)."""
        bs = self.block_size
        num_tokens = sum(it.num_new_tokens for it in items)
        width = max(len(it.seq.block_table) for it in items)
        self._reserve(num_tokens, len(items), len(items) * width)
        ids, pos, slots = self.ids_np, self.pos_np, self.slots_np
        tables = self.tables_np[: len(items) * width].reshape(len(items), width)
        query_start, seq_lens, logit_rows = [0], list[int](), list[int]()
        t = 0
        num_decodes = max_query_len = 0
        for i, it in enumerate(items):
            seq, n = it.seq, it.num_new_tokens
            start, end = it.num_computed_before, it.num_computed_before + n
            table = seq.block_table
            if n == 1 and not it.spec_token_ids:
                ids[t] = seq.token_ids[start]
                pos[t] = start
                slots[t] = table[start // bs] * bs + start % bs
                num_decodes += 1
            else:
                tokens = seq.token_ids + it.spec_token_ids if it.spec_token_ids else seq.token_ids
                ids[t : t + n] = tokens[start:end]
                p = np.arange(start, end)
                pos[t : t + n] = p
                slots[t : t + n] = np.asarray(table, dtype=np.int64)[p // bs] * bs + p % bs
            tables[i, : len(table)] = table
            tables[i, len(table) : width] = 0
            t += n
            query_start.append(t)
            seq_lens.append(end)
            max_query_len = max(max_query_len, n)
            if it.samples:
                # Only the positions that yield a token need logits (the LM head is the largest
                # matmul for small models): the last one, or with s proposals the last s + 1.
                logit_rows.extend(range(t - 1 - len(it.spec_token_ids), t))
        return StepInputs(
            input_ids=self.input_ids[:t],
            positions=self.positions[:t],
            slot_mapping=self.slot_mapping[:t],
            block_tables=self.block_tables[: len(items) * width].view(len(items), width),
            query_start_loc=query_start,
            seq_lens=seq_lens,
            num_decodes=num_decodes,
            max_query_len=max_query_len,
            logit_rows=logit_rows,
            query_start_tensor=self._write(self.query_start, self.query_start_np, query_start),
            seq_lens_tensor=self._write(self.seq_lens, self.seq_lens_np, seq_lens),
        )

    @staticmethod
    def _write(buffer: torch.Tensor, view: np.ndarray, values: list[int]) -> torch.Tensor:
        view[: len(values)] = values
        return buffer[: len(values)]
