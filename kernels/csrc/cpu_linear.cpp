// Float32 products of a few rows with a matrix that is read once: y = x W^T for x [M, K],
// W [N, K], M small (a decode step: batch x (1 + drafts) rows).
//
// Why: on a CPU a product of a few rows is bound by reading W from memory, not by the
// arithmetic. torch's F.linear (MKL) reads it once for one row but switches to a general
// product from about four rows that costs 1.5-2.4x more; oneDNN's prepacked product costs
// 1.2x more than F.linear at one row. Here W is stored once in blocks of 64 output columns
// ([ceil(N/64), K, 64], zero-padded), each block a contiguous stream: for every k, 4
// AVX-512 vectors of W times a broadcast x[m][k] for up to 6 rows at a time (24
// accumulators), the block prefetched 4 KiB ahead. The rows beyond 6 reread the block from
// L2. Blocks are split over torch's intra-op threads (at::parallel_for).
//
// Built with the paged-attention kernels (kernels/cpu_native.py). Without AVX-512F at build
// time skinny_available() is false and skinny_linear refuses.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>

namespace {

constexpr int64_t kCols = 64;      // output columns per packed block: 4 vectors of 16 floats
constexpr int kRowTile = 6;        // rows per register tile: 6 x 4 accumulators
constexpr int64_t kAhead = 1024;   // floats of the block prefetched ahead (4 KiB)

bool skinny_available() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

at::Tensor skinny_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "skinny_pack: the matrix must be 2-D [N, K]; got ", w.dim(), "-D");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.device().is_cpu(), "skinny_pack: float32 CPU only; got ",
              w.scalar_type(), " on ", w.device());
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t blocks = (n + kCols - 1) / kCols;
  at::Tensor padded = at::zeros({blocks * kCols, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({blocks, kCols, k}).transpose(1, 2).contiguous();
}

#if defined(__AVX512F__)
template <int M>
inline void tile(const float* x, int64_t k_size, const float* w, float* out, int64_t ldo, int64_t cols) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_size; ++k) {
    const float* wk = w + k * kCols;
    _mm_prefetch(reinterpret_cast<const char*>(wk + kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + kAhead + 16), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + kAhead + 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + kAhead + 48), _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(wk), w1 = _mm512_loadu_ps(wk + 16);
    const __m512 w2 = _mm512_loadu_ps(wk + 32), w3 = _mm512_loadu_ps(wk + 48);
    for (int m = 0; m < M; ++m) {
      const __m512 b = _mm512_set1_ps(x[m * k_size + k]);
      acc[m][0] = _mm512_fmadd_ps(b, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(b, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(b, w2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(b, w3, acc[m][3]);
    }
  }
  for (int m = 0; m < M; ++m) {
    for (int v = 0; v < 4; ++v) {
      const int64_t left = cols - v * 16;
      if (left >= 16) {
        _mm512_storeu_ps(out + m * ldo + v * 16, acc[m][v]);
      } else if (left > 0) {
        _mm512_mask_storeu_ps(out + m * ldo + v * 16, static_cast<__mmask16>((1u << left) - 1u), acc[m][v]);
      }
    }
  }
}
#endif

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  TORCH_CHECK(skinny_available(), "skinny_linear: this build has no AVX-512F (skinny_available() is false)");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kCols && packed.is_contiguous(),
              "skinny_linear: packed must be skinny_pack's [ceil(N/64), K, 64] contiguous tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat && x.device().is_cpu() &&
              packed.device().is_cpu(), "skinny_linear: float32 CPU tensors only");
  const int64_t blocks = packed.size(0), k_size = packed.size(1);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == k_size, "skinny_linear: x's last dimension must be K = ", k_size);
  TORCH_CHECK(n > (blocks - 1) * kCols && n <= blocks * kCols, "skinny_linear: n = ", n,
              " does not match the packed matrix's ", blocks, " blocks of ", kCols, " columns");
  const at::Tensor x2 = x.reshape({-1, k_size}).contiguous();
  const int64_t rows = x2.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  at::Tensor out = at::empty({rows, n}, x2.options());
#if defined(__AVX512F__)
  if (rows > 0 && k_size > 0) {
    const float* xp = x2.data_ptr<float>();
    const float* wp = packed.data_ptr<float>();
    float* op = out.data_ptr<float>();
    at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const float* wb = wp + b * k_size * kCols;
        const int64_t cols = std::min<int64_t>(kCols, n - b * kCols);
        for (int64_t m0 = 0; m0 < rows; m0 += kRowTile) {
          const float* xm = xp + m0 * k_size;
          float* om = op + m0 * n + b * kCols;
          switch (std::min<int64_t>(kRowTile, rows - m0)) {
            case 1: tile<1>(xm, k_size, wb, om, n, cols); break;
            case 2: tile<2>(xm, k_size, wb, om, n, cols); break;
            case 3: tile<3>(xm, k_size, wb, om, n, cols); break;
            case 4: tile<4>(xm, k_size, wb, om, n, cols); break;
            case 5: tile<5>(xm, k_size, wb, om, n, cols); break;
            default: tile<6>(xm, k_size, wb, om, n, cols); break;
          }
        }
      }
    });
  } else {
    out.zero_();
  }
#endif
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accel_cpu, m) {
  m.def("skinny_available() -> bool", &skinny_available);
  m.def("skinny_pack(Tensor w) -> Tensor");
  m.def("skinny_linear(Tensor x, Tensor packed, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(accel_cpu, CPU, m) {
  m.impl("skinny_pack", &skinny_pack);
  m.impl("skinny_linear", &skinny_linear);
}
