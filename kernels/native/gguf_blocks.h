// Decoding GGUF quantized blocks to float32, one weight row at a time.
//
// A GGUF tensor [N, K] stores each row as K / QK consecutive blocks (QK = 32 for the legacy types, 256 for
// the K-quants); the layouts below are the file format's (ggml's `block_q*` structs, little-endian, fp16
// scales). Every decoder computes each value exactly as ggml's reference dequantizer does (the same float32
// products in the same order), so a decoded row equals `serving/loader/dequant.py`'s bit for bit.
//
//   Q4_0  18 B / 32:  d (fp16), qs[16]                      w = d * (q - 8)
//   Q4_1  20 B / 32:  d, m (fp16), qs[16]                   w = d * q + m
//   Q5_0  22 B / 32:  d, qh[4], qs[16]                      w = d * (q - 16), bit 4 of q from qh
//   Q5_1  24 B / 32:  d, m, qh[4], qs[16]                   w = d * q + m
//   Q8_0  34 B / 32:  d, qs[32] (int8)                      w = d * q
//   Q4_K 144 B / 256: d, dmin (fp16), scales[12], qs[128]   w = (d * sc_j) * q - (dmin * m_j), 8 sub-blocks of 32
//   Q5_K 176 B / 256: d, dmin, scales[12], qh[32], qs[128]  as Q4_K with bit 4 of q from qh
//   Q6_K 210 B / 256: ql[128], qh[64], scales[16] (int8), d w = (d * sc_j) * (q - 32), 16 sub-blocks of 16
//   F32  128 B / 32:  the float32 values (a float weight fused with quantized ones, e.g. q/k/v of mixed types)
// In the legacy types element i < 16 of a block is the low nibble of qs[i] and element i + 16 its high nibble.
// In Q4_K/Q5_K each 32 bytes of qs hold 64 elements: the low nibbles are sub-block 2c, the high ones 2c + 1.
#pragma once

#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace link_gguf {

enum Type : int { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

// IEEE half -> float, exact for every half value (normals, subnormals, infinities, NaN): one instruction
// with F16C (the AVX2 and AVX-512 builds), bit manipulation otherwise.
inline float half_to_float(const uint8_t* p) {
  const uint16_t h = static_cast<uint16_t>(p[0] | (p[1] << 8));
#if defined(__F16C__)
  return _cvtsh_ss(h);
#endif
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while ((mant & 0x400) == 0) { mant <<= 1; --exp; }
    bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Elements and bytes of one block of `type`; 0 elements for a type this file cannot decode.
inline int block_elems(int type) {
  switch (type) {
    case F32: case Q4_0: case Q4_1: case Q5_0: case Q5_1: case Q8_0: return 32;
    case Q4_K: case Q5_K: case Q6_K: return 256;
    default: return 0;
  }
}

inline int block_bytes(int type) {
  switch (type) {
    case F32: return 128;
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
  }
}

// The 6-bit scale and min of sub-block j (0-7) of a Q4_K / Q5_K block from its 12 packed bytes.
inline void k_scale_min(int j, const uint8_t* s, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- one block -> float ---------------------------------------------------------------------------------
// Loops of fixed length over bytes, written for the compiler's vectorizer (-O3 with the ISA's flags).

inline void legacy4(const uint8_t* qs, float d, float m, int zero, float* y) {
  for (int i = 0; i < 16; ++i) y[i] = d * static_cast<float>((qs[i] & 0xF) - zero) + m;
  for (int i = 0; i < 16; ++i) y[i + 16] = d * static_cast<float>((qs[i] >> 4) - zero) + m;
}

inline void legacy5(const uint8_t* qh4, const uint8_t* qs, float d, float m, int zero, float* y) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  for (int i = 0; i < 16; ++i) {
    const int hi = static_cast<int>((qh >> i) & 1u) << 4;
    y[i] = d * static_cast<float>(((qs[i] & 0xF) | hi) - zero) + m;
  }
  for (int i = 0; i < 16; ++i) {
    const int hi = static_cast<int>((qh >> (i + 16)) & 1u) << 4;
    y[i + 16] = d * static_cast<float>(((qs[i] >> 4) | hi) - zero) + m;
  }
}

inline void decode_q4_k(const uint8_t* b, float* y, bool five_bit) {
  const float d = half_to_float(b), dmin = half_to_float(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;                        // Q5_K only
  const uint8_t* qs = five_bit ? b + 48 : b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k_scale_min(2 * c, scales, sc0, m0);
    k_scale_min(2 * c + 1, scales, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), n0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), n1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * c;
    float* y0 = y + 64 * c;
    if (five_bit) {
      const int s0 = 2 * c, s1 = 2 * c + 1;
      for (int l = 0; l < 32; ++l) y0[l] = d0 * static_cast<float>((q[l] & 0xF) | (((qh[l] >> s0) & 1) << 4)) - n0;
      for (int l = 0; l < 32; ++l) y0[32 + l] = d1 * static_cast<float>((q[l] >> 4) | (((qh[l] >> s1) & 1) << 4)) - n1;
    } else {
      for (int l = 0; l < 32; ++l) y0[l] = d0 * static_cast<float>(q[l] & 0xF) - n0;
      for (int l = 0; l < 32; ++l) y0[32 + l] = d1 * static_cast<float>(q[l] >> 4) - n1;
    }
  }
}

inline void decode_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_to_float(b + 208);
  for (int half = 0; half < 2; ++half) {
    float ds[8];
    for (int i = 0; i < 8; ++i) ds[i] = d * static_cast<float>(sc[i]);
    for (int g = 0; g < 2; ++g) {  // l in [16 g, 16 g + 16): scale index g (+2, +4, +6 for the other quarters)
      for (int l = 16 * g; l < 16 * g + 16; ++l) {
        y[l] = ds[g] * static_cast<float>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        y[l + 32] = ds[g + 2] * static_cast<float>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        y[l + 64] = ds[g + 4] * static_cast<float>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        y[l + 96] = ds[g + 6] * static_cast<float>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    y += 128, ql += 64, qh += 32, sc += 8;
  }
}

// One block of `type` at `b` -> its block_elems(type) values at `y`.
inline void decode_block(int type, const uint8_t* b, float* y) {
  switch (type) {
    case Q4_0: legacy4(b + 2, half_to_float(b), 0.f, 8, y); break;
    case Q4_1: legacy4(b + 4, half_to_float(b), half_to_float(b + 2), 0, y); break;
    case Q5_0: legacy5(b + 2, b + 6, half_to_float(b), 0.f, 16, y); break;
    case Q5_1: legacy5(b + 4, b + 8, half_to_float(b), half_to_float(b + 2), 0, y); break;
    case Q8_0: {
      const float d = half_to_float(b);
      const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
      for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q[i]);
      break;
    }
    case F32: std::memcpy(y, b, 128); break;
    case Q4_K: decode_q4_k(b, y, false); break;
    case Q5_K: decode_q4_k(b, y, true); break;
    case Q6_K: decode_q6_k(b, y); break;
    default: break;
  }
}

// One weight row of K values (K a multiple of the type's block) -> y [K].
inline void decode_row(int type, const uint8_t* row, int64_t K, float* y) {
  const int qk = block_elems(type), bb = block_bytes(type);
  for (int64_t i = 0; i < K / qk; ++i) decode_block(type, row + i * bb, y + i * qk);
}

}  // namespace link_gguf
