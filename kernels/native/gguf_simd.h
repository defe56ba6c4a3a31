// GGUF blocks decoded in vector registers (`simd.h`), for the matmul kernels of gguf_matmul.cpp.
//
// visit<T>(block, use) calls use(w, off, acc) for every kLanes-wide run of the block's values: w holds the
// exact float32 weights block[off, off + kLanes) (the same products in the same order as decode_block in
// gguf_blocks.h, which the build's -ffp-contract=off keeps from being fused), and acc (0 or 1, a constant
// after inlining) alternates between neighbouring runs so that a caller can keep two independent
// accumulator chains per output.
#pragma once

#include <cstdint>
#include <cstring>

#include "gguf_blocks.h"
#include "simd.h"

namespace link_gguf {

using namespace link_simd;

template <int T>
constexpr int kElems = (T == Q4_K || T == Q5_K || T == Q6_K) ? 256 : 32;

template <int T>
constexpr int kBytes = T == F32 ? 128 : T == Q4_0 ? 18 : T == Q4_1 ? 20 : T == Q5_0 ? 22 : T == Q5_1 ? 24 : T == Q8_0 ? 34 : T == Q4_K ? 144 : T == Q5_K ? 176 : 210;

// Legacy 4- and 5-bit blocks (Q4_0, Q4_1, Q5_0, Q5_1): 16 bytes of nibbles, element i < 16 in the low nibble
// of byte i, i + 16 in its high nibble; Q5 adds bit i of the 32-bit qh as bit 4 of element i.
template <int T, class Use>
inline void visit_legacy(const uint8_t* b, Use&& use) {
  constexpr bool has_min = T == Q4_1 || T == Q5_1;
  constexpr bool five = T == Q5_0 || T == Q5_1;
  constexpr int zero = T == Q4_0 ? 8 : T == Q5_0 ? 16 : 0;
  const vf d = set1(half_to_float(b));
  const vf mn = set1(has_min ? half_to_float(b + 2) : 0.f);
  const uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
  uint32_t qh = 0;
  if (five) std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
  for (int l = 0; l < 16; l += kLanes) {
    const vi bytes = load_u8(qs + l);
    vi lo = iand(bytes, 0xF), hi = isrl(bytes, 4);
    if (five) lo = or16_where(lo, qh >> l), hi = or16_where(hi, qh >> (l + 16));
    if (zero) lo = isub(lo, zero), hi = isub(hi, zero);
    vf w0 = mul(to_f(lo), d), w1 = mul(to_f(hi), d);
    if (has_min) w0 = add(w0, mn), w1 = add(w1, mn);
    use(w0, l, 0);
    use(w1, l + 16, 1);
  }
}

template <class Use>
inline void visit_q8_0(const uint8_t* b, Use&& use) {
  const vf d = set1(half_to_float(b));
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int l = 0; l < 32; l += 2 * kLanes) {
    use(mul(to_f(load_i8(q + l)), d), l, 0);
    use(mul(to_f(load_i8(q + l + kLanes)), d), l + kLanes, 1);
  }
}

template <int T, class Use>
inline void visit_k4(const uint8_t* b, Use&& use) {  // Q4_K and Q5_K
  constexpr bool five = T == Q5_K;
  const float d = half_to_float(b), dmin = half_to_float(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k_scale_min(2 * c, scales, sc0, m0);
    k_scale_min(2 * c + 1, scales, sc1, m1);
    const vf d0 = set1(d * static_cast<float>(sc0)), n0 = set1(dmin * static_cast<float>(m0));
    const vf d1 = set1(d * static_cast<float>(sc1)), n1 = set1(dmin * static_cast<float>(m1));
    for (int l = 0; l < 32; l += kLanes) {
      const vi bytes = load_u8(qs + 32 * c + l);
      vi lo = iand(bytes, 0xF), hi = isrl(bytes, 4);
      if (five) {
        const vi h = load_u8(qh + l);
        lo = ior(lo, isll(iand(isrl(h, 2 * c), 1), 4));
        hi = ior(hi, isll(iand(isrl(h, 2 * c + 1), 1), 4));
      }
      use(sub(mul(to_f(lo), d0), n0), 64 * c + l, 0);
      use(sub(mul(to_f(hi), d1), n1), 64 * c + 32 + l, 1);
    }
  }
}

template <class Use>
inline void visit_q6_k(const uint8_t* b, Use&& use) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(b + 208);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b + 64 * half;
    const uint8_t* qh = b + 128 + 32 * half;
    const int8_t* s = sc + 8 * half;
    for (int l = 0; l < 32; l += kLanes) {
      const int g = l / 16;  // runs never straddle a 16-value sub-block (kLanes <= 16)
      const vi a = load_u8(ql + l), c = load_u8(ql + 32 + l), h = load_u8(qh + l);
      const vi q1 = isub(ior(iand(a, 0xF), isll(iand(h, 3), 4)), 32);
      const vi q2 = isub(ior(iand(c, 0xF), isll(iand(isrl(h, 2), 3), 4)), 32);
      const vi q3 = isub(ior(isrl(a, 4), isll(iand(isrl(h, 4), 3), 4)), 32);
      const vi q4 = isub(ior(isrl(c, 4), isll(isrl(h, 6), 4)), 32);
      const int base = 128 * half + l;
      use(mul(to_f(q1), set1(d * static_cast<float>(s[g]))), base, 0);
      use(mul(to_f(q2), set1(d * static_cast<float>(s[g + 2]))), base + 32, 1);
      use(mul(to_f(q3), set1(d * static_cast<float>(s[g + 4]))), base + 64, 0);
      use(mul(to_f(q4), set1(d * static_cast<float>(s[g + 6]))), base + 96, 1);
    }
  }
}

template <class Use>
inline void visit_f32(const uint8_t* b, Use&& use) {
  float v[32];
  std::memcpy(v, b, sizeof v);  // the row's bytes carry no alignment promise
  for (int l = 0; l < 32; l += 2 * kLanes) {
    use(load(v + l), l, 0);
    use(load(v + l + kLanes), l + kLanes, 1);
  }
}

template <int T, class Use>
inline void visit(const uint8_t* b, Use&& use) {
  if constexpr (T == F32) visit_f32(b, use);
  else if constexpr (T == Q8_0) visit_q8_0(b, use);
  else if constexpr (T == Q4_K || T == Q5_K) visit_k4<T>(b, use);
  else if constexpr (T == Q6_K) visit_q6_k(b, use);
  else visit_legacy<T>(b, use);
}

// Calls f(std::integral_constant<int, T>{}) for the run-time `type` (one of the eight block types).
template <class F>
inline void with_type(int type, F&& f) {
  switch (type) {
    case F32: f(std::integral_constant<int, F32>{}); break;
    case Q4_0: f(std::integral_constant<int, Q4_0>{}); break;
    case Q4_1: f(std::integral_constant<int, Q4_1>{}); break;
    case Q5_0: f(std::integral_constant<int, Q5_0>{}); break;
    case Q5_1: f(std::integral_constant<int, Q5_1>{}); break;
    case Q8_0: f(std::integral_constant<int, Q8_0>{}); break;
    case Q4_K: f(std::integral_constant<int, Q4_K>{}); break;
    case Q5_K: f(std::integral_constant<int, Q5_K>{}); break;
    default: f(std::integral_constant<int, Q6_K>{}); break;
  }
}

inline void q6_k_bytes(const uint8_t* b, int8_t* q);

// Values [k0, k0 + len) of one weight row (k0 and len whole blocks) -> y [len]. Q6_K assembles each block's
// values as bytes first (`q6_k_bytes`), the same values and products as `visit_q6_k`.
template <int T>
inline void decode_run(const uint8_t* row, int64_t k0, int64_t len, float* y) {
  for (int64_t i = 0; i < len / kElems<T>; ++i) {
    float* yb = y + i * kElems<T>;
    const uint8_t* b = row + (k0 / kElems<T> + i) * kBytes<T>;
    if constexpr (T == Q6_K) {
      alignas(64) int8_t q[256];
      q6_k_bytes(b, q);
      const float d = half_to_float(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int v = 0; v < 256; v += kLanes) store(yb + v, mul(to_f(load_i8(q + v)), set1(d * static_cast<float>(sc[v / 16]))));
    } else {
      visit<T>(b, [&](vf w, int off, int) { store(yb + off, w); });
    }
  }
}

// out[m * ldo] = sum_k x[m, k] w[k] for M (1-4) input rows and one weight row, decoded in registers.
template <int T, int M>
inline void dot_row(const uint8_t* row, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo) {
  vf acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = zero();
  for (int64_t i = 0; i < K / kElems<T>; ++i) {
    const float* xb = x + i * kElems<T>;
    visit<T>(row + i * kBytes<T>, [&](vf w, int off, int a) {
      for (int m = 0; m < M; ++m) acc[m][a] = fmadd(w, load(xb + m * ldx + off), acc[m][a]);
    });
  }
  for (int m = 0; m < M; ++m) out[m * ldo] = reduce(add(acc[m][0], acc[m][1]));
}

// Asks for the cache lines [p, p + bytes) of weight blocks a few rows ahead: prefetch instructions never fault,
// so p may run past the weight's end. Streaming the weights from DRAM at one input row, the hardware prefetcher
// alone leaves the kernels waiting on memory (measured 2.2x slower on Q6_K, 1.4x on Q4_K, AMD EPYC Zen 4).
inline void prefetch(const uint8_t* p, int bytes) {
  for (int o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + o, _MM_HINT_T0);
}

// dot_row for two weight rows at once (row and row + row_bytes): the input rows are loaded once for both,
// and four independent accumulator chains per input row hide the FMA latency at one row. Each block asks for
// the block `ahead` bytes further on in both rows (0: none; `tiny_tile` passes two rows' bytes).
template <int T, int M>
inline void dot_row2(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo,
                     int64_t ahead = 0) {
  vf acc[M][2][2];
  for (int m = 0; m < M; ++m) acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = zero();
  for (int64_t i = 0; i < K / kElems<T>; ++i) {
    const float* xb = x + i * kElems<T>;
    if (ahead) prefetch(row + ahead + i * kBytes<T>, kBytes<T>), prefetch(row + row_bytes + ahead + i * kBytes<T>, kBytes<T>);
    vf w0[kElems<T> / kLanes];
    visit<T>(row + i * kBytes<T>, [&](vf w, int off, int) { w0[off / kLanes] = w; });
    visit<T>(row + row_bytes + i * kBytes<T>, [&](vf w, int off, int a) {
      for (int m = 0; m < M; ++m) {
        const vf xv = load(xb + m * ldx + off);
        acc[m][0][a] = fmadd(w0[off / kLanes], xv, acc[m][0][a]);
        acc[m][1][a] = fmadd(w, xv, acc[m][1][a]);
      }
    });
  }
  for (int m = 0; m < M; ++m) {
    out[m * ldo] = reduce(add(acc[m][0][0], acc[m][0][1]));
    out[m * ldo + 1] = reduce(add(acc[m][1][0], acc[m][1][1]));
  }
}

// Sums of each 32-value run of the input rows: xs [M, K / 32] from x [M, K] (row stride ldx).
inline void run_sums(const float* x, int64_t M, int64_t K, int64_t ldx, float* xs) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t r = 0; r < K / 32; ++r) {
      vf s = zero();
      for (int l = 0; l < 32; l += kLanes) s = add(s, load(x + m * ldx + 32 * r + l));
      xs[m * (K / 32) + r] = reduce(s);
    }
}

// The 8 sub-block scales and mins of a Q4_K/Q5_K block (its 12 scale bytes at s, the 6-bit fields of
// `k_scale_min` unpacked four at a time from 32-bit words) times d and dmin: dsc[j] = d * sc_j, dmn[j] = dmin * m_j,
// the same float32 products as the decoders'. dsc and dmn: 8 floats each, 32-byte aligned.
inline void k_scales(const uint8_t* s, float d, float dmin, float* dsc, float* dmn) {
  uint32_t u[4];
  std::memcpy(u, s, 12);
  const uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
  u[3] = ((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4);  // m_4..m_7
  const uint32_t m_low = u[1] & six;                             // m_0..m_3
  u[1] = (u[2] & four) | (((u[0] >> 6) & two) << 4);          // sc_4..sc_7
  u[2] = m_low;
  u[0] &= six;                                                  // sc_0..sc_3
#if defined(__AVX2__)
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
  _mm256_store_ps(dsc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))));
  _mm256_store_ps(dmn, _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)))));
#else
  uint8_t b[16];
  std::memcpy(b, u, 16);
  for (int j = 0; j < 8; ++j) dsc[j] = d * static_cast<float>(b[j]);
  for (int j = 0; j < 8; ++j) dmn[j] = dmin * static_cast<float>(b[8 + j]);
#endif
}

// One Q4_K block (256 values) against M input rows: acc[m][0|1] += d_s * sum x q over the even|odd sub-blocks,
// mins[m][s] += n_s * xs[m, s] (the sub-block sums of x, `run_sums`) for the 8 sub-blocks s.
template <int M>
inline void q4_k_block(const uint8_t* b, const float* x, int64_t ldx, const float* xs, int64_t runs, vf (&acc)[M][2],
                       float (*mins)[8]) {
  alignas(32) float dsc[8], dmn[8];
  k_scales(b + 4, half_to_float(b), half_to_float(b + 2), dsc, dmn);
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    vf s0[M], s1[M];
    for (int m = 0; m < M; ++m) s0[m] = s1[m] = zero();
    for (int l = 0; l < 32; l += kLanes) {
      const vi bytes = load_u8(qs + 32 * c + l);
      const vf lo = to_f(iand(bytes, 0xF)), hi = to_f(isrl(bytes, 4));
      for (int m = 0; m < M; ++m) {
        const float* xm = x + m * ldx + 64 * c + l;
        s0[m] = fmadd(lo, load(xm), s0[m]);
        s1[m] = fmadd(hi, load(xm + 32), s1[m]);
      }
    }
    for (int m = 0; m < M; ++m) {
      acc[m][0] = fmadd(s0[m], set1(dsc[2 * c]), acc[m][0]);
      acc[m][1] = fmadd(s1[m], set1(dsc[2 * c + 1]), acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    const float* xm = xs + m * runs;
#if defined(__AVX2__)
    _mm256_store_ps(mins[m], _mm256_add_ps(_mm256_load_ps(mins[m]), _mm256_mul_ps(_mm256_load_ps(dmn), _mm256_loadu_ps(xm))));
#else
    for (int j = 0; j < 8; ++j) mins[m][j] += dmn[j] * xm[j];
#endif
  }
}

// dot_row2 for Q4_K with the scales applied per 32-value sub-block: sum_k x_k (d_s q_k - n_s)
// = d_s * sum_k x_k q_k - n_s * sum_k x_k, the second sum taken from xs (`run_sums`). Two multiplies per
// kLanes values fewer than decoding each weight; the result is the same sum up to float32 rounding. Every
// accumulator is a named register (an index known only at run time would keep it in memory, a store and a
// reload on each update: measured 1.35x slower).
template <int M>
inline void dot_row2_q4_k(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, const float* xs,
                          float* out, int64_t ldo, int64_t ahead = 0) {
  vf a0[M][2], a1[M][2];
  alignas(32) float n0[M][8] = {}, n1[M][8] = {};
  for (int m = 0; m < M; ++m) a0[m][0] = a0[m][1] = a1[m][0] = a1[m][1] = zero();
  const int64_t runs = K / 32;
  const uint8_t* row1 = row + row_bytes;
  for (int64_t i = 0; i < K / 256; ++i) {
    if (ahead) prefetch(row + ahead + i * 144, 144), prefetch(row1 + ahead + i * 144, 144);
    q4_k_block<M>(row + i * 144, x + 256 * i, ldx, xs + 8 * i, runs, a0, n0);
    q4_k_block<M>(row1 + i * 144, x + 256 * i, ldx, xs + 8 * i, runs, a1, n1);
  }
  for (int m = 0; m < M; ++m) {
    float m0 = 0.f, m1 = 0.f;
    for (int j = 0; j < 8; ++j) m0 += n0[m][j], m1 += n1[m][j];
    out[m * ldo] = reduce(add(a0[m][0], a0[m][1])) - m0;
    out[m * ldo + 1] = reduce(add(a1[m][0], a1[m][1])) - m1;
  }
}

// The 256 values of a Q6_K block as int8 q - 32 in value order -> q [256] (32-byte aligned): with AVX2, 32
// values per instruction on bytes (the 6-bit values assembled with 16-bit shifts and byte masks) instead of
// one 32-bit lane each.
inline void q6_k_bytes(const uint8_t* b, int8_t* q) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b + 64 * half;
    const uint8_t* qh = b + 128 + 32 * half;
    int8_t* o = q + 128 * half;
#if defined(__AVX2__)
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    const __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
    const __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
    const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4), _mm256_and_si256(h, bits45));
    const __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), low4), _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o), _mm256_sub_epi8(q1, off));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o + 32), _mm256_sub_epi8(q2, off));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o + 64), _mm256_sub_epi8(q3, off));
    _mm256_store_si256(reinterpret_cast<__m256i*>(o + 96), _mm256_sub_epi8(q4, off));
#else
    for (int l = 0; l < 32; ++l) {
      o[l] = static_cast<int8_t>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
      o[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      o[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      o[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
#endif
  }
}

// dot_row2 for Q6_K: each block's values assembled as bytes (`q6_k_bytes`), then decoded to the exact weights
// (d * sc_s) * (q - 32) a vector at a time and met with the input rows; 1.3-1.5x the generic dot_row2.
template <int M>
inline void dot_row2_q6_k(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out,
                          int64_t ldo, int64_t ahead = 0) {
  vf acc[M][2][2];
  for (int m = 0; m < M; ++m) acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = zero();
  alignas(64) int8_t q0[256], q1[256];
  alignas(64) float s0[16], s1[16];
  const uint8_t* row1 = row + row_bytes;
  for (int64_t i = 0; i < K / 256; ++i) {
    const uint8_t* b0 = row + i * 210;
    const uint8_t* b1 = row1 + i * 210;
    if (ahead) prefetch(b0 + ahead, 210), prefetch(b1 + ahead, 210);
    q6_k_bytes(b0, q0);
    q6_k_bytes(b1, q1);
    const vf d0 = set1(half_to_float(b0 + 208)), d1 = set1(half_to_float(b1 + 208));
    for (int j = 0; j < 16; j += kLanes) {
      store(s0 + j, mul(d0, to_f(load_i8(reinterpret_cast<const int8_t*>(b0 + 192 + j)))));
      store(s1 + j, mul(d1, to_f(load_i8(reinterpret_cast<const int8_t*>(b1 + 192 + j)))));
    }
    const float* xb = x + 256 * i;
    for (int v = 0; v < 256; v += 2 * kLanes) {  // two runs per pass, so that both accumulators are named
      const vf w0 = mul(to_f(load_i8(q0 + v)), set1(s0[v / 16]));
      const vf w1 = mul(to_f(load_i8(q1 + v)), set1(s1[v / 16]));
      const vf w2 = mul(to_f(load_i8(q0 + v + kLanes)), set1(s0[(v + kLanes) / 16]));
      const vf w3 = mul(to_f(load_i8(q1 + v + kLanes)), set1(s1[(v + kLanes) / 16]));
      for (int m = 0; m < M; ++m) {
        const vf xv = load(xb + m * ldx + v), xw = load(xb + m * ldx + v + kLanes);
        acc[m][0][0] = fmadd(w0, xv, acc[m][0][0]);
        acc[m][1][0] = fmadd(w1, xv, acc[m][1][0]);
        acc[m][0][1] = fmadd(w2, xw, acc[m][0][1]);
        acc[m][1][1] = fmadd(w3, xw, acc[m][1][1]);
      }
    }
  }
  for (int m = 0; m < M; ++m) {
    out[m * ldo] = reduce(add(acc[m][0][0], acc[m][0][1]));
    out[m * ldo + 1] = reduce(add(acc[m][1][0], acc[m][1][1]));
  }
}

// Q5_0 in the AVX2 build assembles a block's values as bytes (`q5_0_bytes`): 1.36x its per-lane bit insertion
// (`or16_where`, five instructions a vector without AVX-512's masks); the AVX-512 build keeps the masked OR
// (1.05x the bytes there). Measured on one core of an AMD EPYC (Zen 4).
#if defined(__AVX2__) && !defined(__AVX512F__)
constexpr bool kQ5Bytes = true;
#else
constexpr bool kQ5Bytes = false;
#endif
// The 32 values of a Q5_0 block as int8 q - 16 -> q [32] (32-byte aligned): the 32 high bits spread to bytes
// (each byte picks its bit from a broadcast of qh, then a compare), then joined with the nibbles, 32 per instruction.
inline void q5_0_bytes(const uint8_t* b, int8_t* q) {
#if defined(__AVX2__)
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const __m256i pick = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  __m256i h = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), pick);
  h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(0x10));
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 6));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low4), _mm_and_si128(qs, low4));
  _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_sub_epi8(_mm256_or_si256(nib, h), _mm256_set1_epi8(16)));
#else
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16);
    q[j + 16] = static_cast<int8_t>(((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
  }
#endif
}

// dot_row2 for the 32-value types with one scale a block (Q4_0, Q5_0, Q8_0): per block d * sum_k x_k q_k, the
// integer values met with x before the scale (one multiply a block instead of one per value): 1.1x
// on Q5_0, 1.12x on Q8_0 against the generic dot_row2 (AMD EPYC Zen 4, one thread).
template <int T, int M>
inline void dot_row2_legacy(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out,
                            int64_t ldo, int64_t ahead = 0) {
  static_assert(T == Q4_0 || T == Q5_0 || T == Q8_0, "one scale a block, no min");
  constexpr int B = kBytes<T>;
  vf acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = zero();
  const uint8_t* row1 = row + row_bytes;
  for (int64_t i = 0; i < K / 32; ++i) {
    const uint8_t* b[2] = {row + i * B, row1 + i * B};
    if (ahead && (i & 1) == 0) prefetch(b[0] + ahead, 2 * B), prefetch(b[1] + ahead, 2 * B);
    const float* xb = x + 32 * i;
    vf s[M][2];
    for (int m = 0; m < M; ++m) s[m][0] = s[m][1] = zero();
    for (int r = 0; r < 2; ++r) {  // unrolled: r is a constant in each copy
      if constexpr (T == Q5_0 && kQ5Bytes) {
        alignas(32) int8_t q[32];
        q5_0_bytes(b[r], q);
        for (int l = 0; l < 32; l += kLanes) {
          const vf w = to_f(load_i8(q + l));
          for (int m = 0; m < M; ++m) s[m][r] = fmadd(w, load(xb + m * ldx + l), s[m][r]);
        }
        continue;
      }
      for (int l = 0; l < (T == Q8_0 ? 32 : 16); l += kLanes) {
        vf w0, w1;
        if constexpr (T == Q8_0) {
          w0 = to_f(load_i8(reinterpret_cast<const int8_t*>(b[r] + 2 + l)));
          for (int m = 0; m < M; ++m) s[m][r] = fmadd(w0, load(xb + m * ldx + l), s[m][r]);
        } else {
          const uint8_t* qs = b[r] + (T == Q5_0 ? 6 : 2);
          const vi bytes = load_u8(qs + l);
          vi lo = iand(bytes, 0xF), hi = isrl(bytes, 4);
          if constexpr (T == Q5_0) {
            uint32_t qh;
            std::memcpy(&qh, b[r] + 2, 4);
            lo = or16_where(lo, qh >> l), hi = or16_where(hi, qh >> (l + 16));
          }
          constexpr int zero_point = T == Q4_0 ? 8 : 16;
          w0 = to_f(isub(lo, zero_point)), w1 = to_f(isub(hi, zero_point));
          for (int m = 0; m < M; ++m) {
            s[m][r] = fmadd(w0, load(xb + m * ldx + l), s[m][r]);
            s[m][r] = fmadd(w1, load(xb + m * ldx + l + 16), s[m][r]);
          }
        }
      }
    }
    const vf d0 = set1(half_to_float(b[0])), d1 = set1(half_to_float(b[1]));
    for (int m = 0; m < M; ++m) acc[m][0] = fmadd(s[m][0], d0, acc[m][0]), acc[m][1] = fmadd(s[m][1], d1, acc[m][1]);
  }
  for (int m = 0; m < M; ++m) out[m * ldo] = reduce(acc[m][0]), out[m * ldo + 1] = reduce(acc[m][1]);
}

}  // namespace link_gguf
