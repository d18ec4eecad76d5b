// The engine's CPU ops for decode on x86 CPUs with AVX2 and FMA: weight-only int8 and int4 matmuls
// for a few rows of fp32 activations (batch-1 and small-batch decode), and the fp32 norms a layer
// makes (vLLM's names). Registered as torch.ops.slipstream_cpu.*; built on
// first use by kernels/cpu_ops.py.
//
// Why not PyTorch's own kernels: on an AVX2 machine without native bf16, _weight_int8pack_mm and
// _weight_int4pack_mm_for_cpu convert activations and weights through bf16 and are compute-bound at
// one row (SmolLM2-135M's 120 linears: 35.6 ms and 16.3 ms a token, against 41.7 ms for fp32 weights
// that read 4x and 8x the bytes). Here int8 weights are widened to fp32 in registers (2 FMAs per
// 16 weights), and int4 blocks meet activations quantized to int8 the way llama.cpp's AVX2 path
// does (Q8_0: blocks of 32, one fp32 scale each; two integer instructions per 32 weights), so a
// step streams the weights at close to memory speed.
//
// Layouts (both row-major over output features):
// - int8: q int8 [N, K], scale fp32 [N]; w = q * scale.
// - int4: packed uint8 [N, K / 2] in blocks of 32 inputs, 16 bytes each, byte j holding input j of
//   the block in its low nibble and input j + 16 in its high nibble (GGUF's Q4_0/Q4_1 order);
//   scale, offset fp32 [N, K / G] for groups of G (a multiple of 32) inputs; w = q * scale + offset.
//   The offset is folded per group: sum_k x_k w_k = scale * sum_k x_k q_k + offset * sum_k x_k.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <torch/library.h>

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

inline __m256 widen_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Up to kRowTile activation rows share each widened or unpacked weight chunk (a speculative
// verification step or a few decodes): the unpacking, not the memory, bounds these kernels.
constexpr int64_t kRowTile = 4;

// One output feature for R activation rows: out[r * stride] = scale * sum_i q_i x_r,i.
template <int R>
inline void int8_row(const int8_t* row, const float* x, int64_t k, float scale, float* out, int64_t stride) {
  __m256 a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    const __m256 w0 = widen_i8(row + i), w1 = widen_i8(row + i + 8);
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + r * k + i), a0[r]);
      a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + r * k + i + 8), a1[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r * stride] = hsum(_mm256_add_ps(a0[r], a1[r])) * scale;
}

// One output feature for R rows of int8 activations (blocks of 32, scale xs per block), without
// the offsets' share.
template <int R>
inline void int4_row(const uint8_t* row, const int8_t* xq, const float* xs, int64_t k, const float* srow,
                     int64_t per_group, float* out, int64_t stride) {
  const __m128i low4 = _mm_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t blocks = k / 32;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t bl = 0; bl < blocks; ++bl) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + bl * 16));
    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), low4), _mm_and_si128(bytes, low4));
    const float s = srow[bl / per_group];
    for (int r = 0; r < R; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + bl * 32));
      const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(xs[r * blocks + bl] * s), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r * stride] = hsum(acc[r]);
}

void check_rows(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "activations must be a contiguous fp32 [M, K] tensor");
  TORCH_CHECK(x.size(1) == k, "activations have ", x.size(1), " features, the weight ", k);
}

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.scalar_type() == at::kChar && q.is_contiguous() && q.dim() == 2, "q must be contiguous int8 [N, K]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous(), "scale must be contiguous fp32 [N]");
  const int64_t n_out = q.size(0), k = q.size(1), m_rows = x.size(0);
  TORCH_CHECK(k % 16 == 0, "int8 rows must be a multiple of 16 long");
  check_rows(x, k);
  at::Tensor out = at::empty({m_rows, n_out}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = q.data_ptr<int8_t>();
  const float* sp = scale.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n_out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t m = 0; m < m_rows; m += kRowTile) {
        const float* xr = xp + m * k;
        float* o = op + m * n_out + n;
        switch (std::min<int64_t>(kRowTile, m_rows - m)) {
          case 1: int8_row<1>(qp + n * k, xr, k, sp[n], o, n_out); break;
          case 2: int8_row<2>(qp + n * k, xr, k, sp[n], o, n_out); break;
          case 3: int8_row<3>(qp + n * k, xr, k, sp[n], o, n_out); break;
          default: int8_row<4>(qp + n * k, xr, k, sp[n], o, n_out);
        }
      }
    }
  });
  return out;
}

// Activations quantized to int8 in blocks of 32 (one fp32 scale each, as llama.cpp's Q8_0), so a
// block's dot product is two integer instructions (maddubs, madd) instead of 4 converts and 2 FMAs.
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                          const at::Tensor& offset, int64_t group_size) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2,
              "packed must be contiguous uint8 [N, K / 2]");
  TORCH_CHECK(group_size % 32 == 0, "group size must be a multiple of 32");
  const int64_t n_out = packed.size(0), k = packed.size(1) * 2, m_rows = x.size(0);
  TORCH_CHECK(k % group_size == 0, "K must be a whole number of groups");
  const int64_t groups = k / group_size, blocks = k / 32, per_group = group_size / 32;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == n_out * groups,
              "scale must be contiguous fp32 [N, K / group_size]");
  TORCH_CHECK(offset.scalar_type() == at::kFloat && offset.is_contiguous() && offset.numel() == n_out * groups,
              "offset must be contiguous fp32 [N, K / group_size]");
  check_rows(x, k);
  std::vector<int8_t> xq(m_rows * k);
  std::vector<float> xscale(m_rows * blocks), xsum(m_rows * groups);
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t bl = 0; bl < blocks; ++bl) {
      const float* v = xp + m * k + bl * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int8_t r = static_cast<int8_t>(std::nearbyint(v[i] * inv));
        xq[m * k + bl * 32 + i] = r;
        sum += r;
      }
      xscale[m * blocks + bl] = d;
      // The sum of the quantized values, as the q part sees them: the offsets then multiply the same
      // activations, and the rounding error meets w = q * scale + offset (centred), not q alone
      // (uncentred, about twice the error).
      xsum[m * groups + bl / per_group] += d * static_cast<float>(sum);
    }
  }
  at::Tensor out = at::empty({m_rows, n_out}, x.options());
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* zp = offset.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, n_out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = pp + n * (k / 2);
      const float* srow = sp + n * groups;
      for (int64_t m = 0; m < m_rows; m += kRowTile) {
        const int8_t* xr = xq.data() + m * k;
        const float* xs = xscale.data() + m * blocks;
        float* o = op + m * n_out + n;
        switch (std::min<int64_t>(kRowTile, m_rows - m)) {
          case 1: int4_row<1>(row, xr, xs, k, srow, per_group, o, n_out); break;
          case 2: int4_row<2>(row, xr, xs, k, srow, per_group, o, n_out); break;
          case 3: int4_row<3>(row, xr, xs, k, srow, per_group, o, n_out); break;
          default: int4_row<4>(row, xr, xs, k, srow, per_group, o, n_out);
        }
      }
      // The offsets' share: offset * (sum of the group's activations), per row.
      const float* zrow = zp + n * groups;
      for (int64_t m = 0; m < m_rows; ++m) {
        float offsets = 0.f;
        for (int64_t g = 0; g < groups; ++g) offsets += zrow[g] * xsum[m * groups + g];
        op[m * n_out + n] += offsets;
      }
    }
  });
  return out;
}


// vLLM's CPU ops of the same names, fp32 only: at one token a step's 61 norms cost more in
// PyTorch's per-op dispatch and threading (about 45 us each for 576 values) than in arithmetic.

float inv_rms(const float* v, int64_t d, double eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= d; i += 8) {
    __m256 x = _mm256_loadu_ps(v + i);
    acc = _mm256_fmadd_ps(x, x, acc);
  }
  float ss = hsum(acc);
  for (; i < d; ++i) ss += v[i] * v[i];
  return 1.f / std::sqrt(ss / static_cast<float>(d) + static_cast<float>(eps));
}

void scale_rows(float* out, const float* v, const float* w, float r, int64_t d) {
  const __m256 rv = _mm256_set1_ps(r);
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(v + i), rv)));
  for (; i < d; ++i) out[i] = w[i] * (v[i] * r);
}

void check_fp32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), what, " must be contiguous fp32");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_fp32(x, "x");
  check_fp32(weight, "weight");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  at::Tensor out = at::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) scale_rows(op + r * d, xp + r * d, wp, inv_rms(xp + r * d, d, eps), d);
  return out;
}

// residual += x; x = rms_norm(residual) * weight, both in place (the residual stream carried in
// `residual`, the layer's input in `x`).
void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_fp32(x, "x");
  check_fp32(residual, "residual");
  check_fp32(weight, "weight");
  const int64_t d = weight.numel(), rows = x.numel() / d;
  float *xp = x.data_ptr<float>(), *rp = residual.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float *xr = xp + r * d, *rr = rp + r * d;
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(rr + i, _mm256_add_ps(_mm256_loadu_ps(rr + i), _mm256_loadu_ps(xr + i)));
    for (; i < d; ++i) rr[i] += xr[i];
    scale_rows(xr, rr, wp, inv_rms(rr, d, eps), d);
  }
}


}  // namespace

TORCH_LIBRARY(slipstream_cpu, lib) {
  lib.def("int8_matmul(Tensor x, Tensor q, Tensor scale) -> Tensor");
  lib.def("int4_matmul(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group_size) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  lib.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(slipstream_cpu, CPU, lib) {
  lib.impl("int8_matmul", &int8_matmul);
  lib.impl("int4_matmul", &int4_matmul);
  lib.impl("rms_norm", &rms_norm);
  lib.impl("fused_add_rms_norm", &fused_add_rms_norm);
}
