// AVX-512 building blocks shared by rows_linear.cpp and decode_step.cpp.
//
// A "tile" is NT output columns (NT weight rows of an [N, K] weight) times M input rows (M <= 4): the
// weight rows are read once from memory and meet every input row in registers, so a few rows cost the
// weight traffic once. Within one tile function each output is one dot product over K in a fixed order
// that does not depend on M (a caller that keeps to one tile function per format, as rows_linear does,
// gives a row the same result alone or in a batch, bit for bit).
//
// Three weight formats, all computing y[m, n] = sum_k x[m, k] * w[n, k] with float32 activations:
// - float: w as float32 [N, K];
// - q4: GGUF Q4_1-style blocks of 32 along K, w = d * q + m with q in [0, 15] (4 bits), d and m float32
//   [N, K / 32]; the codes packed two per byte [N, K / 2], byte i of a block holding element i in its
//   low nibble and element i + 16 in its high nibble (GGUF's own order within a block);
// - q8: GGUF Q8_0-style blocks of 32 along K, w = d * q with q in [-127, 127] int8 [N, K], d [N, K / 32].
// For q4, sum_k x_k (d q_k + m) = d * sum_k x_k q_k + m * sum_k x_k: the per-block sums of x are computed
// once per call (`block_sums`) and shared by every output.
#pragma once

#include <immintrin.h>
#include <algorithm>
#include <cstdint>

namespace link_native {

constexpr int kGroup = 4;    // input rows per tile
constexpr int kBlock = 32;   // quantization block along K (GGUF's QK4_1 and QK8_0)

inline __mmask16 tail_mask(int64_t left) { return static_cast<__mmask16>((1u << left) - 1u); }

// ---- float32 weights ----------------------------------------------------------------------------------

template <int M, int NT>
inline void float_tile(const float* x, int64_t K, const float* w, float* out, int64_t ldo, int64_t n) {
  __m512 acc[NT][M];
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = _mm512_loadu_ps(w + (n + j) * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int j = 0; j < NT; ++j) acc[j][m] = _mm512_fmadd_ps(wv[j], xv, acc[j][m]);
    }
  }
  if (k < K) {
    const __mmask16 mask = tail_mask(K - k);
    __m512 wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = _mm512_maskz_loadu_ps(mask, w + (n + j) * K + k);
    for (int m = 0; m < M; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);
      for (int j = 0; j < NT; ++j) acc[j][m] = _mm512_fmadd_ps(wv[j], xv, acc[j][m]);
    }
  }
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) out[m * ldo + n + j] = _mm512_reduce_add_ps(acc[j][m]);
}

// The two 16-float halves of block b of each of the M rows of x [M, K].
template <int M>
inline void load_block(const float* x, int64_t K, int64_t b, __m512 (&x0)[M], __m512 (&x1)[M]) {
  for (int m = 0; m < M; ++m) {
    x0[m] = _mm512_loadu_ps(x + m * K + b * kBlock);
    x1[m] = _mm512_loadu_ps(x + m * K + b * kBlock + 16);
  }
}

// float_tile for a runtime row count (1-4).
template <int NT>
inline void float_rows(int rows, const float* x, int64_t K, const float* w, float* out, int64_t ldo, int64_t n) {
  switch (rows) {
    case 1: float_tile<1, NT>(x, K, w, out, ldo, n); break;
    case 2: float_tile<2, NT>(x, K, w, out, ldo, n); break;
    case 3: float_tile<3, NT>(x, K, w, out, ldo, n); break;
    default: float_tile<4, NT>(x, K, w, out, ldo, n); break;
  }
}

// ---- q4 (Q4_1-style) weights --------------------------------------------------------------------------

// xs [M, K / 32]: per-block sums of x, for the q4 offsets.
template <int M, int NT>
inline void q4_tile(const float* x, const float* xs, int64_t K, const uint8_t* q, const float* d, const float* mn,
                    float* out, int64_t ldo, int64_t n) {
  const int64_t nb = K / kBlock;
  const __m512i low4 = _mm512_set1_epi32(0xF);
  __m512 acc[NT][M];
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0[M], x1[M];
    load_block<M>(x, K, b, x0, x1);
    for (int j = 0; j < NT; ++j) {
      const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + (n + j) * (K / 2) + b * 16)));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(codes, low4));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4));
      const __m512 dv = _mm512_set1_ps(d[(n + j) * nb + b]);
      for (int m = 0; m < M; ++m)
        acc[j][m] = _mm512_fmadd_ps(_mm512_fmadd_ps(hi, x1[m], _mm512_mul_ps(lo, x0[m])), dv, acc[j][m]);
    }
  }
  for (int j = 0; j < NT; ++j) {
    const float* mrow = mn + (n + j) * nb;
    for (int m = 0; m < M; ++m) {
      float offset = 0.f;
      for (int64_t b = 0; b < nb; ++b) offset += mrow[b] * xs[m * nb + b];
      out[m * ldo + n + j] = _mm512_reduce_add_ps(acc[j][m]) + offset;
    }
  }
}

// ---- q8 (Q8_0-style) weights --------------------------------------------------------------------------

template <int M, int NT>
inline void q8_tile(const float* x, int64_t K, const int8_t* q, const float* d, float* out, int64_t ldo, int64_t n) {
  const int64_t nb = K / kBlock;
  __m512 acc[NT][M];
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) acc[j][m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 x0[M], x1[M];
    load_block<M>(x, K, b, x0, x1);
    for (int j = 0; j < NT; ++j) {
      const int8_t* qb = q + (n + j) * K + b * kBlock;
      const __m512 w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb))));
      const __m512 w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + 16))));
      const __m512 dv = _mm512_set1_ps(d[(n + j) * nb + b]);
      for (int m = 0; m < M; ++m)
        acc[j][m] = _mm512_fmadd_ps(_mm512_fmadd_ps(w1, x1[m], _mm512_mul_ps(w0, x0[m])), dv, acc[j][m]);
    }
  }
  for (int j = 0; j < NT; ++j)
    for (int m = 0; m < M; ++m) out[m * ldo + n + j] = _mm512_reduce_add_ps(acc[j][m]);
}

// ---- dequantizing whole weight rows (for calls with more rows than one tile group) ---------------------

// out [K] = d * q + m of one Q4_1-style weight row (one fused multiply-add per element).
inline void q4_dequant_row(const uint8_t* q, const float* d, const float* mn, int64_t K, float* out) {
  const __m512i low4 = _mm512_set1_epi32(0xF);
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * 16)));
    const __m512 dv = _mm512_set1_ps(d[b]), mv = _mm512_set1_ps(mn[b]);
    _mm512_storeu_ps(out + b * kBlock, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(codes, low4)), dv, mv));
    _mm512_storeu_ps(out + b * kBlock + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(codes, 4)), dv, mv));
  }
}

// out [K] = d * q of one Q8_0-style weight row.
inline void q8_dequant_row(const int8_t* q, const float* d, int64_t K, float* out) {
  for (int64_t b = 0; b < K / kBlock; ++b) {
    const __m512 dv = _mm512_set1_ps(d[b]);
    for (int h = 0; h < 2; ++h) {
      const __m512i codes = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + b * kBlock + 16 * h)));
      _mm512_storeu_ps(out + b * kBlock + 16 * h, _mm512_mul_ps(_mm512_cvtepi32_ps(codes), dv));
    }
  }
}

// ---- vector exp ---------------------------------------------------------------------------------------

// e^x for float32 lanes: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for the reduction), e^r by
// Cephes' degree-7 minimax polynomial for expf (relative error about 1e-7), times 2^n by vscalefps.
// Inputs are clamped to [-87.3, 88.3], where float32's e^x is normal (a NaN input gives e^-87.3, not NaN).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.3f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace link_native
