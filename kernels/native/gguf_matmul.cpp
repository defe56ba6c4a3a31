// Linear layers on GGUF quantized weights as the file stores them: y = x W^T with W [N, K] kept as its
// row blocks (`gguf_blocks.h`), never as a float copy. Activations are float32; every weight value used is
// the one ggml's dequantizer gives, so a result differs from dequantize-then-matmul only by the order of
// the float32 additions (|error| <= K * 2^-24 * sum_k |x_k w_k| in the worst case, far less in practice).
//
// Up to 4 input rows (decode at batch 1-4): each weight row is decoded in registers block by block
// (`gguf_simd.h`) and meets every input row there; the weights are read from memory once per call.
// 5 to kGemmRows - 1 rows (larger decode batches): the weight rows go in tiles of kTile; a tile's rows are
// decoded slice by slice (kSlice values along K, whole blocks, into a buffer that stays in L1) and each
// slice meets the input rows 4 at a time in registers (`simd.h` dot_tile).
// Many input rows (prefill): chunks of weight rows (about kChunkBytes, kGemmMinCols rows at least) are decoded and
// multiplied with ATen's GEMM (one chunk per task, chunks spread over the intra-op threads).
//
// Built three times from this source (`kernels/native/__init__.py`): AVX-512F, AVX2 + FMA, and the x86-64
// baseline; `isa()` says which one this module is.
// ATen's tensor, the ops used and pybind11 (with its tensor casters), not <torch/extension.h>: that is the whole
// C++ frontend, and compiling it was most of a cold build (kernels/native/__init__.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "gguf_simd.h"

namespace {

using namespace link_gguf;
using link_simd::dot_rows;

constexpr int kTile = link_simd::kLanes == 16 ? 4 : 2;  // weight rows per tile (registers: 4 x kTile accumulators)
constexpr int64_t kSlice = 1024;                          // values of a row decoded at a time (a multiple of 256)
constexpr int64_t kGemmRows = 32;                         // input rows from which the GEMM path runs
constexpr int64_t kChunkBytes = 512 * 1024;               // decoded weight chunk of one GEMM task (K permitting)
constexpr int64_t kGemmMinCols = 64;                      // weight rows of a GEMM chunk at least

void check_weight(const at::Tensor& blocks, int type, int64_t K, const char* what) {
  const int qk = block_elems(type);
  TORCH_CHECK_VALUE(qk > 0, what, ": ggml type ", type, " is not one of F32, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K");
  TORCH_CHECK_VALUE(K > 0 && K % qk == 0, what, ": K = ", K, " is not a positive multiple of the type's block of ", qk);
  TORCH_CHECK_VALUE(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.device().is_cpu(),
                    what, ": blocks must be uint8 [N, row_bytes] on the CPU, got ", blocks.scalar_type(), " ", blocks.sizes());
  TORCH_CHECK_VALUE(blocks.size(1) == K / qk * block_bytes(type), what, ": a row of K = ", K, " needs ",
                    K / qk * block_bytes(type), " bytes, got ", blocks.size(1));
  TORCH_CHECK_VALUE(blocks.is_contiguous(), what, ": blocks must be contiguous");
}

// Decode values [k0, k0 + len) of `rows` consecutive weight rows into buf [rows, len].
inline void decode_slice(int type, const uint8_t* first_row, int64_t row_bytes, int rows, int64_t k0, int64_t len, float* buf) {
  with_type(type, [&](auto t) {
    for (int j = 0; j < rows; ++j) decode_run<decltype(t)::value>(first_row + j * row_bytes, k0, len, buf + j * len);
  });
}

// f(std::integral_constant<int, M>{}) for the run-time input row count M (1-4).
template <class F>
inline void with_rows(int64_t M, F&& f) {
  switch (M) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{}); break;
  }
}

// out[m, col + j] for up to 4 input rows and `rows` weight rows from `first_row`, decoded in registers, two
// weight rows at a time (the last odd one alone). xs: run_sums of x (used by the Q4_K kernel). Q4_K applies
// its scales per 32-value sub-block (1.1-1.3x at one row, about even at 2-4: one path for every row count
// keeps a row's result independent of its batch), Q6_K assembles its values as bytes first, and the types
// with one scale a block apply it once.
inline void tiny_tile(int type, const uint8_t* first_row, int64_t row_bytes, int64_t rows, const float* x, const float* xs,
                      int64_t M, int64_t K, float* out, int64_t ldo, int64_t col) {
  with_type(type, [&](auto t) {
    constexpr int T = decltype(t)::value;
    const int64_t ahead = 2 * row_bytes;  // prefetch distance: the next pair of rows (measured best of 2, 4, 8 rows)
    with_rows(M, [&](auto m) {
      constexpr int R = decltype(m)::value;
      int64_t j = 0;
      for (; j + 2 <= rows; j += 2) {
        const uint8_t* row = first_row + j * row_bytes;
        float* o = out + col + j;
        if constexpr (T == Q4_K) dot_row2_q4_k<R>(row, row_bytes, K, x, K, xs, o, ldo, ahead);
        else if constexpr (T == Q6_K) dot_row2_q6_k<R>(row, row_bytes, K, x, K, o, ldo, ahead);
        else if constexpr (T == Q4_0 || T == Q5_0 || T == Q8_0) dot_row2_legacy<T, R>(row, row_bytes, K, x, K, o, ldo, ahead);
        else dot_row2<T, R>(row, row_bytes, K, x, K, o, ldo, ahead);
      }
      for (; j < rows; ++j) dot_row<T, R>(first_row + j * row_bytes, K, x, K, out + col + j, ldo);
    });
  });
}

// out[m, col + j] for the NT (or fewer, `rows`) weight rows starting at `first_row`, every input row m < M:
// the rows decoded a slice at a time into buf, each slice meeting the input rows 4 at a time.
template <int NT>
void few_rows_tile(int type, const uint8_t* first_row, int64_t row_bytes, int rows, const float* x, int64_t M, int64_t K,
                   float* out, int64_t ldo, int64_t col, float* buf, float* partial) {
  std::fill(partial, partial + M * NT, 0.f);
  float tmp[4 * NT];
  for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
    const int64_t len = std::min(kSlice, K - k0);
    decode_slice(type, first_row, row_bytes, rows, k0, len, buf);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int group = static_cast<int>(std::min<int64_t>(4, M - m0));
      if (rows == NT) {
        dot_rows<NT>(group, x + m0 * K + k0, K, buf, len, len, tmp, NT);
      } else {
        for (int j = 0; j < rows; ++j) dot_rows<1>(group, x + m0 * K + k0, K, buf + j * len, len, len, tmp + j, NT);
      }
      for (int m = 0; m < group; ++m)
        for (int j = 0; j < rows; ++j) partial[(m0 + m) * NT + j] += tmp[m * NT + j];
    }
  }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < rows; ++j) out[m * ldo + col + j] = partial[m * NT + j];
}

struct Segment {
  int type;
  const uint8_t* data;
  int64_t rows, row_bytes, col;  // col: the segment's first output column
};

std::vector<Segment> segments_of(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types, int64_t K, int64_t& N) {
  TORCH_CHECK_VALUE(!blocks.empty() && blocks.size() == types.size(), "linear needs one ggml type per segment, got ",
                    blocks.size(), " segments and ", types.size(), " types");
  std::vector<Segment> segs;
  N = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    check_weight(blocks[i], static_cast<int>(types[i]), K, "linear");
    segs.push_back({static_cast<int>(types[i]), blocks[i].data_ptr<uint8_t>(), blocks[i].size(0), blocks[i].size(1), N});
    N += blocks[i].size(0);
  }
  return segs;
}

// Work items: (segment, first row, row count) covering every weight row once, `per` rows an item.
std::vector<std::array<int64_t, 3>> split_rows(const std::vector<Segment>& segs, int64_t per) {
  std::vector<std::array<int64_t, 3>> items;
  for (size_t s = 0; s < segs.size(); ++s)
    for (int64_t r = 0; r < segs[s].rows; r += per) items.push_back({static_cast<int64_t>(s), r, std::min(per, segs[s].rows - r)});
  return items;
}

}  // namespace

// x [M, K] float32 @ W^T, W the segments' rows one after another ([sum N_i, K]) -> [M, sum N_i] (+ bias).
at::Tensor linear(const at::Tensor& x_in, const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                     int64_t K, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK_VALUE(x_in.scalar_type() == at::kFloat && x_in.dim() == 2 && x_in.size(1) == K && x_in.device().is_cpu(),
                    "linear needs x float32 [M, ", K, "] on the CPU, got ", x_in.scalar_type(), " ", x_in.sizes());
  int64_t N = 0;
  const std::vector<Segment> segs = segments_of(blocks, types, K, N);
  const at::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M > 0) {
    const float* xp = x.data_ptr<float>();
    float* op = out.data_ptr<float>();
    if (M <= 4) {
      const auto items = split_rows(segs, 16);
      std::vector<float> xs(M * (K / 32));
      link_gguf::run_sums(xp, M, K, K, xs.data());
      // a task of fewer than about 2^18 weights runs on the calling thread (waking the others costs more)
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 18) / (16 * K));
      at::parallel_for(0, static_cast<int64_t>(items.size()), grain, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          const Segment& s = segs[items[i][0]];
          tiny_tile(s.type, s.data + items[i][1] * s.row_bytes, s.row_bytes, items[i][2], xp, xs.data(), M, K, op, N,
                    s.col + items[i][1]);
        }
      });
    } else if (M < kGemmRows) {
      const auto items = split_rows(segs, kTile);
      at::parallel_for(0, static_cast<int64_t>(items.size()), 8, [&](int64_t i0, int64_t i1) {
        std::vector<float> buf(kTile * std::min(kSlice, K)), partial(M * kTile);
        for (int64_t i = i0; i < i1; ++i) {
          const Segment& s = segs[items[i][0]];
          few_rows_tile<kTile>(s.type, s.data + items[i][1] * s.row_bytes, s.row_bytes, static_cast<int>(items[i][2]), xp, M, K,
                               op, N, s.col + items[i][1], buf.data(), partial.data());
        }
      });
    } else {
      // at least kGemmMinCols weight rows a chunk: ATen's GEMM on a narrow chunk is slow (measured on one core
      // of an AMD EPYC, x [512, 8960] against 8 rows: 18 GFLOPS; 64 rows: 77; 128: 87)
      const int64_t per = std::max<int64_t>(kGemmMinCols, std::min<int64_t>(256, kChunkBytes / (4 * K) / 8 * 8));
      const auto items = split_rows(segs, per);
      at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t i0, int64_t i1) {
        c10::InferenceMode no_autograd;  // the worker threads do not inherit the caller's mode
        for (int64_t i = i0; i < i1; ++i) {
          const Segment& s = segs[items[i][0]];
          const int64_t rows = items[i][2];
          at::Tensor w = at::empty({rows, K}, x.options());
          decode_slice(s.type, s.data + items[i][1] * s.row_bytes, s.row_bytes, static_cast<int>(rows), 0, K, w.data_ptr<float>());
          const at::Tensor r = at::mm(x, w.t()).contiguous();  // [M, rows]
          const float* rp = r.data_ptr<float>();
          for (int64_t m = 0; m < M; ++m) std::memcpy(op + m * N + s.col + items[i][1], rp + m * rows, rows * sizeof(float));
        }
      });
    }
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK_VALUE(bias->scalar_type() == at::kFloat && bias->numel() == N, "bias must be float32 [", N, "], got ",
                      bias->scalar_type(), " ", bias->sizes());
    const at::Tensor b = bias->contiguous();
    const float* bp = b.data_ptr<float>();
    float* op = out.data_ptr<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) op[m * N + n] += bp[n];
  }
  return out;
}

// Every value of W: blocks [N, row_bytes] of `type` -> float32 [N, K].
at::Tensor dequantize(const at::Tensor& blocks, int64_t type, int64_t K) {
  check_weight(blocks, static_cast<int>(type), K, "dequantize");
  const int64_t N = blocks.size(0), rb = blocks.size(1);
  at::Tensor out = at::empty({N, K}, at::kFloat);
  const uint8_t* bp = blocks.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    decode_slice(static_cast<int>(type), bp + n0 * rb, rb, static_cast<int>(n1 - n0), 0, K, op + n0 * K);
  });
  return out;
}

// Rows `ids` [T] of W (an embedding lookup) -> float32 [T, K].
at::Tensor rows(const at::Tensor& blocks, int64_t type, int64_t K, const at::Tensor& ids_in) {
  check_weight(blocks, static_cast<int>(type), K, "rows");
  TORCH_CHECK_VALUE(ids_in.dim() == 1 && ids_in.scalar_type() == at::kLong, "ids must be int64 [T], got ",
                    ids_in.scalar_type(), " ", ids_in.sizes());
  const at::Tensor ids = ids_in.contiguous();
  const int64_t N = blocks.size(0), rb = blocks.size(1), T = ids.size(0);
  const int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK_INDEX(ip[t] >= 0 && ip[t] < N, "id ", ip[t], " is out of range for ", N, " rows");
  at::Tensor out = at::empty({T, K}, at::kFloat);
  const uint8_t* bp = blocks.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) decode_slice(static_cast<int>(type), bp + ip[t] * rb, rb, 1, 0, K, op + t * K);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL is released while a kernel runs (only ATen's C++ API inside), as F.linear does
  m.def("linear", &linear, "x [M, K] float32 @ W^T, W given as GGUF row-block segments -> [M, N] (+ bias)",
        pybind11::arg("x"), pybind11::arg("segments"), pybind11::arg("types"), pybind11::arg("K"),
        pybind11::arg("bias") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("dequantize", &dequantize, "GGUF blocks [N, row_bytes] -> float32 [N, K]",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("rows", &rows, "rows `ids` of a GGUF weight -> float32 [T, K]", pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("isa", []() { return std::string(link_simd::kIsa); }, "the instruction set this build uses");
}
