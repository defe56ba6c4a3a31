// A float32 vector of the widest kind the build's flags allow, for code written once for three ISAs:
// AVX-512F (16 lanes), AVX2 + FMA (8 lanes) and the x86-64 baseline SSE2 (4 lanes, multiply then add).
// `kernels/native/__init__.py` builds one module per ISA from the same source with that ISA's flags.
#pragma once

#include <immintrin.h>
#include <cstdint>

namespace link_simd {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
constexpr const char* kIsa = "avx512";
using vf = __m512;
inline vf zero() { return _mm512_setzero_ps(); }
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline float reduce(vf v) { return _mm512_reduce_add_ps(v); }
inline vf set1(float a) { return _mm512_set1_ps(a); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
using vi = __m512i;
inline vi load_u8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vi load_i8(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vi iset1(int a) { return _mm512_set1_epi32(a); }
inline vi iand(vi a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
inline vi ior(vi a, vi b) { return _mm512_or_si512(a, b); }
inline vi isub(vi a, int b) { return _mm512_sub_epi32(a, _mm512_set1_epi32(b)); }
inline vi isrl(vi a, int n) { return _mm512_srli_epi32(a, n); }
inline vi isll(vi a, int n) { return _mm512_slli_epi32(a, n); }
inline vi isrlv(vi a, vi n) { return _mm512_srlv_epi32(a, n); }
inline vi iota(int start) { return _mm512_add_epi32(_mm512_set1_epi32(start), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)); }
inline vf to_f(vi a) { return _mm512_cvtepi32_ps(a); }
// a | 16 in the lanes whose bit is set in `bits` (bit i for lane i)
inline vi or16_where(vi a, uint32_t bits) { return _mm512_mask_or_epi32(a, static_cast<__mmask16>(bits), a, _mm512_set1_epi32(16)); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
constexpr const char* kIsa = "avx2";
using vf = __m256;
inline vf zero() { return _mm256_setzero_ps(); }
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline float reduce(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline vf set1(float a) { return _mm256_set1_ps(a); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
using vi = __m256i;
inline vi load_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline vi load_i8(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline vi iset1(int a) { return _mm256_set1_epi32(a); }
inline vi iand(vi a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
inline vi ior(vi a, vi b) { return _mm256_or_si256(a, b); }
inline vi isub(vi a, int b) { return _mm256_sub_epi32(a, _mm256_set1_epi32(b)); }
inline vi isrl(vi a, int n) { return _mm256_srli_epi32(a, n); }
inline vi isll(vi a, int n) { return _mm256_slli_epi32(a, n); }
inline vi isrlv(vi a, vi n) { return _mm256_srlv_epi32(a, n); }
inline vi iota(int start) { return _mm256_add_epi32(_mm256_set1_epi32(start), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline vf to_f(vi a) { return _mm256_cvtepi32_ps(a); }
inline vi or16_where(vi a, uint32_t bits) {
  return _mm256_or_si256(a, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), iota(0)), _mm256_set1_epi32(1)), 4));
}
#else
constexpr int kLanes = 4;
constexpr const char* kIsa = "portable";
using vf = __m128;
inline vf zero() { return _mm_setzero_ps(); }
inline vf load(const float* p) { return _mm_loadu_ps(p); }
inline void store(float* p, vf v) { _mm_storeu_ps(p, v); }
inline vf fmadd(vf a, vf b, vf c) { return _mm_add_ps(_mm_mul_ps(a, b), c); }
inline float reduce(vf v) {
  __m128 s = _mm_add_ps(v, _mm_movehl_ps(v, v));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
inline vf set1(float a) { return _mm_set1_ps(a); }
inline vf mul(vf a, vf b) { return _mm_mul_ps(a, b); }
inline vf add(vf a, vf b) { return _mm_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm_sub_ps(a, b); }
using vi = __m128i;
inline vi load_u8(const uint8_t* p) { return _mm_setr_epi32(p[0], p[1], p[2], p[3]); }
inline vi load_i8(const int8_t* p) { return _mm_setr_epi32(p[0], p[1], p[2], p[3]); }
inline vi iset1(int a) { return _mm_set1_epi32(a); }
inline vi iand(vi a, int m) { return _mm_and_si128(a, _mm_set1_epi32(m)); }
inline vi ior(vi a, vi b) { return _mm_or_si128(a, b); }
inline vi isub(vi a, int b) { return _mm_sub_epi32(a, _mm_set1_epi32(b)); }
inline vi isrl(vi a, int n) { return _mm_srli_epi32(a, n); }
inline vi isll(vi a, int n) { return _mm_slli_epi32(a, n); }
inline vi isrlv(vi a, vi n) {  // SSE2 has no per-lane shift
  alignas(16) int av[4], nv[4];
  _mm_store_si128(reinterpret_cast<__m128i*>(av), a);
  _mm_store_si128(reinterpret_cast<__m128i*>(nv), n);
  return _mm_setr_epi32(static_cast<int>(static_cast<unsigned>(av[0]) >> nv[0]), static_cast<int>(static_cast<unsigned>(av[1]) >> nv[1]),
                        static_cast<int>(static_cast<unsigned>(av[2]) >> nv[2]), static_cast<int>(static_cast<unsigned>(av[3]) >> nv[3]));
}
inline vi iota(int start) { return _mm_setr_epi32(start, start + 1, start + 2, start + 3); }
inline vf to_f(vi a) { return _mm_cvtepi32_ps(a); }
inline vi or16_where(vi a, uint32_t bits) {
  return _mm_or_si128(a, _mm_setr_epi32((bits & 1) << 4, ((bits >> 1) & 1) << 4, ((bits >> 2) & 1) << 4, ((bits >> 3) & 1) << 4));
}
#endif

// dot products of NT weight rows (w + j * ldw) with M input rows (x + m * ldx) over K (a multiple of
// kLanes): out[m * ldo + j] = sum_k x[m, k] * w[j, k], accumulated lane-wise in a fixed order, then reduced.
template <int M, int NT>
inline void dot_tile(const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* out, int64_t ldo) {
  vf acc[M][NT];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NT; ++j) acc[m][j] = zero();
  for (int64_t k = 0; k < K; k += kLanes) {
    vf wv[NT];
    for (int j = 0; j < NT; ++j) wv[j] = load(w + j * ldw + k);
    for (int m = 0; m < M; ++m) {
      const vf xv = load(x + m * ldx + k);
      for (int j = 0; j < NT; ++j) acc[m][j] = fmadd(wv[j], xv, acc[m][j]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < NT; ++j) out[m * ldo + j] = reduce(acc[m][j]);
}

// dot_tile for a run-time row count 1-4.
template <int NT>
inline void dot_rows(int rows, const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K, float* out, int64_t ldo) {
  switch (rows) {
    case 1: dot_tile<1, NT>(x, ldx, w, ldw, K, out, ldo); break;
    case 2: dot_tile<2, NT>(x, ldx, w, ldw, K, out, ldo); break;
    case 3: dot_tile<3, NT>(x, ldx, w, ldw, K, out, ldo); break;
    default: dot_tile<4, NT>(x, ldx, w, ldw, K, out, ldo); break;
  }
}

}  // namespace link_simd
