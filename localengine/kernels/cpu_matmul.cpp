// The engine's weight-only int8 and int4 matmuls for a few rows of fp32 activations (batch-1 and
// small-batch decode) on x86 CPUs with AVX2 and FMA; registered with the other ops in cpu_ops.cpp.
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

#include "cpu_ops.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace slipstream_cpu {

inline __m256 widen_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Up to kRowTile activation rows share each widened or unpacked weight chunk (a speculative
// verification step or a few decodes): the unpacking, not the memory, bounds these kernels.
constexpr int64_t kRowTile = 4;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// AVX-512 forms of the ops, for rows that are bound by arithmetic (a verification step, a batch of
// decodes): compiled function by function inside the AVX2 build and chosen at run time where
// PyTorch's CPU capability is AVX512 (use_avx512, set by kernels/cpu_ops.py). "tune": with generic
// tuning GCC folded each activation load into every FMA that used it, a load per FMA.
#if defined(__clang__)  // the hint is for GCC's load folding; older clang releases refuse "tune=" here
#define SLIPSTREAM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#else
#define SLIPSTREAM_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,tune=skylake-avx512")))
#endif

static std::atomic<bool> avx512_enabled{false};

void use_avx512(bool enabled) { avx512_enabled = enabled; }

// tile(m, r) for `rows` rows in tiles of at most kMax, as equal as allowed (6 rows at 4: 3 + 3, not
// 4 + 1 + 1): a tile of one or two rows keeps too few accumulator chains going to cover the FMA latency.
template <int64_t kMax, typename Tile>
inline void balanced_row_tiles(int64_t rows, Tile&& tile) {
  const int64_t tiles = ceil_div(rows, kMax);
  for (int64_t t = 0, m = 0; t < tiles; ++t) {
    const int64_t r = ceil_div(rows - m, tiles - t);
    tile(m, r);
    m += r;
  }
}

// tile.template operator()<R>() for R = rows (1..kMax): a tile's row count as the template argument
// its accumulator arrays are sized by.
template <int kMax, typename Tile>
inline void with_rows(int64_t rows, Tile&& tile) {
  if constexpr (kMax > 1) {
    if (rows < kMax) return with_rows<kMax - 1>(rows, tile);
  }
  tile.template operator()<kMax>();
}

// C output features for R activation rows: out[r * stride + c] = scale_c * sum_i q_c,i x_r,i. The
// R x C x 2 accumulators are independent FMA chains: with one feature and two chains a row was bound
// by the FMA latency, not by memory.
template <int R, int C>
inline void int8_tile(const int8_t* rows, const float* x, int64_t k, const float* scales, float* out,
                      int64_t stride) {
  __m256 a0[C][R], a1[C][R];
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) a0[c][r] = a1[c][r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    __m256 x0[R], x1[R];
    for (int r = 0; r < R; ++r) x0[r] = _mm256_loadu_ps(x + r * k + i), x1[r] = _mm256_loadu_ps(x + r * k + i + 8);
    for (int c = 0; c < C; ++c) {
      // The rows two tiles ahead, a cache line per 64 inputs: without it a step waited on memory
      // (SmolLM2's 120 linears and int8 head, 2 threads, weights from memory: 12.4 -> 7.7 ms with the tiles).
      if (i % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(rows + (c + 2 * C) * k + i), _MM_HINT_T0);
      const __m256 w0 = widen_i8(rows + c * k + i), w1 = widen_i8(rows + c * k + i + 8);
      for (int r = 0; r < R; ++r) {
        a0[c][r] = _mm256_fmadd_ps(w0, x0[r], a0[c][r]);
        a1[c][r] = _mm256_fmadd_ps(w1, x1[r], a1[c][r]);
      }
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) out[r * stride + c] = hsum(_mm256_add_ps(a0[c][r], a1[c][r])) * scales[c];
}

// int8_tile on AVX-512 for 3 or more rows: 16 weights widened a step, up to 8 rows x 2 features a tile.
template <int R, int C>
SLIPSTREAM_AVX512 inline void int8_tile_avx512(const int8_t* rows, const float* x, int64_t k, const float* scales,
                                               float* out, int64_t stride) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) {
      if (i % 64 == 0) _mm_prefetch(reinterpret_cast<const char*>(rows + (c + 2 * C) * k + i), _MM_HINT_T0);
      wv[c] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows + c * k + i))));
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * k + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * stride + c] = _mm512_reduce_add_ps(acc[r][c]) * scales[c];
}

template <int C>
void int8_tiles_avx512(const int8_t* rows, const float* x, int64_t k, int64_t m_rows, const float* scales,
                       float* out, int64_t stride) {
  balanced_row_tiles<8>(m_rows, [&](int64_t m, int64_t r) {
    with_rows<8>(r, [&]<int R>() { int8_tile_avx512<R, C>(rows, x + m * k, k, scales, out + m * stride, stride); });
  });
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

static void check_rows(const at::Tensor& x, int64_t k) {
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
  const bool avx512 = avx512_enabled && m_rows >= 3;
  at::parallel_for(0, n_out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end;) {
      // One row of activations: 4 features at a time; 2 rows: 2; more: balanced tiles of up to 4 rows,
      // 1 feature (AVX-512: of up to 8 rows, 2 features).
      const int64_t features = std::min<int64_t>(m_rows == 1 ? 4 : m_rows == 2 || avx512 ? 2 : 1, end - n);
      const int8_t* rows = qp + n * k;
      if (avx512 && features == 2) int8_tiles_avx512<2>(rows, xp, k, m_rows, sp + n, op + n, n_out);
      else if (avx512) int8_tiles_avx512<1>(rows, xp, k, m_rows, sp + n, op + n, n_out);
      else if (features == 4) int8_tile<1, 4>(rows, xp, k, sp + n, op + n, n_out);
      else if (features == 2 && m_rows == 2) int8_tile<2, 2>(rows, xp, k, sp + n, op + n, n_out);
      else {
        for (int64_t f = 0; f < features; ++f) {
          balanced_row_tiles<kRowTile>(m_rows, [&](int64_t m, int64_t r) {
            with_rows<kRowTile>(r, [&]<int R>() {
              int8_tile<R, 1>(rows + f * k, xp + m * k, k, sp + n + f, op + m * n_out + n + f, n_out);
            });
          });
        }
      }
      n += features;
    }
  });
  return out;
}

// Float weights as fp32 lanes: fp32 loaded as they are, bf16 widened exactly (a bf16 value's bits are
// the top half of the same fp32 value's), so a bf16 weight gives the products an fp32 copy of it would.
inline float weight_value(float w) { return w; }
inline float weight_value(uint16_t w) {
  const uint32_t bits = uint32_t{w} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
SLIPSTREAM_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SLIPSTREAM_AVX512 inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
SLIPSTREAM_AVX512 inline __m512 load16(const float* p, __mmask16 lanes) { return _mm512_maskz_loadu_ps(lanes, p); }
SLIPSTREAM_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 lanes) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, p)), 16));
}

// C output features for R rows, float weights W [N, K] row-major (fp32, or bf16 as uint16_t): each
// weight chunk loaded once serves R rows and each activation chunk C features (R x C independent
// accumulator chains).
template <int R, int C, typename W>
inline void float_tile(const W* w, const float* x, int64_t k, float* out, int64_t stride) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; ++c) {
      // A cache line two tiles ahead, as int8_tile: 24.8 -> 22.6 ms for SmolLM2's 120 fp32 linears from memory.
      if (i % (64 / sizeof(W)) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + (c + 2 * C) * k + i), _MM_HINT_T0);
      wv[c] = load8(w + c * k + i);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * k + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(wv[c], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      float sum = hsum(acc[r][c]);
      for (int64_t j = i; j < k; ++j) sum += weight_value(w[c * k + j]) * x[r * k + j];
      out[r * stride + c] = sum;
    }
  }
}

// The rows in balanced tiles (demo model's linears, one thread: 3 rows 392 -> 296 us, 6 rows 462 -> 413
// against tiles of 4 and the rest one by one).
template <int C, typename W>
inline void float_tiles(const W* w, const float* x, int64_t k, int64_t rows, float* out, int64_t stride) {
  balanced_row_tiles<kRowTile>(rows, [&](int64_t m, int64_t r) {
    with_rows<kRowTile>(r, [&]<int R>() { float_tile<R, C>(w, x + m * k, k, out + m * stride, stride); });
  });
}

// The same on AVX-512 CPUs: 16 lanes and 32 registers, so a tile holds up to 8 rows x 3 features (24
// accumulators) and a verification step of up to 8 positions reads the weights once (demo model's
// linears, one thread: 5 rows 412 -> 327 us, 9 rows 589 -> 431, 16 rows 884 -> 650).
template <int R, int C, typename W>
SLIPSTREAM_AVX512 inline void float_tile_avx512(const W* w, const float* x, int64_t k, float* out, int64_t stride) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) {
      if (i % (64 / sizeof(W)) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + (c + 2 * C) * k + i), _MM_HINT_T0);
      wv[c] = load16(w + c * k + i);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + r * k + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
    }
  }
  if (i < k) {  // the last k % 16 inputs, the other lanes zero
    const __mmask16 lanes = static_cast<__mmask16>((1u << (k - i)) - 1);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_maskz_loadu_ps(lanes, x + r * k + i);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(load16(w + c * k + i, lanes), xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * stride + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <int C, typename W>
void float_tiles_avx512(const W* w, const float* x, int64_t k, int64_t rows, float* out, int64_t stride) {
  balanced_row_tiles<8>(rows, [&](int64_t m, int64_t r) {
    with_rows<8>(r, [&]<int R>() { float_tile_avx512<R, C>(w, x + m * k, k, out + m * stride, stride); });
  });
}

template <int C, typename W>
inline void float_tiles_any(const W* w, const float* x, int64_t k, int64_t rows, float* out, int64_t stride, bool avx512) {
  if (avx512) float_tiles_avx512<C>(w, x, k, rows, out, stride);
  else float_tiles<C>(w, x, k, rows, out, stride);
}

template <typename W>
void float_weight_matmul(const float* xp, const W* wp, int64_t m_rows, int64_t n_out, int64_t k, float* op) {
  constexpr int64_t kFeatures = 3;
  const bool avx512 = avx512_enabled;
  at::parallel_for(0, ceil_div(n_out, kFeatures), 8, [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t n = tile * kFeatures;
      switch (std::min(kFeatures, n_out - n)) {
        case 1: float_tiles_any<1>(wp + n * k, xp, k, m_rows, op + n, n_out, avx512); break;
        case 2: float_tiles_any<2>(wp + n * k, xp, k, m_rows, op + n, n_out, avx512); break;
        default: float_tiles_any<3>(wp + n * k, xp, k, m_rows, op + n, n_out, avx512);
      }
    }
  });
}

// x [M, K] @ w[N, K]^T for a few rows (decode), w fp32 or bf16: MKL's sgemm reaches a third of what
// the FMA units can do at 4-16 rows on SmolLM2's shapes (2-core AVX2: 55 GFLOPS at 16 rows), where this
// streams each weight row once per tile of rows from L1 and is bound by the FMAs; a bf16 weight is
// half the bytes to stream at one row.
at::Tensor fp32_matmul(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK((w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16) && w.is_contiguous() && w.dim() == 2,
              "w must be contiguous fp32 or bf16 [N, K]");
  const int64_t n_out = w.size(0), k = w.size(1), m_rows = x.size(0);
  check_rows(x, k);
  at::Tensor out = at::empty({m_rows, n_out}, x.options());
  if (w.scalar_type() == at::kBFloat16)
    float_weight_matmul(x.data_ptr<float>(), reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()), m_rows, n_out, k,
                        out.data_ptr<float>());
  else
    float_weight_matmul(x.data_ptr<float>(), w.data_ptr<float>(), m_rows, n_out, k, out.data_ptr<float>());
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

struct Int4Shape {
  int64_t n_out, k, groups;
};

// A packed int4 weight [N, K / 2] with one scale and one offset per group of group_size inputs.
static Int4Shape check_int4(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                            int64_t group_size) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2,
              "packed must be contiguous uint8 [N, K / 2]");
  TORCH_CHECK(group_size >= 32 && group_size % 32 == 0, "group size must be a multiple of 32");
  const int64_t n_out = packed.size(0), k = packed.size(1) * 2;
  TORCH_CHECK(k % group_size == 0, "K must be a whole number of groups");
  const int64_t groups = k / group_size;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == n_out * groups,
              "scale must be contiguous fp32 [N, K / group_size]");
  TORCH_CHECK(offset.scalar_type() == at::kFloat && offset.is_contiguous() && offset.numel() == n_out * groups,
              "offset must be contiguous fp32 [N, K / group_size]");
  return {n_out, k, groups};
}

// Activations quantized to int8 in blocks of 32 (one fp32 scale each, as llama.cpp's Q8_0), so a
// block's dot product is two integer instructions (maddubs, madd) instead of 4 converts and 2 FMAs.
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                          const at::Tensor& offset, int64_t group_size) {
  TORCH_CHECK((group_size & (group_size - 1)) == 0, "group size must be a power of two from 32");
  const Int4Shape shape = check_int4(packed, scale, offset, group_size);  // named: lambdas below capture them
  const int64_t n_out = shape.n_out, k = shape.k, groups = shape.groups;
  const int64_t m_rows = x.size(0), blocks = k / 32, per_group = group_size / 32;
  int group_shift = 0;
  while ((int64_t{1} << group_shift) < per_group) ++group_shift;
  check_rows(x, k);
  std::vector<int8_t> xq(m_rows * k);
  const int64_t xs_stride = (blocks / 2 + 1) * 8;  // per row: 8 lanes per pair (int4_tile), then an odd block's
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
      // high nibbles (int4_tile); a last odd block as it is.
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
            with_rows<kRowTile>(tile, [&]<int R>() {
              int4_tiles<R, 1>(row, k / 2, xr, xs, k, srow, groups, group_shift, o + f, n_out);
            });
          }
        }
      }
      for (int64_t f = n; f < n + features; ++f) add_offsets(zp + f * groups, xsum.data(), groups, m_rows, op + f, n_out);
      n += features;
    }
  });
  return out;
}

// The whole int4 weight as fp32 [N, K], for prefill chunks (more rows than the kernels above take),
// where PyTorch's fp32 GEMM reuses each weight across rows: one pass instead of the five tensor ops
// (unpack, concatenate, convert, multiply-add) that took a third of a 300-token prefill step.
at::Tensor int4_dequantize(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                           int64_t group_size) {
  const Int4Shape shape = check_int4(packed, scale, offset, group_size);  // named: lambdas below capture them
  const int64_t n_out = shape.n_out, k = shape.k, groups = shape.groups;
  const int64_t per_group = group_size / 32;
  at::Tensor out = at::empty({n_out, k}, scale.options());
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const float* sp = scale.data_ptr<float>();
  const float* zp = offset.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const __m128i nibble = _mm_set1_epi8(0x0F);
  at::parallel_for(0, n_out, 16, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const uint8_t* row = pp + n * (k / 2);
      float* dst = op + n * k;
      for (int64_t b = 0; b < k / 32; ++b) {
        const __m256 s = _mm256_set1_ps(sp[n * groups + b / per_group]);
        const __m256 z = _mm256_set1_ps(zp[n * groups + b / per_group]);
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * 16));
        const __m128i halves[2] = {_mm_and_si128(bytes, nibble), _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble)};
        for (int h = 0; h < 2; ++h) {  // inputs 0-15 of the block in the low nibbles, 16-31 in the high
          const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(halves[h]));
          const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(halves[h], 8)));
          _mm256_storeu_ps(dst + b * 32 + h * 16, _mm256_add_ps(_mm256_mul_ps(lo, s), z));
          _mm256_storeu_ps(dst + b * 32 + h * 16 + 8, _mm256_add_ps(_mm256_mul_ps(hi, s), z));
        }
      }
    }
  });
  return out;
}

}  // namespace slipstream_cpu
