// The MLP speculator's greedy proposal (spec_decode/mlp_speculator.py, `propose_greedy`) in one
// call: k stages of proj matmul + embedding row + ScaleNorm + gelu + head matmul + argmax.
//
// Why: a stage is a few hundred thousand multiply-adds on the demo speculator (hidden 192,
// vocabulary 1,024) and a few million on SmolLM2's, while PyTorch runs it as ten ops whose
// dispatch costs ~0.1 ms a stage on this CPU: each proposed position cost 0.18-0.25 of a demo
// target step, which is what kept the speculator's speedup at ~1.3x where n-gram lookup, with the
// same acceptance length and a nearly free proposal, reached ~1.8x (in one call: 0.07-0.09, 2.0x).

#include "cpu_ops.h"

#include <torch/library.h>

#include <cmath>
#include <vector>

namespace slipstream_cpu {
namespace {

void check_stage_weights(const at::TensorList& tensors, int64_t k, const char* what) {
  TORCH_CHECK(static_cast<int64_t>(tensors.size()) >= k, what, ": ", tensors.size(), " stages given, ", k, " asked");
  for (int64_t i = 0; i < k; ++i) check_fp32(tensors[i], what);
}

// state <- gelu(ScaleNorm(state + emb_scale * embedding)), in place, for one row of d values.
void norm_gelu(float* row, const float* embedding, int64_t d, float emb_scale, const float* weight,
               const float* bias, double eps) {
  float sum_squares = 0.f;
  for (int64_t j = 0; j < d; ++j) {
    row[j] += emb_scale * embedding[j];
    sum_squares += row[j] * row[j];
  }
  const float inv = 1.f / std::sqrt(sum_squares / static_cast<float>(d) + static_cast<float>(eps));
  for (int64_t j = 0; j < d; ++j) {
    const float x = bias[j] + row[j] * inv * weight[j];
    row[j] = 0.5f * x * (1.f + std::erf(x * static_cast<float>(M_SQRT1_2)));  // exact gelu, F.gelu's default
  }
}

int64_t argmax(const float* v, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (v[j] > v[best]) best = j;  // the first of equal maxima, as torch.argmax
  return best;
}

// hidden [B, D] fp32 (already through the speculator's input norm), last_tokens [B] int64;
// per stage i < k: proj[i] [inner, D or inner], emb[i] [V, inner] (the stage's own table or the
// target's embedding), ln_weight[i], ln_bias[i] [inner], head[i] [V', inner]; draft_vocab [V'] maps
// head rows to token ids (empty: the identity). Returns the proposals [B, k] int64.
at::Tensor mlp_speculate_greedy(const at::Tensor& hidden, const at::Tensor& last_tokens, at::TensorList proj,
                                at::TensorList emb, at::TensorList ln_weight, at::TensorList ln_bias,
                                at::TensorList head, const at::Tensor& draft_vocab, double emb_scale, double eps,
                                int64_t k) {
  check_fp32(hidden, "hidden");
  TORCH_CHECK(hidden.dim() == 2, "hidden must be [B, D]");
  TORCH_CHECK(last_tokens.scalar_type() == at::kLong && last_tokens.dim() == 1 && last_tokens.size(0) == hidden.size(0),
              "last_tokens must be int64 [B]");
  TORCH_CHECK(draft_vocab.scalar_type() == at::kLong && draft_vocab.is_contiguous(), "draft_vocab must be contiguous int64");
  check_stage_weights(proj, k, "proj");
  check_stage_weights(emb, k, "emb");
  check_stage_weights(ln_weight, k, "ln_weight");
  check_stage_weights(ln_bias, k, "ln_bias");
  check_stage_weights(head, k, "head");
  const int64_t rows = hidden.size(0);
  const int64_t* vocab_ids = draft_vocab.numel() ? draft_vocab.data_ptr<int64_t>() : nullptr;
  at::Tensor last = last_tokens.contiguous();
  std::vector<int64_t> tokens(last.data_ptr<int64_t>(), last.data_ptr<int64_t>() + rows);
  at::Tensor out = at::empty({rows, k}, last_tokens.options());
  int64_t* proposals = out.data_ptr<int64_t>();
  at::Tensor state = hidden;
  for (int64_t i = 0; i < k; ++i) {
    state = fp32_matmul(state, proj[i]);
    const int64_t d = state.size(1), vocab = emb[i].size(0), heads = head[i].size(0);
    TORCH_CHECK(emb[i].size(1) == d && ln_weight[i].numel() == d && ln_bias[i].numel() == d,
                "stage ", i, ": embedding and norm must have the projection's ", d, " features");
    TORCH_CHECK(!vocab_ids || draft_vocab.numel() == heads, "draft_vocab has ", draft_vocab.numel(), " ids, the head ", heads, " rows");
    float* sp = state.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      TORCH_CHECK(tokens[r] >= 0 && tokens[r] < vocab, "token id ", tokens[r], " outside the embedding's ", vocab, " rows");
      norm_gelu(sp + r * d, emb[i].data_ptr<float>() + tokens[r] * d, d, static_cast<float>(emb_scale),
                ln_weight[i].data_ptr<float>(), ln_bias[i].data_ptr<float>(), eps);
    }
    const at::Tensor logits = fp32_matmul(state, head[i]);
    const float* lp = logits.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t best = argmax(lp + r * heads, heads);
      tokens[r] = vocab_ids ? vocab_ids[best] : best;
      proposals[r * k + i] = tokens[r];
    }
  }
  return out;
}

}  // namespace
}  // namespace slipstream_cpu

TORCH_LIBRARY_FRAGMENT(slipstream_cpu, lib) {
  lib.def("mlp_speculate_greedy(Tensor hidden, Tensor last_tokens, Tensor[] proj, Tensor[] emb, Tensor[] ln_weight, "
          "Tensor[] ln_bias, Tensor[] head, Tensor draft_vocab, float emb_scale, float eps, int k) -> Tensor");
}

TORCH_LIBRARY_IMPL(slipstream_cpu, CPU, lib) {
  lib.impl("mlp_speculate_greedy", &slipstream_cpu::mlp_speculate_greedy);
}
