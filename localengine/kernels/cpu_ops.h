// Shared by the engine's CPU ops (cpu_matmul.cpp: weight-only matmuls; cpu_ops.cpp: the fp32
// steps around them and the fused decode layer); built together by kernels/cpu_ops.py.
#pragma once

#include <ATen/ATen.h>
#include <immintrin.h>

namespace slipstream_cpu {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

inline void check_fp32(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(), what, " must be contiguous fp32");
}

at::Tensor fp32_matmul(const at::Tensor& x, const at::Tensor& w);
void use_avx512(bool enabled);
at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale);
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale,
                       const at::Tensor& offset, int64_t group_size);
at::Tensor int4_dequantize(const at::Tensor& packed, const at::Tensor& scale, const at::Tensor& offset,
                           int64_t group_size);

}  // namespace slipstream_cpu
