// Float32 linear layer for a few rows, y = x W^T with W in the checkpoint's [N, K] layout.
//
// A decode batch of 4-16 sequences, or a speculative verify step of k + 1 rows per sequence, is a GEMM
// with a handful of rows. MKL treats it as a general GEMM from 4 rows on and its time per call jumps by
// about half over 3 rows (SmolLM2-135M's layer shapes, weights streamed from memory, 2 threads). Here
// every weight row is read from memory once per call and kept in registers while it meets every input
// row, so the time grows with the rows only by the arithmetic, not by the weight traffic.
//
// Layout of the work: the output columns are split into tiles of 4 weight rows, tiles spread over the
// intra-op threads (at::parallel_for); within a tile, the input rows go in groups of up to 4, each group
// accumulating 4 x 4 dot products in 16 AVX-512 registers over K (16 floats per step, the tail masked),
// then reduced horizontally (`tiles.h`). Each output element is one dot product over K in a fixed order that does not
// depend on how many rows the call has: a row's result is the same alone or in a batch (bit for bit).
// ATen's tensor, the ops used and pybind11 (with its tensor casters), not <torch/extension.h>: that is the whole
// C++ frontend, and compiling it was most of a cold build (kernels/native/__init__.py).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>

#include "tiles.h"

namespace {

using link_native::float_rows;
using link_native::kGroup;
constexpr int kTile = 4;   // weight rows per tile

}  // namespace

// x [M, K] and weight [N, K], float32, contiguous -> [M, N].
at::Tensor rows_linear(const at::Tensor& x_in, const at::Tensor& w_in) {
  TORCH_CHECK(x_in.scalar_type() == at::kFloat && w_in.scalar_type() == at::kFloat,
              "rows_linear is float32 only, got x ", x_in.scalar_type(), " and weight ", w_in.scalar_type());
  TORCH_CHECK(x_in.dim() == 2 && w_in.dim() == 2 && x_in.size(1) == w_in.size(1),
              "rows_linear needs x [M, K] and weight [N, K], got ", x_in.sizes(), " and ", w_in.sizes());
  TORCH_CHECK(x_in.device().is_cpu() && w_in.device().is_cpu(), "rows_linear runs on the CPU");
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return out;
  if (K == 0) return out.zero_();
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t full_tiles = N / kTile;
  at::parallel_for(0, full_tiles + 1, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t * kTile;
      for (int64_t m0 = 0; m0 < M; m0 += kGroup) {
        const int rows = static_cast<int>(std::min<int64_t>(kGroup, M - m0));
        if (t < full_tiles) {
          float_rows<kTile>(rows, xp + m0 * K, K, wp, op + m0 * N, N, n);
        } else {
          for (int64_t j = n; j < N; ++j) float_rows<1>(rows, xp + m0 * K, K, wp, op + m0 * N, N, j);
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // the GIL is released while the kernel runs (only ATen's C++ API inside), as F.linear does
  m.def("rows_linear", &rows_linear, "x [M, K] @ weight[N, K]^T, float32, AVX-512",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
