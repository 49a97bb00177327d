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
// bfloat16 matrices (skinny_pack of a bfloat16 W): [ceil(N/64), ceil(K/2), 64, 2], each pair of
// k interleaved per column, multiplied with AVX512-BF16's dot product of pairs (vdpbf16ps) into
// float32 accumulators; x (float32) is rounded to bfloat16 once per call, the result is float32.
// Half the bytes of the float32 layout, for drafts whose weights are bfloat16 anyway.
//
// Built with the paged-attention kernels (kernels/cpu_native.py). Without AVX-512F at build
// time skinny_available() is false and skinny_linear refuses; without AVX512-BF16
// skinny_bf16_available() is false and a bfloat16 matrix is refused.

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

bool skinny_bf16_available() {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor skinny_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2, "skinny_pack: the matrix must be 2-D [N, K]; got ", w.dim(), "-D");
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK((w.scalar_type() == at::kFloat || bf16) && w.device().is_cpu(),
              "skinny_pack: float32 or bfloat16 CPU matrices only; got ", w.scalar_type(), " on ", w.device());
  const int64_t n = w.size(0), k = w.size(1);
  const int64_t blocks = (n + kCols - 1) / kCols;
  if (bf16) {  // [blocks, ceil(K/2), 64, 2]: k padded to even
    const int64_t pairs = (k + 1) / 2;
    at::Tensor padded = at::zeros({blocks * kCols, pairs * 2}, w.options());
    padded.narrow(0, 0, n).narrow(1, 0, k).copy_(w);
    return padded.view({blocks, kCols, pairs, 2}).permute({0, 2, 1, 3}).contiguous();
  }
  at::Tensor padded = at::zeros({blocks * kCols, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({blocks, kCols, k}).transpose(1, 2).contiguous();
}

#if defined(__AVX512F__)
template <int M>
inline void store(__m512 (&acc)[M][4], float* out, int64_t ldo, int64_t cols) {
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
  store<M>(acc, out, ldo, cols);
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
// x: [M][pairs] pairs of bfloat16 as 32-bit words; w: [pairs][64][2] bfloat16
template <int M>
inline void tile_bf16(const uint32_t* x, int64_t pairs, const uint16_t* w, float* out, int64_t ldo, int64_t cols) {
  __m512 acc[M][4];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < 4; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const uint16_t* wp = w + p * 2 * kCols;
    _mm_prefetch(reinterpret_cast<const char*>(wp + 2 * kAhead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + 2 * kAhead + 32), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + 2 * kAhead + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + 2 * kAhead + 96), _MM_HINT_T0);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
    const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wp + 64), w3 = (__m512bh)_mm512_loadu_si512(wp + 96);
    for (int m = 0; m < M; ++m) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[m * pairs + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, b);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, b);
      acc[m][2] = _mm512_dpbf16_ps(acc[m][2], w2, b);
      acc[m][3] = _mm512_dpbf16_ps(acc[m][3], w3, b);
    }
  }
  store<M>(acc, out, ldo, cols);
}
#endif

#if defined(__AVX512F__)
// y = x W^T over every block of columns (split over torch's threads), the rows of x in register
// tiles of up to kRowTile rows; Tile::run<M> multiplies M rows with one block
template <typename Tile, typename X, typename W>
inline void blocks_product(const X* x, int64_t x_stride, int64_t rows, const W* w, int64_t block_stride,
                           int64_t blocks, float* out, int64_t n) {
  at::parallel_for(0, blocks, 4, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const W* wb = w + b * block_stride;
      const int64_t cols = std::min<int64_t>(kCols, n - b * kCols);
      for (int64_t m0 = 0; m0 < rows; m0 += kRowTile) {
        const X* xm = x + m0 * x_stride;
        float* om = out + m0 * n + b * kCols;
        switch (std::min<int64_t>(kRowTile, rows - m0)) {
          case 1: Tile::template run<1>(xm, x_stride, wb, om, n, cols); break;
          case 2: Tile::template run<2>(xm, x_stride, wb, om, n, cols); break;
          case 3: Tile::template run<3>(xm, x_stride, wb, om, n, cols); break;
          case 4: Tile::template run<4>(xm, x_stride, wb, om, n, cols); break;
          case 5: Tile::template run<5>(xm, x_stride, wb, om, n, cols); break;
          default: Tile::template run<6>(xm, x_stride, wb, om, n, cols); break;
        }
      }
    }
  });
}

struct Float32Tile {
  template <int M>
  static void run(const float* x, int64_t k_size, const float* w, float* out, int64_t ldo, int64_t cols) {
    tile<M>(x, k_size, w, out, ldo, cols);
  }
};
#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
struct Bfloat16Tile {
  template <int M>
  static void run(const uint32_t* x, int64_t pairs, const uint16_t* w, float* out, int64_t ldo, int64_t cols) {
    tile_bf16<M>(x, pairs, w, out, ldo, cols);
  }
};
#endif

at::Tensor skinny_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  TORCH_CHECK(skinny_available(), "skinny_linear: this build has no AVX-512F (skinny_available() is false)");
  TORCH_CHECK(!bf16 || skinny_bf16_available(),
              "skinny_linear: a bfloat16 matrix needs AVX512-BF16, which this build lacks (skinny_bf16_available())");
  TORCH_CHECK(packed.dim() == (bf16 ? 4 : 3) && packed.size(2) == kCols && (!bf16 || packed.size(3) == 2) &&
              packed.is_contiguous(), "skinny_linear: packed must be skinny_pack's contiguous tensor ([ceil(N/64), K, "
              "64] float32 or [ceil(N/64), ceil(K/2), 64, 2] bfloat16)");
  TORCH_CHECK(x.scalar_type() == at::kFloat && (packed.scalar_type() == at::kFloat || bf16) && x.device().is_cpu() &&
              packed.device().is_cpu(), "skinny_linear: x must be float32, the matrix float32 or bfloat16, on the CPU");
  TORCH_CHECK(x.dim() >= 1, "skinny_linear: x must have at least one dimension");
  const int64_t blocks = packed.size(0), k_size = x.size(-1);
  TORCH_CHECK((bf16 ? (k_size + 1) / 2 == packed.size(1) : k_size == packed.size(1)),
              "skinny_linear: x's last dimension ", k_size, " does not match the packed matrix's K = ",
              bf16 ? "2 x " : "", packed.size(1));
  TORCH_CHECK(n > (blocks - 1) * kCols && n <= blocks * kCols, "skinny_linear: n = ", n,
              " does not match the packed matrix's ", blocks, " blocks of ", kCols, " columns");
  const at::Tensor x2 = x.reshape({-1, k_size}).contiguous();
  const int64_t rows = x2.size(0);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = n;
  at::Tensor out = at::empty({rows, n}, x2.options());
#if defined(__AVX512F__)
  if (rows > 0 && k_size > 0) {
    float* op = out.data_ptr<float>();
    if (!bf16) {
      const float* xp = x2.data_ptr<float>();
      const float* wp = packed.data_ptr<float>();
      blocks_product<Float32Tile>(xp, k_size, rows, wp, k_size * kCols, blocks, op, n);
    }
#if defined(__AVX512BF16__)
    if (bf16) {
      const int64_t pairs = packed.size(1);
      at::Tensor xb = at::zeros({rows, pairs * 2}, x2.options().dtype(at::kBFloat16));
      xb.narrow(1, 0, k_size).copy_(x2);  // rounded to bfloat16 once
      const uint32_t* xp = reinterpret_cast<const uint32_t*>(xb.data_ptr<at::BFloat16>());
      const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
      blocks_product<Bfloat16Tile>(xp, pairs, rows, wp, pairs * 2 * kCols, blocks, op, n);
    }
#endif
  } else {
    out.zero_();
  }
#endif
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(accel_cpu, m) {
  m.def("skinny_available() -> bool", &skinny_available);
  m.def("skinny_bf16_available() -> bool", &skinny_bf16_available);
  m.def("skinny_pack(Tensor w) -> Tensor");
  m.def("skinny_linear(Tensor x, Tensor packed, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(accel_cpu, CPU, m) {
  m.impl("skinny_pack", &skinny_pack);
  m.impl("skinny_linear", &skinny_linear);
}
