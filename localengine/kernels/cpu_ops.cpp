// The engine's CPU ops for decode on x86 CPUs with AVX2 and FMA: the fp32 steps around the
// weight-only matmuls (cpu_matmul.cpp) that PyTorch runs as many small ops (vLLM's names:
// fused_add_rms_norm, rotary_embedding, silu_and_mul, paged attention for decodes), and a decoder
// layer composed of them in one call. Registered, with the matmuls, as torch.ops.slipstream_cpu.*;
// built on first use by kernels/cpu_ops.py.
//
// Why the small ones: at batch 1 a SmolLM2-135M token ran ~1,800 PyTorch ops (30 layers x ~60), and
// their dispatch, allocation and threading cost more than the arithmetic (the profile: index_select,
// as_strided, view, empty, slice, where, cat ... each a few microseconds).

#include "cpu_ops.h"

#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

namespace slipstream_cpu {
namespace {

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

// An fp8 (e4m3fn) cache element: its bits, to tell it from an int8 one.
struct E4M3 {
  uint8_t bits;
};

// Eight cache elements as fp32 lanes: an fp32 cache's as they are, an int8 or e4m3 cache's widened exactly
// (their scales are folded into the query and the output by the caller, kernels/kv_quant.py).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits. Its bits moved to fp16's places (sign to bit 15,
// exponent and mantissa to bits 13..7) make an fp16 value 2^-8 times the e4m3 one, subnormals included (fp16's
// reach below e4m3's), which F16C widens exactly; times 256 gives it back. The cache holds no NaN (stores
// saturate at 448).
inline __m256 load8(const E4M3* p) {
  const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                                    _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
  return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.f));
}

// Eight keys' dot products with one query head, one per lane. Each key's products are summed in the
// same order whichever keys share its chunk, so a row's scores do not depend on where its length ends
// (a verification row scores as its own decode step would). One reduction serves the eight keys,
// where a horizontal sum per key cost as much as its products (d = 32: attention was 40% of a
// verification step of the demo model).
template <typename T>
inline __m256 dot8(const float* qh, const T* const* keys, int64_t d) {
  __m256 acc[8];
  const __m256 q = _mm256_loadu_ps(qh);
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_mul_ps(q, load8(keys[j]));
  for (int64_t i = 8; i < d; i += 8) {
    const __m256 qi = _mm256_loadu_ps(qh + i);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qi, load8(keys[j] + i), acc[j]);
  }
  // hadd pairs lanes within 128-bit halves: after two rounds u0 holds keys 0-3's low-half and high-half sums,
  // u1 keys 4-7's; the halves' sums give one key a lane.
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// o[0 : 8R] = sum_t p[t] v_t[offset : offset + 8R] over a paged cache, the sums in registers and the
// values in token order (the order a plain loop adds them).
template <int R, typename T>
inline void weighted_values(const float* p, const T* vp, const int32_t* table, int64_t block_size,
                            int64_t token_stride, int64_t offset, int64_t len, float* o) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t start = 0; start < len; start += block_size) {
    const T* value = vp + static_cast<int64_t>(table[start / block_size]) * block_size * token_stride + offset;
    const int64_t n = std::min(block_size, len - start);
    for (int64_t j = 0; j < n; ++j, value += token_stride) {
      const __m256 w = _mm256_set1_ps(p[start + j]);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, load8(value + 8 * r), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(o + 8 * r, acc[r]);
}

// Decode attention straight over the paged cache (vLLM's paged_attention), fp32 queries over an fp32,
// int8 or fp8 e4m3fn cache, one query token per row: q [S, H, D]; caches [blocks, block_size, KVH, D];
// block_tables [>=S, max_blocks] and seq_lens [>=S] int32, row s's table and the number of keys it
// sees (a decode: its sequence's; a token of a verification step: its own position + 1, so it is
// computed as its decode would be). A quantized cache holds K/V divided by static per-channel scales: the
// caller multiplies q by the keys' and the output by the values' (reference.paged_attention).
// One task per (row, KV head) serves that head's group of query heads: each key and value read once.
template <typename T>
void attend(const float* qp, const T* kp, const T* vp, const int32_t* tables, int64_t table_stride, const int32_t* lens,
            int64_t seqs, int64_t heads, int64_t kv_heads, int64_t d, int64_t block_size, double scale, float* op) {
  const int64_t group = heads / kv_heads, token_stride = kv_heads * d;
  const __m256 vscale = _mm256_set1_ps(static_cast<float>(scale));
  // Short contexts at batch 1 take a few microseconds: waking a second thread costs more.
  int64_t work = 0;
  for (int64_t s = 0; s < seqs; ++s) work += lens[s] * kv_heads;
  const int64_t grain = work < 16384 ? seqs * kv_heads : 1;
  at::parallel_for(0, seqs * kv_heads, grain, [&](int64_t begin, int64_t end) {
    // An e4m3 cache's rows are widened once for the group's heads (eight keys, or one value): widening
    // costs more than their products, where an int8 row's (two instructions) is read as it is.
    constexpr bool widen_once = std::is_same_v<T, E4M3>;
    std::vector<float> scores, widened;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = task / kv_heads, kvh = task % kv_heads, len = lens[s];
      const int32_t* table = tables + s * table_stride;
      const float* q0 = qp + (s * heads + kvh * group) * d;
      scores.resize(group * len);
      // scores[g][t] = q_g . k_t * scale, eight keys at a time, walking the table (no division per key);
      // a chunk past the length repeats its last key and drops those lanes.
      const T* keys[8];
      int64_t block = 0, slot = 0;
      for (int64_t t = 0; t < len; t += 8) {
        const int64_t n = std::min<int64_t>(8, len - t);
        for (int64_t j = 0; j < 8; ++j) {
          if (j < n) {
            keys[j] = kp + (static_cast<int64_t>(table[block]) * block_size + slot) * token_stride + kvh * d;
            if (++slot == block_size) slot = 0, ++block;
          } else {
            keys[j] = keys[n - 1];
          }
        }
        const float* wide[8];
        if constexpr (widen_once) {
          widened.resize(8 * d);
          for (int64_t j = 0; j < 8; ++j) {
            for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(widened.data() + j * d + i, load8(keys[j] + i));
            wide[j] = widened.data() + j * d;
          }
        }
        for (int64_t g = 0; g < group; ++g) {
          __m256 dots;
          if constexpr (widen_once) dots = _mm256_mul_ps(dot8(q0 + g * d, wide, d), vscale);
          else dots = _mm256_mul_ps(dot8(q0 + g * d, keys, d), vscale);
          float* out = scores.data() + g * len + t;
          if (n == 8) {
            _mm256_storeu_ps(out, dots);
          } else {
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, dots);
            std::copy_n(lanes, n, out);
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
      // out_g = sum_t p[g][t] v_t, each output summed in token order.
      float* o0 = op + (s * heads + kvh * group) * d;
      if constexpr (!widen_once) {
        // Up to 32 of a head's outputs held in registers over every value.
        for (int64_t g = 0; g < group; ++g)
          for (int64_t i = 0; i < d; i += 32) {
            const float* p = scores.data() + g * len;
            float* o = o0 + g * d + i;
            switch (std::min<int64_t>(d - i, 32) / 8) {
              case 1: weighted_values<1>(p, vp, table, block_size, token_stride, kvh * d + i, len, o); break;
              case 2: weighted_values<2>(p, vp, table, block_size, token_stride, kvh * d + i, len, o); break;
              case 3: weighted_values<3>(p, vp, table, block_size, token_stride, kvh * d + i, len, o); break;
              default: weighted_values<4>(p, vp, table, block_size, token_stride, kvh * d + i, len, o);
            }
          }
      } else {
        // Each value widened once for the group's heads, their sums in the output (in L1).
        std::fill_n(o0, group * d, 0.f);
        widened.resize(d);
        for (int64_t start = 0; start < len; start += block_size) {
          const T* value = vp + static_cast<int64_t>(table[start / block_size]) * block_size * token_stride + kvh * d;
          const int64_t n = std::min(block_size, len - start);
          for (int64_t j = 0; j < n; ++j, value += token_stride) {
            for (int64_t i = 0; i < d; i += 8) _mm256_storeu_ps(widened.data() + i, load8(value + i));
            for (int64_t g = 0; g < group; ++g) {
              const __m256 w = _mm256_set1_ps(scores[g * len + start + j]);
              float* o = o0 + g * d;
              for (int64_t i = 0; i < d; i += 8)
                _mm256_storeu_ps(o + i, _mm256_fmadd_ps(w, _mm256_loadu_ps(widened.data() + i), _mm256_loadu_ps(o + i)));
            }
          }
        }
      }
    }
  });
}

at::Tensor paged_attention_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  check_fp32(q, "q");
  const at::ScalarType cache = k_cache.scalar_type();
  TORCH_CHECK((cache == at::kFloat || cache == at::kChar || cache == at::kFloat8_e4m3fn) && v_cache.scalar_type() == cache &&
              k_cache.is_contiguous() && v_cache.is_contiguous(), "caches must be contiguous, both fp32, int8 or fp8 e4m3fn");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.dim() == 2 && block_tables.stride(1) == 1 &&
              seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "block tables and lengths must be int32");
  const int64_t seqs = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  TORCH_CHECK(d % 8 == 0 && k_cache.size(3) == d && heads % kv_heads == 0, "head sizes do not match");
  TORCH_CHECK(block_tables.size(0) >= seqs && seq_lens.size(0) >= seqs, "fewer block tables than sequences");
  at::Tensor out = at::empty_like(q);
  const int32_t *tables = block_tables.data_ptr<int32_t>(), *lens = seq_lens.data_ptr<int32_t>();
  if (cache == at::kChar)
    attend(q.data_ptr<float>(), k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(), tables, block_tables.stride(0),
           lens, seqs, heads, kv_heads, d, block_size, scale, out.data_ptr<float>());
  else if (cache == at::kFloat8_e4m3fn)
    attend(q.data_ptr<float>(), static_cast<const E4M3*>(k_cache.data_ptr()), static_cast<const E4M3*>(v_cache.data_ptr()),
           tables, block_tables.stride(0), lens, seqs, heads, kv_heads, d, block_size, scale, out.data_ptr<float>());
  else
    attend(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), tables, block_tables.stride(0),
           lens, seqs, heads, kv_heads, d, block_size, scale, out.data_ptr<float>());
  return out;
}

// x * inv rounded to int8 as kv_quant.quantize does it: clamped to +-127, then floor(y + 0.5).
void quantize_int8(const float* x, const float* inv, int64_t n, int8_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float y = std::min(std::max(x[i] * inv[i], -127.f), 127.f);
    out[i] = static_cast<int8_t>(std::floor(y + 0.5f));
  }
}

// The same for e4m3fn: clamped to +-448, then PyTorch's own conversion (round to nearest even).
void quantize_e4m3(const float* x, const float* inv, int64_t n, c10::Float8_e4m3fn* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = c10::Float8_e4m3fn(std::min(std::max(x[i] * inv[i], -448.f), 448.f));
}

// x [rows, heads, d] *= scale [kv_heads, d] in place, query head h taking KV head h / group's row
// (reference._per_query_head).
void scale_heads(at::Tensor& x, const at::Tensor& scale, int64_t kv_heads) {
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2), group = heads / kv_heads;
  float* xp = x.data_ptr<float>();
  const float* sp = scale.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      float* row = xp + (r * heads + h) * d;
      const float* s = sp + (h / group) * d;
      for (int64_t i = 0; i < d; ++i) row[i] *= s[i];
    }
}

// One linear of a decoder layer as the Python side lists it (LinearBase.kernel_args): kind 0, an
// fp32 weight [N, K]; 1, int8 (q, scale); 2, int4 blocks (packed, scale, offset) in groups of `group`.
at::Tensor layer_linear(const at::Tensor& x, at::TensorList weights, size_t& next, int64_t kind, int64_t group) {
  if (kind == 0) return fp32_matmul(x, weights[next++]);  // decode rows: at most cpu_ops.MAX_ROWS
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
// no tensor parallelism; an fp32 cache, or an int8 or fp8 e4m3fn one with its static scales (kv_scales: k,
// v, k_inv, v_inv, each [kv_heads, head_dim]; none for fp32) (the Python side checks).
at::Tensor decode_layer(at::Tensor& x, at::Tensor& residual, at::TensorList weights, at::IntArrayRef kinds,
                        at::IntArrayRef groups, const at::Tensor& input_norm, const at::Tensor& post_norm, double eps,
                        const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                        int64_t num_heads, int64_t num_kv_heads, double scale, at::TensorList kv_scales) {
  TORCH_CHECK(kinds.size() == 4 && groups.size() == 4, "four linears: qkv, o, gate_up, down");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "slot_mapping must be int64");
  const bool quantized = !kv_scales.empty();
  const at::ScalarType cache = k_cache.scalar_type();
  if (quantized) {
    TORCH_CHECK(kv_scales.size() == 4 && (cache == at::kChar || cache == at::kFloat8_e4m3fn) &&
                v_cache.scalar_type() == cache && k_cache.is_contiguous() && v_cache.is_contiguous(),
                "an int8 or fp8 e4m3fn cache and its scales: k, v, k_inv, v_inv");
    for (const at::Tensor& t : kv_scales) check_fp32(t, "kv scales");
  } else {
    check_fp32(k_cache, "k_cache");
    check_fp32(v_cache, "v_cache");
  }
  const int64_t rows = x.size(0), d = k_cache.size(3), q_size = num_heads * d, kv_size = num_kv_heads * d;
  TORCH_CHECK(slot_mapping.numel() == rows && k_cache.size(2) == num_kv_heads, "cache and rows do not match");
  TORCH_CHECK(!quantized || kv_scales[0].numel() == kv_size, "kv scales are [kv_heads, head_dim]");
  size_t next = 0;
  fused_add_rms_norm(x, residual, input_norm, eps);
  at::Tensor qkv = layer_linear(x, weights, next, kinds[0], groups[0]);
  TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "qkv projection has ", qkv.size(1), " features");
  at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size).view({rows, num_heads + num_kv_heads, d});
  rotary_embedding(qk, cos, sin);
  // This step's keys and values into their cache slots (reference.store_kv_cache).
  const float* src = qkv.data_ptr<float>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  at::Tensor q = qkv.narrow(1, 0, q_size).contiguous().view({rows, num_heads, d});
  if (quantized) {
    const float *k_inv = kv_scales[2].data_ptr<float>(), *v_inv = kv_scales[3].data_ptr<float>();
    for (int64_t t = 0; t < rows; ++t) {
      const float* row = src + t * qkv.size(1);
      if (cache == at::kChar) {
        quantize_int8(row + q_size, k_inv, kv_size, k_cache.data_ptr<int8_t>() + slots[t] * kv_size);
        quantize_int8(row + q_size + kv_size, v_inv, kv_size, v_cache.data_ptr<int8_t>() + slots[t] * kv_size);
      } else {
        quantize_e4m3(row + q_size, k_inv, kv_size, k_cache.data_ptr<c10::Float8_e4m3fn>() + slots[t] * kv_size);
        quantize_e4m3(row + q_size + kv_size, v_inv, kv_size, v_cache.data_ptr<c10::Float8_e4m3fn>() + slots[t] * kv_size);
      }
    }
    scale_heads(q, kv_scales[0], num_kv_heads);  // the keys' scales, folded into the queries
  } else {
    float *kc = k_cache.data_ptr<float>(), *vc = v_cache.data_ptr<float>();
    for (int64_t t = 0; t < rows; ++t) {
      const float* row = src + t * qkv.size(1);
      std::copy_n(row + q_size, kv_size, kc + slots[t] * kv_size);
      std::copy_n(row + q_size + kv_size, kv_size, vc + slots[t] * kv_size);
    }
  }
  at::Tensor attn = paged_attention_decode(q, k_cache, v_cache, block_tables, seq_lens, scale);
  if (quantized) scale_heads(attn, kv_scales[1], num_kv_heads);  // the values' scales
  attn = attn.view({rows, q_size});
  at::Tensor o = layer_linear(attn, weights, next, kinds[1], groups[1]);
  fused_add_rms_norm(o, residual, post_norm, eps);
  at::Tensor h = silu_and_mul(layer_linear(o, weights, next, kinds[2], groups[2]));
  return layer_linear(h, weights, next, kinds[3], groups[3]);
}

}  // namespace
}  // namespace slipstream_cpu

TORCH_LIBRARY(slipstream_cpu, lib) {
  lib.def("fp32_matmul(Tensor x, Tensor w) -> Tensor");
  lib.def("use_avx512(bool enabled) -> ()", &slipstream_cpu::use_avx512);  // no tensors: no dispatch key
  lib.def("int8_matmul(Tensor x, Tensor q, Tensor scale) -> Tensor");
  lib.def("int4_matmul(Tensor x, Tensor packed, Tensor scale, Tensor offset, int group_size) -> Tensor");
  lib.def("int4_dequantize(Tensor packed, Tensor scale, Tensor offset, int group_size) -> Tensor");
  lib.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  lib.def("fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  lib.def("silu_and_mul(Tensor x) -> Tensor");
  lib.def("rotary_embedding(Tensor(a!) qk, Tensor cos, Tensor sin) -> ()");
  lib.def("decode_layer(Tensor(a!) x, Tensor(b!) residual, Tensor[] weights, int[] kinds, int[] groups, "
          "Tensor input_norm, Tensor post_norm, float eps, Tensor cos, Tensor sin, Tensor(c!) k_cache, "
          "Tensor(d!) v_cache, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, int num_heads, "
          "int num_kv_heads, float scale, Tensor[] kv_scales) -> Tensor");
  lib.def("paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(slipstream_cpu, CPU, lib) {
  lib.impl("fp32_matmul", &slipstream_cpu::fp32_matmul);
  lib.impl("int8_matmul", &slipstream_cpu::int8_matmul);
  lib.impl("int4_matmul", &slipstream_cpu::int4_matmul);
  lib.impl("int4_dequantize", &slipstream_cpu::int4_dequantize);
  lib.impl("rms_norm", &slipstream_cpu::rms_norm);
  lib.impl("fused_add_rms_norm", &slipstream_cpu::fused_add_rms_norm);
  lib.impl("silu_and_mul", &slipstream_cpu::silu_and_mul);
  lib.impl("rotary_embedding", &slipstream_cpu::rotary_embedding);
  lib.impl("paged_attention_decode", &slipstream_cpu::paged_attention_decode);
  lib.impl("decode_layer", &slipstream_cpu::decode_layer);
}
