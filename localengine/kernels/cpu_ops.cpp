// The engine's CPU ops for decode on x86 CPUs with AVX2 and FMA: weight-only int8 and int4 matmuls
// for a few rows of fp32 activations (batch-1 and small-batch decode), and the fp32 steps around
// them that PyTorch runs as many small ops (vLLM's names: fused_add_rms_norm, rotary_embedding,
// silu_and_mul, paged attention for decodes). Registered as torch.ops.slipstream_cpu.*; built on
// first use by kernels/cpu_ops.py.
//
// Why the small ones: at batch 1 a SmolLM2-135M token ran ~1,800 PyTorch ops (30 layers x ~60), and
// their dispatch, allocation and threading cost more than the arithmetic (the profile: index_select,
// as_strided, view, empty, slice, where, cat ... each a few microseconds).
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

// C output features for R rows of int8 activations, without the offsets' share. Blocks go in
// pairs: one 32-byte load holds two blocks' nibbles, the activations were stored pair-interleaved
// to match (see int4_matmul), and the two blocks' products are summed as int16 before widening, so a
// pair costs about what one block did. `xs` holds each pair's two activation scales spread over the
// 8 lanes the pair's sums land in ([d0 x4, d1 x4]); a last odd block takes the 16-byte path. Each
// activation load serves C features and each unpacked weight R rows; the R x C accumulators are
// independent chains. kGroup32: one weight scale per block (else a pair shares its group's).
template <int R, int C, bool kGroup32>
inline void int4_tile(const uint8_t* rows, int64_t row_bytes, const int8_t* xq, const float* xs, int64_t k,
                      const float* scales, int64_t groups, int group_shift, float* out, int64_t stride) {
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const int64_t blocks = k / 32, pairs = blocks / 2, xs_stride = (pairs + 1) * 8;
  __m256 acc[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) acc[c][r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m256i xa[R], xb[R];
    __m256 xd[R];
    for (int r = 0; r < R; ++r) {
      xa[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + p * 64));
      xb[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + p * 64 + 32));
      xd[r] = _mm256_loadu_ps(xs + r * xs_stride + p * 8);
    }
    for (int c = 0; c < C; ++c) {
      // The rows two tiles ahead: the hardware prefetcher alone left the loop waiting on memory (one
      // row measured 0.85-0.89x the time with this, SmolLM2's 120 linears, 2 threads).
      _mm_prefetch(reinterpret_cast<const char*>(rows + (c + 2 * C) * row_bytes + p * 32), _MM_HINT_T0);
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + c * row_bytes + p * 32));
      const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      const float* srow = scales + c * groups;
      const __m256 ws = kGroup32
          ? _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(srow + 2 * p)))), spread)
          : _mm256_set1_ps(srow[(2 * p) >> group_shift]);
      for (int r = 0; r < R; ++r) {
        const __m256i sums = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xa[r]), _mm256_maddubs_epi16(hi, xb[r]));
        acc[c][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sums, ones)), _mm256_mul_ps(ws, xd[r]), acc[c][r]);
      }
    }
  }
  if (blocks % 2) {
    const int64_t bl = blocks - 1;
    const __m128i m4 = _mm_set1_epi8(15);
    for (int c = 0; c < C; ++c) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + c * row_bytes + bl * 16));
      const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, 4), m4), _mm_and_si128(bytes, m4));
      const float s = scales[c * groups + (bl >> group_shift)];
      for (int r = 0; r < R; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + r * k + bl * 32));
        const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), ones);
        acc[c][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(xs[r * xs_stride + pairs * 8] * s), acc[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[r * stride + c] = hsum(acc[c][r]);
}

template <int R, int C>
inline void int4_tiles(const uint8_t* rows, int64_t row_bytes, const int8_t* xq, const float* xs, int64_t k,
                       const float* scales, int64_t groups, int group_shift, float* out, int64_t stride) {
  if (group_shift == 0) int4_tile<R, C, true>(rows, row_bytes, xq, xs, k, scales, groups, 0, out, stride);
  else int4_tile<R, C, false>(rows, row_bytes, xq, xs, k, scales, groups, group_shift, out, stride);
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

// The offsets' share of one output feature: offset * (sum of the group's activations), per row.
inline void add_offsets(const float* zrow, const float* xsum, int64_t groups, int64_t m_rows, float* out, int64_t stride) {
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* sums = xsum + m * groups;
    __m256 acc = _mm256_setzero_ps();
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(zrow + g), _mm256_loadu_ps(sums + g), acc);
    float offsets = hsum(acc);
    for (; g < groups; ++g) offsets += zrow[g] * sums[g];
    out[m * stride] += offsets;
  }
}

// Activations quantized to int8 in blocks of 32 (one fp32 scale each, as llama.cpp's Q8_0), so a
// block's dot product is two integer instructions (maddubs, madd) instead of 4 converts and 2 FMAs.
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                          const at::Tensor& offset, int64_t group_size) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2,
              "packed must be contiguous uint8 [N, K / 2]");
  TORCH_CHECK(group_size >= 32 && (group_size & (group_size - 1)) == 0, "group size must be a power of two from 32");
  const int64_t n_out = packed.size(0), k = packed.size(1) * 2, m_rows = x.size(0);
  TORCH_CHECK(k % group_size == 0, "K must be a whole number of groups");
  const int64_t groups = k / group_size, blocks = k / 32, per_group = group_size / 32;
  int group_shift = 0;
  while ((int64_t{1} << group_shift) < per_group) ++group_shift;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == n_out * groups,
              "scale must be contiguous fp32 [N, K / group_size]");
  TORCH_CHECK(offset.scalar_type() == at::kFloat && offset.is_contiguous() && offset.numel() == n_out * groups,
              "offset must be contiguous fp32 [N, K / group_size]");
  check_rows(x, k);
  std::vector<int8_t> xq(m_rows * k);
  const int64_t xs_stride = (blocks / 2 + 1) * 8;  // per row: 8 lanes per pair (int4_row), then an odd block's
  std::vector<float> xscale(m_rows * xs_stride), xsum(m_rows * groups);
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t bl = 0; bl < blocks; ++bl) {
      const float* v = xp + m * k + bl * 32;
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
      // Where input i of the block goes: paired blocks (2p, 2p + 1) are stored as halves
      // [2p: 0-15, 2p+1: 0-15, 2p: 16-31, 2p+1: 16-31], the order of one 32-byte load's low and
      // high nibbles (int4_row); a last odd block as it is.
      int8_t* dst = xq.data() + m * k + (bl & ~int64_t{1}) * 32;
      const bool paired = (bl | 1) < blocks, second = bl & 1;
      int sum = 0;
      for (int i = 0; i < 32; ++i) {
        const int8_t r = static_cast<int8_t>(std::nearbyint(v[i] * inv));
        dst[paired ? (i / 16) * 32 + second * 16 + i % 16 : i] = r;
        sum += r;
      }
      if (paired) std::fill_n(xscale.data() + m * xs_stride + (bl / 2) * 8 + second * 4, 4, d);
      else xscale[m * xs_stride + (bl / 2) * 8] = d;
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
    for (int64_t n = begin; n < end;) {
      // One row of activations: 4 features at a time; 2 rows: 2; more: rows in tiles of 4, 1 feature.
      const int64_t features = std::min<int64_t>(m_rows == 1 ? 4 : m_rows == 2 ? 2 : 1, end - n);
      const uint8_t* rows = pp + n * (k / 2);
      const float* srows = sp + n * groups;
      for (int64_t m = 0; m < m_rows; m += kRowTile) {
        const int8_t* xr = xq.data() + m * k;
        const float* xs = xscale.data() + m * xs_stride;
        float* o = op + m * n_out + n;
        const int64_t tile = std::min<int64_t>(kRowTile, m_rows - m);
        if (features == 4) int4_tiles<1, 4>(rows, k / 2, xr, xs, k, srows, groups, group_shift, o, n_out);
        else if (features == 2 && tile == 2) int4_tiles<2, 2>(rows, k / 2, xr, xs, k, srows, groups, group_shift, o, n_out);
        else {
          for (int64_t f = 0; f < features; ++f) {
            const uint8_t* row = rows + f * (k / 2);
            const float* srow = srows + f * groups;
            switch (tile) {
              case 1: int4_tiles<1, 1>(row, k / 2, xr, xs, k, srow, groups, group_shift, o + f, n_out); break;
              case 2: int4_tiles<2, 1>(row, k / 2, xr, xs, k, srow, groups, group_shift, o + f, n_out); break;
              case 3: int4_tiles<3, 1>(row, k / 2, xr, xs, k, srow, groups, group_shift, o + f, n_out); break;
              default: int4_tiles<4, 1>(row, k / 2, xr, xs, k, srow, groups, group_shift, o + f, n_out);
            }
          }
        }
      }
      for (int64_t f = n; f < n + features; ++f) add_offsets(zp + f * groups, xsum.data(), groups, m_rows, op + f, n_out);
      n += features;
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



// e^x for 8 lanes (Cephes' polynomial, as in avx_mathfun's exp256_ps): within 2 ulp of expf over
// [-87, 88]; inputs are clamped to that range.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.37f));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(pow2n));
}

// vLLM's silu_and_mul: x [T, 2I] holds gate then up; returns silu(gate) * up [T, I].
at::Tensor silu_and_mul(const at::Tensor& x) {
  check_fp32(x, "x");
  const int64_t width = x.size(-1), half = width / 2, rows = x.numel() / width;
  TORCH_CHECK(width % 16 == 0, "silu_and_mul needs a multiple of 16 features");
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = half;
  at::Tensor out = at::empty(shape, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // A prefill chunk's rows across threads; a decode's few rows on this one.
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *gate = xp + r * width, *up = gate + half;
      float* o = op + r * half;
      for (int64_t i = 0; i < half; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
      }
    }
  });
  return out;
}

// Rotary embedding (rotate-half layout), in place: qk [T, heads, D] with each token's heads
// contiguous (a view into the fused qkv projection's output is fine), cos/sin [T, D] for each token's
// position (the tables' rows, looked up once per step).
void rotary_embedding(at::Tensor& qk, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(qk.scalar_type() == at::kFloat && qk.dim() == 3 && qk.stride(2) == 1 && qk.stride(1) == qk.size(2),
              "qk must be fp32 [T, heads, D] with each token's heads contiguous");
  check_fp32(cos, "cos");
  check_fp32(sin, "sin");
  const int64_t tokens = qk.size(0), heads = qk.size(1), d = qk.size(2), half = d / 2;
  TORCH_CHECK(cos.numel() == tokens * d && sin.numel() == tokens * d, "cos/sin must hold [T, D]");
  float* base = qk.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  for (int64_t t = 0; t < tokens; ++t) {
    const float *c = cp + t * d, *s = sp + t * d;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = base + t * qk.stride(0) + h * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = x[i], x2 = x[i + half];
        // The same products and sums as the PyTorch form (x * cos + rotate_half(x) * sin), unfused.
        const float a = x1 * c[i], b = x2 * s[i], e = x2 * c[i + half], f = x1 * s[i + half];
        x[i] = a - b;
        x[i + half] = e + f;
      }
    }
  }
}

// Decode attention straight over the paged cache (vLLM's paged_attention), fp32, one query token
// per row: q [S, H, D]; caches [blocks, block_size, KVH, D]; block_tables [>=S, max_blocks] and
// seq_lens [>=S] int32, row s's table and the number of keys it sees (a decode: its sequence's; a
// token of a verification step: its own position + 1, so it is computed as its decode would be).
// One task per (row, KV head) serves that head's group of query heads: each key and value read once.
at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  check_fp32(q, "q");
  check_fp32(k_cache, "k_cache");
  check_fp32(v_cache, "v_cache");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.stride(1) == 1 &&
              seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "block tables and lengths must be int32");
  const int64_t seqs = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2), table_stride = block_tables.stride(0);
  TORCH_CHECK(d % 8 == 0 && k_cache.size(3) == d && heads % kv_heads == 0, "head sizes do not match");
  TORCH_CHECK(block_tables.size(0) >= seqs && seq_lens.size(0) >= seqs, "fewer block tables than sequences");
  const int64_t group = heads / kv_heads, token_stride = kv_heads * d;
  at::Tensor out = at::empty_like(q);
  const float *qp = q.data_ptr<float>(), *kp = k_cache.data_ptr<float>(), *vp = v_cache.data_ptr<float>();
  const int32_t *tables = block_tables.data_ptr<int32_t>(), *lens = seq_lens.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);
  // Short contexts at batch 1 take a few microseconds: waking a second thread costs more.
  int64_t work = 0;
  for (int64_t s = 0; s < seqs; ++s) work += lens[s] * kv_heads;
  const int64_t grain = work < 16384 ? seqs * kv_heads : 1;
  at::parallel_for(0, seqs * kv_heads, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / kv_heads, kvh = task % kv_heads, len = lens[s];
      const int32_t* table = tables + s * table_stride;
      const float* q0 = qp + (s * heads + kvh * group) * d;
      scores.resize(group * len);
      // Block by block through the table (no division per token): scores[g][t] = q_g . k_t * scale.
      for (int64_t start = 0; start < len; start += block_size) {
        const float* key = kp + static_cast<int64_t>(table[start / block_size]) * block_size * token_stride + kvh * d;
        const int64_t n = std::min(block_size, len - start);
        for (int64_t j = 0; j < n; ++j, key += token_stride) {
          for (int64_t g = 0; g < group; ++g) {
            const float* qh = q0 + g * d;
            __m256 dot0 = _mm256_setzero_ps(), dot1 = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i + 16 <= d; i += 16) {
              dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(key + i), dot0);
              dot1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i + 8), _mm256_loadu_ps(key + i + 8), dot1);
            }
            if (i < d) dot0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + i), _mm256_loadu_ps(key + i), dot0);
            scores[g * len + start + j] = hsum(_mm256_add_ps(dot0, dot1)) * fscale;
          }
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * len;
        const float top = *std::max_element(row, row + len);
        __m256 total = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= len; t += 8) {
          const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + t), _mm256_set1_ps(top)));
          _mm256_storeu_ps(row + t, e);
          total = _mm256_add_ps(total, e);
        }
        float sum = hsum(total);
        for (; t < len; ++t) {
          row[t] = std::exp(row[t] - top);
          sum += row[t];
        }
        const float inv = 1.f / sum;
        for (t = 0; t < len; ++t) row[t] *= inv;
      }
      // out_g = sum_t p[g][t] v_t, each value read once for the group.
      float* o0 = op + (s * heads + kvh * group) * d;
      std::fill_n(o0, group * d, 0.f);
      for (int64_t start = 0; start < len; start += block_size) {
        const float* value = vp + static_cast<int64_t>(table[start / block_size]) * block_size * token_stride + kvh * d;
        const int64_t n = std::min(block_size, len - start);
        for (int64_t j = 0; j < n; ++j, value += token_stride) {
          for (int64_t g = 0; g < group; ++g) {
            const __m256 w = _mm256_set1_ps(scores[g * len + start + j]);
            float* o = o0 + g * d;
            for (int64_t i = 0; i < d; i += 8)
              _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(value + i), _mm256_loadu_ps(o + i)));
          }
        }
      }
    }
  });
  return out;
}

// One linear of a decoder layer as the Python side lists it (LinearBase.kernel_args): kind 0, an
// fp32 weight [N, K]; 1, int8 (q, scale); 2, int4 blocks (packed, scale, offset) in groups of `group`.
at::Tensor layer_linear(const at::Tensor& x, at::TensorList weights, size_t& next, int64_t kind, int64_t group) {
  if (kind == 0) return at::mm(x, weights[next++].t());
  if (kind == 1) {
    next += 2;
    return int8_matmul(x, weights[next - 2], weights[next - 1]);
  }
  next += 3;
  return int4_matmul(x, weights[next - 3], weights[next - 2], weights[next - 1], group);
}

// A whole Llama decoder layer for decode rows, fp32 (what LlamaDecoderLayer.forward does, in one
// call: at batch 1 the Python and dispatch around each op cost as much as the layer's arithmetic).
// x: the previous layer's MLP output, overwritten; residual: the residual stream, updated in place;
// returns this layer's MLP output. Linears in order qkv, o, gate_up, down; no biases, no q/k norm,
// no tensor parallelism, an fp32 cache (the Python side checks).
at::Tensor decode_layer(at::Tensor& x, at::Tensor& residual, at::TensorList weights, at::IntArrayRef kinds,
                        at::IntArrayRef groups, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                        const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        int64_t num_heads, int64_t num_kv_heads, double scale) {
  TORCH_CHECK(kinds.size() == 4 && groups.size() == 4, "four linears: qkv, o, gate_up, down");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "slot_mapping must be int64");
  check_fp32(k_cache, "k_cache");
  check_fp32(v_cache, "v_cache");
  const int64_t rows = x.size(0), d = k_cache.size(3), q_size = num_heads * d, kv_size = num_kv_heads * d;
  TORCH_CHECK(slot_mapping.numel() == rows && k_cache.size(2) == num_kv_heads, "cache and rows do not match");
  size_t next = 0;
  fused_add_rms_norm(x, residual, input_norm, eps);
  at::Tensor qkv = layer_linear(x, weights, next, kinds[0], groups[0]);
  TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "qkv projection has ", qkv.size(1), " features");
  at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({rows, num_heads + num_kv_heads, d});
  rotary_embedding(qk, cos, sin);
  // This step's keys and values into their cache slots (reference.store_kv_cache).
  const float* src = qkv.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
  for (int64_t t = 0; t < rows; ++t) {
    const float* row = src + t * qkv.size(1);
    std::copy_n(row + q_size, kv_size, kc + slots[t] * kv_size);
    std::copy_n(row + q_size + kv_size, kv_size, vc + slots[t] * kv_size);
  }
  at::Tensor q = qkv.narrow(1, 0, q_size).contiguous().view({rows, num_heads, d});
  at::Tensor attn = paged_attention_decode(q, k_cache, v_cache, block_tables, seq_lens, scale).view({rows, q_size});
  at::Tensor o = layer_linear(attn, weights, next, kinds[1], groups[1]);
  fused_add_rms_norm(o, residual, post_norm, eps);
  at::Tensor h = silu_and_mul(layer_linear(o, weights, next, kinds[2], groups[2]));
  return layer_linear(h, weights, next, kinds[3], groups[3]);
}

}  // namespace

TORCH_LIBRARY(slipstream_cpu, lib) {
  lib.def("int8_matmul(Tensor x, Tensor q, Tensor scale) -> Tensor");
  lib.def("int4_matmul(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group_size) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  lib.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  lib.def("silu_and_mul(Tensor x) -> Tensor");
  lib.def("rotary_embedding(Tensor(a!) qk, Tensor cos, Tensor sin) -> ()");
  lib.def("decode_layer(Tensor(a!) x, Tensor(b!) residual, Tensor[] weights, int[] kinds, int[] groups, "
          "Tensor input_norm, Tensor post_norm, float eps, Tensor cos, Tensor sin, Tensor(c!) k_cache, "
          "Tensor(d!) v_cache, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, int num_heads, "
          "int num_kv_heads, float scale) -> Tensor");
  lib.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(slipstream_cpu, CPU, lib) {
  lib.impl("int8_matmul", &int8_matmul);
  lib.impl("int4_matmul", &int4_matmul);
  lib.impl("rms_norm", &rms_norm);
  lib.impl("fused_add_rms_norm", &fused_add_rms_norm);
  lib.impl("silu_and_mul", &silu_and_mul);
  lib.impl("rotary_embedding", &rotary_embedding);
  lib.impl("paged_attention_decode", &paged_attention_decode);
  lib.impl("decode_layer", &decode_layer);
}
