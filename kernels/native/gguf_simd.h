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

// Values [k0, k0 + len) of one weight row (k0 and len whole blocks) -> y [len].
template <int T>
inline void decode_run(const uint8_t* row, int64_t k0, int64_t len, float* y) {
  for (int64_t i = 0; i < len / kElems<T>; ++i) {
    float* yb = y + i * kElems<T>;
    visit<T>(row + (k0 / kElems<T> + i) * kBytes<T>, [&](vf w, int off, int) { store(yb + off, w); });
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

// dot_row for two weight rows at once (row and row + row_bytes): the input rows are loaded once for both,
// and four independent accumulator chains per input row hide the FMA latency at one row.
template <int T, int M>
inline void dot_row2(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo) {
  vf acc[M][2][2];
  for (int m = 0; m < M; ++m) acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = zero();
  for (int64_t i = 0; i < K / kElems<T>; ++i) {
    const float* xb = x + i * kElems<T>;
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

// dot_row2 for Q4_K with the scales applied per 32-value sub-block: sum_k x_k (d_s q_k - n_s)
// = d_s * sum_k x_k q_k - n_s * sum_k x_k, the second sum taken from xs (`run_sums`). Two multiplies per
// kLanes values fewer than decoding each weight; the result is the same sum up to float32 rounding.
template <int M>
inline void dot_row2_q4_k(const uint8_t* row, int64_t row_bytes, int64_t K, const float* x, int64_t ldx, const float* xs,
                          float* out, int64_t ldo) {
  vf acc[M][2];
  float mins[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = zero(), mins[m][0] = mins[m][1] = 0.f;
  const int64_t runs = K / 32;
  for (int64_t i = 0; i < K / 256; ++i) {
    for (int r = 0; r < 2; ++r) {
      const uint8_t* b = row + r * row_bytes + i * 144;
      const float d = half_to_float(b), dmin = half_to_float(b + 2);
      const uint8_t* qs = b + 16;
      for (int c = 0; c < 4; ++c) {
        int sc0, m0, sc1, m1;
        k_scale_min(2 * c, b + 4, sc0, m0);
        k_scale_min(2 * c + 1, b + 4, sc1, m1);
        vf s0[M], s1[M];
        for (int m = 0; m < M; ++m) s0[m] = s1[m] = zero();
        for (int l = 0; l < 32; l += kLanes) {
          const vi bytes = load_u8(qs + 32 * c + l);
          const vf lo = to_f(iand(bytes, 0xF)), hi = to_f(isrl(bytes, 4));
          for (int m = 0; m < M; ++m) {
            const float* xm = x + m * ldx + 256 * i + 64 * c + l;
            s0[m] = fmadd(lo, load(xm), s0[m]);
            s1[m] = fmadd(hi, load(xm + 32), s1[m]);
          }
        }
        const vf d0 = set1(d * static_cast<float>(sc0)), d1 = set1(d * static_cast<float>(sc1));
        const float n0 = dmin * static_cast<float>(m0), n1 = dmin * static_cast<float>(m1);
        for (int m = 0; m < M; ++m) {
          acc[m][r] = fmadd(s1[m], d1, fmadd(s0[m], d0, acc[m][r]));
          mins[m][r] += n0 * xs[m * runs + 8 * i + 2 * c] + n1 * xs[m * runs + 8 * i + 2 * c + 1];
        }
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < 2; ++r) out[m * ldo + r] = reduce(acc[m][r]) - mins[m][r];
}

}  // namespace link_gguf
