// A whole decode step of a Llama-family model in one C++ call, float32 activations.
//
// At batch 1 the eager PyTorch step of SmolLM2-135M spends about as long in its 80-odd small ops per
// layer (dispatch, the paged-cache write, the attention's gathers, the norms, the rotary embedding) as
// in its matmuls. Here each layer is: RMSNorm, the fused QKV projection, the rotary embedding (half-split
// layout), the K/V write into the paged cache, attention of each query over its sequence's cached keys
// through the block table (scores, a softmax in float32 with the max subtracted, the weighted sum of
// values), the output projection and residual, RMSNorm, the fused gate/up projection, SiLU(gate) * up,
// the down projection and residual; then the final RMSNorm. The projections are the tiles of `tiles.h`
// over the intra-op threads (at::parallel_for), attention one task per (sequence, head).
//
// Weights: each projection is float32, or the Q4_1- / Q8_0-style blocks of `tiles.h` when its float
// weight is exactly such blocks (a model dequantized from a GGUF file: `kernels/native_step.py` packs a
// weight only if the blocks reproduce it to float32 rounding). Then the step reads 6 (Q4_1) or 9 (Q8_0)
// bits a weight (codes and float32 block scales) instead of 32 and computes with the same weights as the
// float step. Up to 4 rows a quantized projection runs on its blocks; from 5 rows each tile's weight rows
// are dequantized to float32 first, so a row's result there depends on whether its batch has 4 rows or more.
// ATen's tensor, the ops used and pybind11 (with its tensor casters), not <torch/extension.h>: that is the whole
// C++ frontend, and compiling it was most of a cold build (kernels/native/__init__.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <vector>

#include "tiles.h"

namespace {

using namespace link_native;

enum class Kind { kFloat, kQ4, kQ8 };

struct Projection {
  Kind kind = Kind::kFloat;
  int64_t N = 0, K = 0;
  at::Tensor w, q, d, m;  // float: w [N, K]; q4: q [N, K / 2] uint8, d, m [N, K / 32]; q8: q [N, K] int8, d

  static Projection from_float(const at::Tensor& w) {
    TORCH_CHECK_VALUE(w.dim() == 2 && w.scalar_type() == at::kFloat, "a float projection is float32 [N, K], got ",
                      w.scalar_type(), " ", w.sizes());
    Projection p;
    p.w = w.contiguous();
    p.N = w.size(0), p.K = w.size(1);
    return p;
  }

  static Projection from_q4(const at::Tensor& q, const at::Tensor& d, const at::Tensor& m) {
    TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kByte, "q4 codes are uint8 [N, K / 2], got ",
                      q.scalar_type(), " ", q.sizes());
    Projection p;
    p.kind = Kind::kQ4;
    p.N = q.size(0), p.K = q.size(1) * 2;
    TORCH_CHECK_VALUE(p.K % kBlock == 0, "q4 needs K a multiple of 32, got ", p.K);
    check_scales(d, p.N, p.K, "d");
    check_scales(m, p.N, p.K, "m");
    p.q = q.contiguous(), p.d = d.contiguous(), p.m = m.contiguous();
    return p;
  }

  static Projection from_q8(const at::Tensor& q, const at::Tensor& d) {
    TORCH_CHECK_VALUE(q.dim() == 2 && q.scalar_type() == at::kChar, "q8 codes are int8 [N, K], got ",
                      q.scalar_type(), " ", q.sizes());
    Projection p;
    p.kind = Kind::kQ8;
    p.N = q.size(0), p.K = q.size(1);
    TORCH_CHECK_VALUE(p.K % kBlock == 0, "q8 needs K a multiple of 32, got ", p.K);
    check_scales(d, p.N, p.K, "d");
    p.q = q.contiguous(), p.d = d.contiguous();
    return p;
  }

  static void check_scales(const at::Tensor& s, int64_t N, int64_t K, const char* name) {
    TORCH_CHECK_VALUE(s.scalar_type() == at::kFloat && s.dim() == 2 && s.size(0) == N && s.size(1) == K / kBlock,
                      "block ", name, " must be float32 [", N, ", ", K / kBlock, "], got ", s.scalar_type(), " ", s.sizes());
  }

  std::string kind_name() const { return kind == Kind::kFloat ? "float" : kind == Kind::kQ4 ? "q4" : "q8"; }
};

template <int NT>
inline void tile(const Projection& p, int rows, const float* x, const float* xs, float* out, int64_t ldo, int64_t n) {
#define LINK_TILE_ROWS(M)                                                                                      \
  if (p.kind == Kind::kFloat) float_tile<M, NT>(x, p.K, p.w.data_ptr<float>(), out, ldo, n);                   \
  else if (p.kind == Kind::kQ4)                                                                                 \
    q4_tile<M, NT>(x, xs, p.K, p.q.data_ptr<uint8_t>(), p.d.data_ptr<float>(), p.m.data_ptr<float>(), out, ldo, n); \
  else q8_tile<M, NT>(x, p.K, p.q.data_ptr<int8_t>(), p.d.data_ptr<float>(), out, ldo, n);
  switch (rows) {
    case 1: { LINK_TILE_ROWS(1) break; }
    case 2: { LINK_TILE_ROWS(2) break; }
    case 3: { LINK_TILE_ROWS(3) break; }
    default: { LINK_TILE_ROWS(4) break; }
  }
#undef LINK_TILE_ROWS
}

// out [M, N] = x [M, K] @ w^T, over the intra-op threads. A q4/q8 weight meets up to 4 rows in its own
// tiles; with more rows each tile's weight rows are dequantized once into float32 and meet every group
// of rows from there (dequantizing per group of 4 made 16 rows slower than the float32 weight).
void project(const Projection& p, const float* x, int64_t M, float* out) {
  const int64_t N = p.N, K = p.K, nb = K / kBlock;
  std::vector<float> xs;
  const bool dequantize = p.kind != Kind::kFloat && M > kGroup;
  if (p.kind == Kind::kQ4 && !dequantize) {  // per-block sums of x for the q4 offsets
    xs.resize(M * nb);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < nb; ++b) xs[r * nb + b] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_loadu_ps(x + r * K + b * kBlock), _mm512_loadu_ps(x + r * K + b * kBlock + 16)));
  }
  const int nt = p.kind == Kind::kFloat || dequantize ? 4 : 2;  // weight rows per tile (q4/q8 need registers to dequantize)
  const int64_t full = N / nt;
  at::parallel_for(0, full + 1, 8, [&](int64_t t0, int64_t t1) {
    std::vector<float> rows_buf(dequantize ? nt * K : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * nt, cols = std::min<int64_t>(nt, N - n0);
      if (cols <= 0) continue;
      if (dequantize) {
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t n = n0 + j;
          if (p.kind == Kind::kQ4)
            q4_dequant_row(p.q.data_ptr<uint8_t>() + n * (K / 2), p.d.data_ptr<float>() + n * nb, p.m.data_ptr<float>() + n * nb, K, rows_buf.data() + j * K);
          else
            q8_dequant_row(p.q.data_ptr<int8_t>() + n * K, p.d.data_ptr<float>() + n * nb, K, rows_buf.data() + j * K);
        }
      }
      for (int64_t r0 = 0; r0 < M; r0 += kGroup) {
        const int rows = static_cast<int>(std::min<int64_t>(kGroup, M - r0));
        const float* xr = x + r0 * K;
        float* o = out + r0 * N;
        if (dequantize) {
          if (cols == nt) float_rows<4>(rows, xr, K, rows_buf.data(), o + n0, N, 0);
          else for (int64_t j = 0; j < cols; ++j) float_rows<1>(rows, xr, K, rows_buf.data() + j * K, o + n0 + j, N, 0);
          continue;
        }
        const float* xsr = xs.empty() ? nullptr : xs.data() + r0 * nb;
        if (cols == nt) {
          if (nt == 4) tile<4>(p, rows, xr, xsr, o, N, n0);
          else tile<2>(p, rows, xr, xsr, o, N, n0);
        } else {
          for (int64_t j = n0; j < N; ++j) tile<1>(p, rows, xr, xsr, o, N, j);
        }
      }
    }
  });
}

// y = x * rsqrt(mean(x^2) + eps) * w, per row of E (Llama's RMSNorm, float32).
void rms_norm(const float* x, const float* w, int64_t M, int64_t E, float eps, float* y) {
  for (int64_t r = 0; r < M; ++r) {
    const float* xr = x + r * E;
    float ss = 0.f;
    for (int64_t i = 0; i < E; ++i) ss += xr[i] * xr[i];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(E) + eps);
    for (int64_t i = 0; i < E; ++i) y[r * E + i] = w[i] * (xr[i] * inv);
  }
}

// x [heads, D] <- x * cos + rotate_half(x) * sin, cos/sin [D] (half-split layout).
void rotate(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i + half] + a * sin[i + half];
    }
  }
}

inline float dot(const float* a, const float* b, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= D; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  if (i < D) {
    const __mmask16 mask = tail_mask(D - i);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, a + i), _mm512_maskz_loadu_ps(mask, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

class LlamaDecodeStep {
 public:
  LlamaDecodeStep(std::vector<at::Tensor> norms, std::vector<Projection> projections, int64_t num_heads,
                  int64_t num_kv_heads, int64_t head_dim, double eps, double scale)
      : projections_(std::move(projections)), H_(num_heads), KV_(num_kv_heads), D_(head_dim), eps_(eps), scale_(scale) {
    TORCH_CHECK_VALUE(!projections_.empty() && projections_.size() % 4 == 0,
                      "projections are qkv, o, gate_up, down per layer, got ", projections_.size());
    L_ = static_cast<int64_t>(projections_.size() / 4);
    TORCH_CHECK_VALUE(static_cast<int64_t>(norms.size()) == 2 * L_ + 1,
                      "norms are input and post-attention per layer and the final one: expected ", 2 * L_ + 1, ", got ", norms.size());
    TORCH_CHECK_VALUE(H_ > 0 && KV_ > 0 && H_ % KV_ == 0, "num_heads ", H_, " must be a multiple of num_kv_heads ", KV_);
    TORCH_CHECK_VALUE(D_ % 2 == 0, "head_dim must be even, got ", D_);
    E_ = projections_[0].K;
    F_ = projections_[2].N / 2;
    for (auto& n : norms) {
      TORCH_CHECK_VALUE(n.scalar_type() == at::kFloat && n.dim() == 1 && n.size(0) == E_,
                        "every norm weight must be float32 [", E_, "], got ", n.scalar_type(), " ", n.sizes());
      norms_.push_back(n.contiguous());
    }
    for (int64_t l = 0; l < L_; ++l) {
      const Projection* p = &projections_[4 * l];
      check(p[0], (H_ + 2 * KV_) * D_, E_, l, "qkv");
      check(p[1], E_, H_ * D_, l, "o");
      check(p[2], 2 * F_, E_, l, "gate_up");
      check(p[3], E_, F_, l, "down");
    }
  }

  // One decode step: x [B, E] the new tokens' embeddings, cos/sin [B, D], keys/values per layer
  // [blocks, block_size, KV, D] float32 (written at slot_mapping [B]), block_tables [B, T] and seq_lens [B]
  // int64 (each sequence's length including its new token) -> final hidden states [B, E].
  at::Tensor run(const at::Tensor& x_in, const at::Tensor& cos_in, const at::Tensor& sin_in,
                    const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                    const at::Tensor& slot_mapping_in, const at::Tensor& block_tables_in,
                    const at::Tensor& seq_lens_in) {
    TORCH_CHECK_VALUE(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(1) == E_,
                      "x must be float32 [B, ", E_, "], got ", x_in.scalar_type(), " ", x_in.sizes());
    const int64_t B = x_in.size(0);
    TORCH_CHECK_VALUE(static_cast<int64_t>(keys.size()) == L_ && static_cast<int64_t>(values.size()) == L_,
                      "expected ", L_, " key and value caches, got ", keys.size(), " and ", values.size());
    const at::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
    TORCH_CHECK_VALUE(x_in.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(), "the C++ step runs on the CPU");
    TORCH_CHECK_VALUE(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                      cos.sizes() == sin.sizes() && cos.dim() == 2 && cos.size(0) == B && cos.size(1) == D_,
                      "cos and sin must be float32 [", B, ", ", D_, "]");
    const at::Tensor slots = slot_mapping_in.to(at::kLong).contiguous();
    const at::Tensor tables = block_tables_in.to(at::kLong).contiguous();
    const at::Tensor lens = seq_lens_in.to(at::kLong).contiguous();
    TORCH_CHECK_VALUE(slots.numel() == B && lens.numel() == B && tables.dim() == 2 && tables.size(0) == B,
                      "slot_mapping [B], seq_lens [B] and block_tables [B, T] for B = ", B);
    const int64_t block_size = keys[0].size(1), num_blocks = keys[0].size(0);
    for (int64_t l = 0; l < L_; ++l) {
      for (const auto* c : {&keys[l], &values[l]}) {
        TORCH_CHECK_VALUE(c->scalar_type() == at::kFloat && c->device().is_cpu() && c->is_contiguous() && c->dim() == 4 &&
                          c->size(0) == num_blocks && c->size(1) == block_size && c->size(2) == KV_ && c->size(3) == D_,
                          "layer ", l, "'s cache must be contiguous float32 [", num_blocks, ", ", block_size, ", ", KV_, ", ", D_,
                          "] on the CPU (every layer one pool), got ", c->scalar_type(), " ", c->sizes());
      }
    }
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t* table = tables.data_ptr<int64_t>();
    const int64_t* len = lens.data_ptr<int64_t>();
    const int64_t T = tables.size(1), cache_slots = keys[0].size(0) * block_size;
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(len[b] >= 1 && (len[b] + block_size - 1) / block_size <= T,
                        "sequence ", b, ": length ", len[b], " needs more blocks than its table's ", T);
      TORCH_CHECK_VALUE(slot[b] >= 0 && slot[b] < cache_slots, "sequence ", b, ": slot ", slot[b], " outside the cache");
      for (int64_t i = 0; i < (len[b] + block_size - 1) / block_size; ++i)
        TORCH_CHECK_VALUE(table[b * T + i] >= 0 && table[b * T + i] < num_blocks, "sequence ", b, ": block table entry ", i,
                          " is ", table[b * T + i], ", outside the cache's ", num_blocks, " blocks");
    }

    at::Tensor x = x_in.contiguous().clone();
    float* xp = x.data_ptr<float>();
    const int64_t QKV = (H_ + 2 * KV_) * D_;
    std::vector<float> h(B * E_), qkv(B * QKV), attn(B * H_ * D_), proj(B * E_), gu(B * 2 * F_), act(B * F_);
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    for (int64_t l = 0; l < L_; ++l) {
      const Projection* p = &projections_[4 * l];
      rms_norm(xp, norms_[2 * l].data_ptr<float>(), B, E_, eps_, h.data());
      project(p[0], h.data(), B, qkv.data());
      float* kc = keys[l].data_ptr<float>();
      float* vc = values[l].data_ptr<float>();
      for (int64_t b = 0; b < B; ++b) {  // rotate q and k (adjacent in qkv), write k and v at the slot
        float* row = qkv.data() + b * QKV;
        rotate(row, H_ + KV_, D_, cp + b * D_, sp + b * D_);
        std::copy(row + H_ * D_, row + (H_ + KV_) * D_, kc + slot[b] * KV_ * D_);
        std::copy(row + (H_ + KV_) * D_, row + QKV, vc + slot[b] * KV_ * D_);
      }
      attention(qkv.data(), kc, vc, table, T, len, B, block_size, attn.data());
      project(p[1], attn.data(), B, proj.data());
      for (int64_t i = 0; i < B * E_; ++i) xp[i] += proj[i];
      rms_norm(xp, norms_[2 * l + 1].data_ptr<float>(), B, E_, eps_, h.data());
      project(p[2], h.data(), B, gu.data());
      silu_mul(gu.data(), B, act.data());
      project(p[3], act.data(), B, proj.data());
      for (int64_t i = 0; i < B * E_; ++i) xp[i] += proj[i];
    }
    at::Tensor out = at::empty_like(x);
    rms_norm(xp, norms_[2 * L_].data_ptr<float>(), B, E_, eps_, out.data_ptr<float>());
    return out;
  }

  std::vector<std::string> formats() const {
    std::vector<std::string> out;
    for (const auto& p : projections_) out.push_back(p.kind_name());
    return out;
  }

 private:
  void check(const Projection& p, int64_t N, int64_t K, int64_t layer, const char* name) const {
    TORCH_CHECK_VALUE(p.N == N && p.K == K, "layer ", layer, "'s ", name, " projection is [", p.N, ", ", p.K,
                      "], expected [", N, ", ", K, "]");
  }

  // out [B, H, D]: each query head over its KV group's cached keys and values, positions 0 .. len - 1.
  void attention(const float* qkv, const float* kc, const float* vc, const int64_t* table, int64_t T,
                 const int64_t* len, int64_t B, int64_t block_size, float* out) const {
    const int64_t QKV = (H_ + 2 * KV_) * D_, group = H_ / KV_;
    const float scale = static_cast<float>(scale_);
    at::parallel_for(0, B * H_, 1, [&](int64_t i0, int64_t i1) {
      std::vector<float> scores, acc(D_);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t b = i / H_, head = i % H_, g = head / group, n = len[b];
        const float* q = qkv + b * QKV + head * D_;
        scores.resize(n);
        float mx = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          const int64_t s = table[b * T + t / block_size] * block_size + t % block_size;
          scores[t] = dot(q, kc + (s * KV_ + g) * D_, D_) * scale;
          mx = std::max(mx, scores[t]);
        }
        float total = 0.f;
        int64_t t = 0;
        const __m512 mxv = _mm512_set1_ps(mx);
        __m512 sum = _mm512_setzero_ps();
        for (; t + 16 <= n; t += 16) {
          const __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(scores.data() + t), mxv));
          _mm512_storeu_ps(scores.data() + t, e);
          sum = _mm512_add_ps(sum, e);
        }
        if (t < n) {
          const __mmask16 mask = tail_mask(n - t);
          const __m512 e = _mm512_maskz_mov_ps(mask, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores.data() + t), mxv)));
          _mm512_mask_storeu_ps(scores.data() + t, mask, e);
          sum = _mm512_add_ps(sum, e);
        }
        total = _mm512_reduce_add_ps(sum);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t u = 0; u < n; ++u) {
          const int64_t s = table[b * T + u / block_size] * block_size + u % block_size;
          const float* v = vc + (s * KV_ + g) * D_;
          const float w = scores[u];
          for (int64_t j = 0; j < D_; ++j) acc[j] += w * v[j];
        }
        float* o = out + (b * H_ + head) * D_;
        const float inv = 1.f / total;
        for (int64_t j = 0; j < D_; ++j) o[j] = acc[j] * inv;
      }
    });
  }

  // act [B, F] = silu(gate) * up, gu [B, 2F] = [gate | up].
  void silu_mul(const float* gu, int64_t B, float* act) const {
    for (int64_t b = 0; b < B; ++b) {
      const float* g = gu + b * 2 * F_;
      const float* u = g + F_;
      float* a = act + b * F_;
      int64_t i = 0;
      for (; i + 16 <= F_; i += 16) {
        const __m512 gv = _mm512_loadu_ps(g + i);
        const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_storeu_ps(a + i, _mm512_mul_ps(_mm512_mul_ps(gv, sig), _mm512_loadu_ps(u + i)));
      }
      for (; i < F_; ++i) a[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  }

  std::vector<at::Tensor> norms_;
  std::vector<Projection> projections_;
  int64_t L_ = 0, H_, KV_, D_, E_ = 0, F_ = 0;
  double eps_, scale_;
};

// x [M, K] float32 @ a projection's weight^T -> [M, N].
at::Tensor projection_linear(const Projection& p, const at::Tensor& x_in) {
  TORCH_CHECK_VALUE(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(1) == p.K,
                    "x must be float32 [M, ", p.K, "], got ", x_in.scalar_type(), " ", x_in.sizes());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out = at::empty({x.size(0), p.N}, x.options());
  if (x.size(0) == 0 || p.N == 0) return out;
  if (p.K == 0) return out.zero_();
  project(p, x.data_ptr<float>(), x.size(0), out.data_ptr<float>());
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  py::class_<Projection>(m, "Projection", "one projection's weight: float32, q4 or q8 blocks of 32 (tiles.h)")
      .def_static("float32", &Projection::from_float, py::arg("weight"))
      .def_static("q4", &Projection::from_q4, py::arg("codes"), py::arg("d"), py::arg("m"))
      .def_static("q8", &Projection::from_q8, py::arg("codes"), py::arg("d"))
      .def_property_readonly("kind", &Projection::kind_name)
      .def_property_readonly("shape", [](const Projection& p) { return std::make_tuple(p.N, p.K); })
      .def("__call__", &projection_linear, py::arg("x"), py::call_guard<py::gil_scoped_release>());
  py::class_<LlamaDecodeStep>(m, "LlamaDecodeStep", "a Llama-family decode step in one call (float32 activations)")
      .def(py::init<std::vector<at::Tensor>, std::vector<Projection>, int64_t, int64_t, int64_t, double, double>(),
           py::arg("norms"), py::arg("projections"), py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"),
           py::arg("eps"), py::arg("scale"))
      .def("run", &LlamaDecodeStep::run, py::arg("x"), py::arg("cos"), py::arg("sin"), py::arg("keys"), py::arg("values"),
           py::arg("slot_mapping"), py::arg("block_tables"), py::arg("seq_lens"), py::call_guard<py::gil_scoped_release>())
      .def("formats", &LlamaDecodeStep::formats);
}
