"""Runs the model for one scheduler step: flatten the batch, build attention metadata, sample.

It also owns the KV cache: one allocation [2, layers, blocks, block_size, kv_heads, head_dim]
whose per-layer slices the attention layers write into, sized from the memory left after the
weights are loaded. A quantized cache (kv_cache_dtype int8/fp8: one byte per element) also gets
its static scales here, measured by one prefill over a fixed text before the cache is sized.
With tensor parallelism every rank has a runner over its shard (its KV heads); rank 0's
`execute` sends each step's inputs to the others (`run_worker_loop`), and all ranks run the
forward pass together; only rank 0 gets logits and samples.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from localengine import distributed
from localengine.config import Config
from localengine.engine.cuda_graphs import DecodeGraphs, capture_sizes
from localengine.engine.input_batch import InputBuffers, StepInputs
from localengine.engine.scheduler import ScheduledSequence, SchedulerOutput
from localengine.kernels import kv_quant
from localengine.kernels.reference import GatherWorkspace
from localengine.layers.attention import AttentionMetadata
from localengine.layers.sampler import Sampler
from localengine.models.loader import load_model
from localengine.outputs import Logprob
from localengine.spec_decode.rejection_sampler import greedy_verify_batch, rejection_sample_batch

# On CPU "available memory" is the whole machine's; never take more than this for KV by default.
CPU_KV_CACHE_CAP_BYTES = 2 << 30


def available_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def triton_usable(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(slots=True)
class SampledToken:
    item: ScheduledSequence
    token_ids: list[int]  # one token, or with speculation the accepted drafts + one more
    logprobs: dict[int, Logprob] | None  # the one token's (speculation is off for logprobs requests)
    # The final hidden state that produced the last token (only when the runner keeps them, for
    # proposers that draft from the target's own hidden states).
    hidden: torch.Tensor | None = None

    @property
    def num_draft(self) -> int:
        return len(self.item.spec_token_ids)

    @property
    def num_accepted(self) -> int:
        return len(self.token_ids) - 1


class ModelRunner:
    def __init__(self, config: Config, eos_token_ids: set[int], rank: int = 0):
        self.config = config
        self.rank = rank
        self.tp_size = config.tensor_parallel_size
        self.device = config.torch_device
        self.dtype = config.torch_dtype
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        assert config.max_model_len is not None
        self.model = load_model(config.model_path, config.hf_config, self.dtype, self.device,
                                config.max_model_len, rank, self.tp_size, config.quantization)
        self.block_size = config.block_size
        backend = config.attention_backend
        self.use_triton = backend == "triton" or (backend == "auto" and triton_usable(self.device))
        self.workspace = GatherWorkspace()
        self.inputs = InputBuffers(self.block_size, pin=self.device.type == "cuda")
        self._device_buffers: dict[str, torch.Tensor] = {}
        # Decode steps replay CUDA graphs (cuda_graphs.py) unless told not to or not possible.
        self.use_cuda_graphs = (self.device.type == "cuda" and not config.enforce_eager and self.use_triton
                                and self.tp_size == 1)
        self.graphs: DecodeGraphs | None = None
        # Set by hidden-state proposers (mlp_speculator): `execute` then hands each sampled
        # token's hidden state back with it. Off, it costs nothing.
        # Set before sizing the KV cache: CUDA's profiling pass runs `forward`.
        self.keep_hidden = False
        self._logit_hidden: torch.Tensor | None = None
        self.kv_format = kv_quant.kv_cache_format(config.kv_cache_dtype)
        self.kv_dtype = self.kv_format.dtype if self.kv_format is not None else self.dtype
        if self.kv_format is not None:
            # Before sizing: CUDA's profiling pass then runs the quantized attention it will run.
            self.kv_scales = self.calibrate_kv_scales(self.kv_format)
            for attn, scales in zip(self.model.attention_layers(), kv_quant.scales_for_layers(self.kv_scales),
                                    strict=True):
                attn.kv_scales = scales
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # what loading left in the allocator's cache counts as free below
        num_blocks = self._num_blocks()
        # Every rank must hold the same blocks: take the smallest any rank can afford.
        self.num_kvcache_blocks = distributed.all_reduce_min(num_blocks) if self.tp_size > 1 else num_blocks
        self._allocate_kv_cache()
        if self.use_cuda_graphs:
            # Captured against the final cache: its addresses are baked into the graphs.
            self.graphs = self._decode_graphs(capture_sizes(config.max_num_seqs), self.num_kvcache_blocks)
            self.graphs.capture()
        self.sampler = Sampler(config.seed, eos_token_ids, self.device)

    def _decode_graphs(self, sizes: list[int], scratch_block: int) -> DecodeGraphs:
        cfg = self.config
        assert cfg.max_model_len is not None
        spec = cfg.speculative_config
        lookahead = spec.num_speculative_tokens if spec is not None and not isinstance(spec, dict) else 0
        max_blocks = -(-(cfg.max_model_len + lookahead) // self.block_size)
        return DecodeGraphs(self.model, sizes, max_blocks, cfg.max_model_len, scratch_block, self.block_size,
                            self.device, self.dtype)

    def _block_bytes(self) -> int:
        """A quantized cache's scales are per channel, not per token: a block is its elements' bytes."""
        a = self.model.args
        itemsize = torch.empty(0, dtype=self.kv_dtype).element_size()
        return 2 * a.num_layers * self.block_size * a.num_local_kv_heads * a.head_dim * itemsize

    def _num_blocks(self) -> int:
        cfg = self.config
        assert cfg.max_model_len is not None
        spec = cfg.speculative_config
        lookahead = spec.num_speculative_tokens if spec is not None and not isinstance(spec, dict) else 0
        # One request may grow to max_model_len tokens plus the proposals reserved ahead of it; a
        # cache smaller than that would preempt that request forever (vLLM refuses to start too).
        min_blocks = -(-(cfg.max_model_len + lookahead) // self.block_size)
        if cfg.num_kvcache_blocks is not None:
            num_blocks = cfg.num_kvcache_blocks
        else:
            # More blocks than every sequence at full length could use would only waste memory.
            needed = cfg.max_num_seqs * min_blocks
            num_blocks = min(int(self._kv_budget_bytes() // self._block_bytes()), needed)
        if num_blocks < min_blocks:
            raise MemoryError(
                f"the KV cache holds {num_blocks} blocks of {self.block_size} tokens, fewer than one request "
                f"of max_model_len={cfg.max_model_len} tokens (plus {lookahead} speculative) needs ({min_blocks}); "
                f"lower max_model_len, raise num_kvcache_blocks or free memory"
            )
        return num_blocks

    def _kv_budget_bytes(self) -> float:
        """Bytes the KV cache may take. CUDA, vLLM's rule: `gpu_memory_utilization` of the whole
        GPU, less the peak that a forward pass over a full step's token budget reaches (weights and
        activations, measured by `profile_run`), what lives outside torch's allocator (the CUDA
        context, NCCL) and the decode graphs' memory pool (`profile_graph_memory`), which stays
        reserved beside the KV cache for the engine's life. CPU: `kv_cache_memory_fraction` of available RAM, capped (the machine's RAM
        is everybody's). `max_kv_cache_bytes` caps both."""
        cfg = self.config
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            outside_torch = (total - free) - torch.cuda.memory_reserved(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.profile_run()
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            torch.cuda.empty_cache()
            budget = total * cfg.gpu_memory_utilization - peak - outside_torch - self.profile_graph_memory()
        else:
            budget = min(available_memory_bytes(self.device) * cfg.kv_cache_memory_fraction, CPU_KV_CACHE_CAP_BYTES)
        return min(budget, cfg.max_kv_cache_bytes) if cfg.max_kv_cache_bytes else budget

    @torch.inference_mode()
    def profile_run(self) -> None:
        """One forward pass over a whole step's token budget (prefills of at most max_model_len
        tokens) into a scratch KV cache, so that the activation peak is what a real step reaches."""
        cfg = self.config
        assert cfg.max_model_len is not None
        total = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * cfg.max_model_len)
        lens = [cfg.max_model_len] * (total // cfg.max_model_len) + [total % cfg.max_model_len] * bool(
            total % cfg.max_model_len)
        self._scratch_prefill(torch.zeros(total, dtype=torch.long), lens, self.kv_dtype)

    @torch.inference_mode()
    def calibrate_kv_scales(self, fmt: kv_quant.KVCacheFormat) -> torch.Tensor:
        """[2, layers, kv_heads, head_dim] scales from one prefill over `kv_quant.CALIBRATION_MESSAGES`
        (chat-templated when the tokenizer has a template), K/V kept in the model's dtype meanwhile."""
        from transformers import AutoTokenizer

        cfg = self.config
        assert cfg.max_model_len is not None
        tok = AutoTokenizer.from_pretrained(str(cfg.tokenizer_path), local_files_only=True)
        if tok.chat_template:
            ids = list(tok.apply_chat_template(kv_quant.CALIBRATION_MESSAGES, tokenize=True, return_dict=False))
        else:
            ids = tok.encode("\n\n".join(m["content"] for m in kv_quant.CALIBRATION_MESSAGES))
        ids = ids[: cfg.max_model_len]
        a = self.model.args
        stats = kv_quant.KVStats(a.num_layers, a.num_local_kv_heads, a.head_dim, self.device)
        layers = self.model.attention_layers()
        for i, attn in enumerate(layers):
            attn.observer = functools.partial(stats.observe, i)
        try:
            self._scratch_prefill(torch.tensor(ids, dtype=torch.long), [len(ids)], self.dtype)
        finally:
            for attn in layers:
                attn.observer = None
        return stats.scales(fmt)

    def _scratch_prefill(self, input_ids: torch.Tensor, lens: list[int], kv_dtype: torch.dtype) -> None:
        """One forward pass of prefills (`lens` tokens each, back to back) into a scratch KV cache."""
        blocks = [-(-n // self.block_size) for n in lens]
        first_block = np.cumsum([0] + blocks)
        a = self.model.args
        scratch = torch.zeros(2, a.num_layers, sum(blocks), self.block_size, a.num_local_kv_heads, a.head_dim,
                              dtype=kv_dtype, device=self.device)
        self._point_attention_at(scratch)
        query_start = np.cumsum([0] + lens).tolist()
        tables = np.zeros((len(lens), max(blocks)), dtype=np.int32)
        for j, n in enumerate(blocks):
            tables[j, :n] = np.arange(first_block[j], first_block[j] + n)
        step = StepInputs(
            input_ids=input_ids,
            positions=torch.cat([torch.arange(n) for n in lens]),
            slot_mapping=torch.cat([torch.arange(n) + int(first_block[j]) * self.block_size for j, n in enumerate(lens)]),
            block_tables=torch.from_numpy(tables), query_start_loc=query_start, seq_lens=lens, num_decodes=0,
            max_query_len=max(lens), logit_rows=[end - 1 for end in query_start[1:]],
        )
        try:
            self.forward(step)
        finally:
            del scratch
            if hasattr(self, "kv_cache"):
                self._point_attention_at(self.kv_cache)

    def profile_graph_memory(self) -> int:
        """Bytes the decode graphs will hold (0 without them), measured by capturing the largest
        one against a one-block scratch cache (the smaller graphs share its pool), then freeing it."""
        if not self.use_cuda_graphs:
            return 0
        a = self.model.args
        scratch = torch.zeros(2, a.num_layers, 1, self.block_size, a.num_local_kv_heads, a.head_dim,
                              dtype=self.kv_dtype, device=self.device)
        self._point_attention_at(scratch)
        graphs = self._decode_graphs(capture_sizes(self.config.max_num_seqs)[-1:], scratch_block=0)
        try:
            graphs.capture()
            return graphs.pool_bytes
        finally:
            del graphs, scratch
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            if hasattr(self, "kv_cache"):
                self._point_attention_at(self.kv_cache)

    def _point_attention_at(self, kv_cache: torch.Tensor) -> None:
        for i, attn in enumerate(self.model.attention_layers()):
            attn.k_cache, attn.v_cache = kv_cache[0, i], kv_cache[1, i]

    def _allocate_kv_cache(self) -> None:
        a = self.model.args
        # Zeroed, not empty: masked-out padding positions must hold finite values (0 * NaN = NaN).
        # With decode graphs, one more block than the block manager hands out: padded rows' scratch.
        self.kv_cache = torch.zeros(
            2, a.num_layers, self.num_kvcache_blocks + self.use_cuda_graphs, self.block_size, a.num_local_kv_heads,
            a.head_dim, dtype=self.kv_dtype, device=self.device,
        )
        self._point_attention_at(self.kv_cache)

    def prepare(self, items: list[ScheduledSequence]) -> StepInputs:
        """The step's flat inputs, as views of the runner's reused host buffers."""
        return self.inputs.build(items)

    def _to_device(self, name: str, host: torch.Tensor) -> torch.Tensor:
        """CPU: the tensor itself. CUDA: an asynchronous copy (from pinned memory) into a device
        buffer kept across steps, so a step allocates nothing on either side."""
        if self.device.type != "cuda":
            return host
        buf = self._device_buffers.get(name)
        if buf is None or buf.numel() < host.numel():
            buf = self._device_buffers[name] = torch.empty(max(host.numel(), 256), dtype=host.dtype, device=self.device)
        dev = buf[: host.numel()].view(host.shape)
        dev.copy_(host, non_blocking=True)
        return dev

    def forward(self, step: StepInputs) -> torch.Tensor | None:
        """One forward pass (every tensor-parallel rank runs it); the logit rows' logits on rank 0."""
        to_device = self._to_device
        meta = AttentionMetadata(
            slot_mapping=to_device("slot_mapping", step.slot_mapping),
            query_start_loc=to_device("query_start_loc", step.query_start_tensor if step.query_start_tensor is not None
                                      else torch.tensor(step.query_start_loc, dtype=torch.int32)),
            seq_lens=to_device("seq_lens", step.seq_lens_tensor if step.seq_lens_tensor is not None
                               else torch.tensor(step.seq_lens, dtype=torch.int32)),
            block_tables=to_device("block_tables", step.block_tables),
            query_start_loc_cpu=step.query_start_loc,
            seq_lens_cpu=step.seq_lens,
            num_decodes=step.num_decodes,
            max_query_len=step.max_query_len,
            use_triton=self.use_triton,
            workspace=self.workspace,
        )
        input_ids, positions = to_device("input_ids", step.input_ids), to_device("positions", step.positions)
        rows = None
        if step.logit_rows and len(step.logit_rows) < step.input_ids.shape[0]:
            rows = to_device("logit_rows", torch.tensor(step.logit_rows))
        self.inputs.mark_copied()
        if self.graphs is not None and self.graphs.usable(step):
            hidden = self.graphs.run(step, input_ids, positions, meta.slot_mapping, meta.seq_lens, meta.block_tables)
            # The graph's output buffer is overwritten by the next replay: kept rows need their own copy.
            self._logit_hidden = hidden.clone() if self.keep_hidden else None
            return self.model.compute_logits(hidden)
        hidden = self.model(input_ids, positions, meta)
        if not step.logit_rows:
            return None
        hidden = hidden if rows is None else hidden[rows]
        self._logit_hidden = hidden if self.keep_hidden else None
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        # Decodes first, shortest context first: the attention backend batches the one-token
        # queries at the front, in groups of similar length.
        items = sorted(out.scheduled, key=lambda it: (it.num_new_tokens != 1, it.num_computed_before))
        step = self.prepare(items)
        if self.tp_size > 1:
            distributed.broadcast_from_first(step)
        logits = self.forward(step)
        sampling = [it for it in items if it.samples]
        if logits is None:
            return []
        offsets = list(accumulate((len(it.spec_token_ids) + 1 for it in sampling), initial=0))  # first row of each
        plain = [j for j, it in enumerate(sampling) if not it.spec_token_ids]
        results: list[SampledToken] = []
        if plain:
            plain_logits = logits if len(plain) == len(step.logit_rows) else logits[[offsets[j] for j in plain]]
            sampled = self.sampler(plain_logits, [sampling[j].seq for j in plain])
            for j, tok, lp in zip(plain, sampled.token_ids, sampled.logprobs, strict=True):
                results.append(SampledToken(sampling[j], [tok], lp))
        if len(plain) < len(sampling):
            spec = [it for it in sampling if it.spec_token_ids]
            rows = [r for j, it in enumerate(sampling) if it.spec_token_ids for r in range(offsets[j], offsets[j + 1])]
            spec_logits = logits if len(rows) == logits.shape[0] else logits[rows]
            results.extend(SampledToken(it, tokens, None) for it, tokens in zip(spec, self.verify(spec, spec_logits), strict=True))
        if self._logit_hidden is not None:
            first_row = {id(it): offsets[j] for j, it in enumerate(sampling)}
            for r in results:
                # The row that produced the last emitted token: the bonus or correction's.
                r.hidden = self._logit_hidden[first_row[id(r.item)] + len(r.token_ids) - 1]
        return results

    @torch.inference_mode()
    def run_worker_loop(self) -> None:
        """Tensor-parallel ranks > 0: run each step rank 0 sends until it sends None."""
        while (step := distributed.broadcast_from_first()) is not None:
            self.forward(step)

    def stop_workers(self) -> None:
        if self.tp_size > 1 and self.rank == 0:
            distributed.broadcast_from_first(None)

    def verify(self, items: list[ScheduledSequence], logits: torch.Tensor) -> list[list[int]]:
        """Accepted proposals plus one target token per request, from one target pass over the
        proposals; logits: each request's k + 1 rows, request after request. Greedy and sampled
        requests are each verified in one batch."""
        greedy = [it.seq.sampling_params.greedy for it in items]
        out: list[list[int]] = [[] for _ in items]
        groups = (True, False) if any(greedy) and not all(greedy) else (greedy[0],)
        for want in groups:
            idx = [i for i, g in enumerate(greedy) if g is want]
            group = [items[i] for i in idx]
            if len(group) == len(items):
                rows = logits
            else:
                starts = list(accumulate((len(it.spec_token_ids) + 1 for it in items), initial=0))
                rows = logits[[r for i in idx for r in range(starts[i], starts[i + 1])]]
            drafts = [it.spec_token_ids for it in group]
            if want:
                tokens = greedy_verify_batch(rows.argmax(dim=-1).tolist(), drafts)
            else:
                seqs = [it.seq for it in group for _ in range(len(it.spec_token_ids) + 1)]
                tokens = rejection_sample_batch(Sampler.compute_probs(rows, seqs), drafts,
                                                [it.spec_draft_probs for it in group],
                                                [it.seq.generator or self.sampler.generator for it in group])
            for i, t in zip(idx, tokens, strict=True):
                out[i] = t
        return out
