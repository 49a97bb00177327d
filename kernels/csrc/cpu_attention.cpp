// accel-plugin's native CPU attention: paged attention and the KV-cache write, fused.
//
// Built on first use by kernels/cpu_native.py (torch.utils.cpp_extension, -O3
// -march=native, OpenMP through at::parallel_for) and called as torch.ops.accel_cpu.*.
// Same contracts as kernels/paged_attn.py and kernels/kv_cache.py; the pure-torch
// reference (kernels/reference.py) is the oracle of its tests.
//
// paged_attention reads each sequence's K/V through its block table in place (no gathered
// copy), once per (sequence, kv head, tile of query rows): the query heads of a GQA group
// and the queries of a sequence share every K/V row read. Scores are computed a chunk of
// keys at a time with an online softmax (FlashAttention's rescaling, per chunk, not per
// key), accumulated in fp32 whatever the cache dtype. Rows that see no key get 0.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int kMaxHeadDim = 256;
constexpr int kRows = 16;   // query rows per work item (a GQA group x queries of a sequence)
constexpr int kChunk = 32;  // keys scored before each online-softmax update

// Numbers and shapes enter error messages as strings made here: in an extension built by
// g++ 13.3 against torch 2.11.0+cu130 (an H200 machine's image, 2026-12-04), inserting an
// integer into the message's std::ostream crashed the process (SIGSEGV in
// basic_ostream::_M_insert<long>) instead of raising; inserting strings is safe there.
inline std::string num(int64_t v) { return std::to_string(v); }

inline std::string shape(at::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T>
inline void load_row(const T* __restrict src, float* __restrict dst, int d) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(dst, src, sizeof(float) * d);
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int i = 0; i < d; ++i) {
      uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      dst[i] = f;
    }
  } else {
    for (int i = 0; i < d; ++i) dst[i] = to_float(src[i]);
  }
}

inline float dot(const float* __restrict a, const float* __restrict b, int d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

struct Geometry {
  int64_t q_s0, q_s1, o_s0, o_s1;              // query / output strides (tokens, heads)
  int64_t k_s0, k_s1, k_s2, v_s0, v_s1, v_s2;  // cache strides (blocks, slots, heads)
  int64_t bt_s0;                               // block table row stride
  int block_size, head_dim, group, num_kv_heads;
  float scale, softcap;
  int64_t window_left, window_right;  // -1: unbounded; causal sets window_right to 0
};

// exp(x) for x <= 0 (and -inf -> 0): 2^n * p(r) with a degree-6 polynomial on r in
// [-ln2/2, ln2/2] (Cephes' expf, relative error about 2 ulp); below -87.3, 0.
constexpr float kExpMin = -87.3f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln(2) in two parts: exact n * hi
constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

inline float exp_neg(float x) {
  if (!(x > kExpMin)) return 0.f;
  const float n = std::nearbyint(x * kLog2e);
  const float r = x - n * kLn2Hi - n * kLn2Lo;
  float p = kExpPoly[0];
  for (int i = 1; i < 6; ++i) p = p * r + kExpPoly[i];
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// x[j] = exp_neg(x[j] - shift) for j < n.
inline void exp_shifted(float* __restrict x, int n, float shift) {
  int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 vshift = _mm256_set1_ps(shift), vmin = _mm256_set1_ps(kExpMin);
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_sub_ps(_mm256_loadu_ps(x + j), vshift);
    const __m256 keep = _mm256_cmp_ps(v, vmin, _CMP_GT_OQ);  // false for -inf and NaN-free lows
    v = _mm256_max_ps(v, vmin);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), v);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kExpPoly[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    _mm256_storeu_ps(x + j, _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep));
  }
#endif
  for (; j < n; ++j) x[j] = exp_neg(x[j] - shift);
}

#if defined(__AVX2__) && defined(__FMA__)
inline float hsum(__m256 x) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}
#endif

// s[j] = dot(q, keys[j]) for j < n; eight keys at a time share each load of q (eight
// independent FMA chains).
inline void scores(const float* __restrict q, const float* const* keys, int n, int d, float* __restrict s) {
  int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (d % 8 == 0) {
    for (; j + 8 <= n; j += 8) {
      __m256 a[8];
      for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
      for (int i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys[j + u] + i), a[u]);
      }
      // transpose-and-add: s[j + u] = the sum of a[u]'s eight lanes
      const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
      const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
      const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
      // lo = [s0 s1 s2 s3 | s0' s1' s2' s3'] (halves of the lanes), hi likewise for 4..7
      const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
      _mm256_storeu_ps(s + j, sum);
    }
    for (; j < n; ++j) {
      __m256 a = _mm256_setzero_ps();
      for (int i = 0; i < d; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(keys[j] + i), a);
      s[j] = hsum(a);
    }
  }
#endif
  for (; j < n; ++j) s[j] = dot(q, keys[j], d);
}

// K or V rows of keys [c0, c0 + n) as fp32 row pointers: the cache's own rows for fp32,
// else converted once into buf (shared by every query row of the work item).
template <typename T>
inline void chunk_rows(const T* cache, int64_t s0, int64_t s1, int64_t head_off, const int32_t* block_row,
                       int block_size, int64_t c0, int n, int d, float* buf, const float** rows) {
  int64_t block = c0 / block_size, slot = c0 % block_size;  // one division per chunk, not per key
  const T* base = cache + block_row[block] * s0 + head_off;
  for (int j = 0; j < n; ++j) {
    if (slot == block_size) {
      slot = 0;
      base = cache + block_row[++block] * s0 + head_off;
    }
    const T* src = base + (slot++) * s1;
    if constexpr (std::is_same_v<T, float>) {
      rows[j] = src;
    } else {
      load_row(src, buf + j * d, d);
      rows[j] = buf + j * d;
    }
  }
}

// acc[0, 8 * V) += sum_j p[j] * values[j][0, 8 * V): V independent FMA chains per key.
template <int V>
inline void accumulate_vectors(const float* __restrict p, const float* const* values, int n, int i0,
                               float* __restrict acc) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 a[V];
  for (int v = 0; v < V; ++v) a[v] = _mm256_loadu_ps(acc + i0 + 8 * v);
  for (int j = 0; j < n; ++j) {
    const __m256 pj = _mm256_set1_ps(p[j]);
    const float* row = values[j] + i0;
    for (int v = 0; v < V; ++v) a[v] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(row + 8 * v), a[v]);
  }
  for (int v = 0; v < V; ++v) _mm256_storeu_ps(acc + i0 + 8 * v, a[v]);
#endif
}

// acc += sum_j p[j] * values[j] for j < n, a whole head row's outputs in registers across the keys.
inline void accumulate(const float* __restrict p, const float* const* values, int n, int d, float* __restrict acc) {
  int i0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
  for (; i0 + 64 <= d; i0 += 64) accumulate_vectors<8>(p, values, n, i0, acc);
  if (i0 + 32 <= d) accumulate_vectors<4>(p, values, n, i0, acc), i0 += 32;
  if (i0 + 16 <= d) accumulate_vectors<2>(p, values, n, i0, acc), i0 += 16;
  if (i0 + 8 <= d) accumulate_vectors<1>(p, values, n, i0, acc), i0 += 8;
#endif
  for (; i0 < d; ++i0) {
    float a = acc[i0];
    for (int j = 0; j < n; ++j) a += p[j] * values[j][i0];
    acc[i0] = a;
  }
}

// Ask for the rows of keys [c0, c0 + n) ahead of use: a sequence's rows of one kv head are
// strided through its blocks, which the hardware prefetcher follows poorly.
template <typename T>
inline void prefetch_rows(const T* cache, int64_t s0, int64_t s1, int64_t head_off, const int32_t* block_row,
                          int block_size, int64_t c0, int n, int d) {
  int64_t block = c0 / block_size, slot = c0 % block_size;
  const char* base = reinterpret_cast<const char*>(cache + block_row[block] * s0 + head_off);
  const int64_t bytes = static_cast<int64_t>(d) * sizeof(T), stride = s1 * sizeof(T);
  for (int j = 0; j < n; ++j) {
    if (slot == block_size) {
      slot = 0;
      base = reinterpret_cast<const char*>(cache + block_row[++block] * s0 + head_off);
    }
    const char* row = base + (slot++) * stride;
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off);
  }
}

// One work item: sequence b, kv head h, query rows [r0, r1) of its q_len * group rows
// (row r = query r / group, head h * group + r % group).
template <typename T>
void attend_item(const T* q, T* out, const T* k_cache, const T* v_cache, const int32_t* block_row,
                 int64_t q_start, int64_t q_len, int64_t seq_len, int h, int64_t r0, int64_t r1,
                 const Geometry& g) {
  const int d = g.head_dim;
  const int rows = static_cast<int>(r1 - r0);
  alignas(64) float qf[kRows][kMaxHeadDim];
  alignas(64) float acc[kRows][kMaxHeadDim];
  alignas(64) float kbuf[std::is_same_v<T, float> ? 1 : kChunk * kMaxHeadDim];
  alignas(64) float vbuf[std::is_same_v<T, float> ? 1 : kChunk * kMaxHeadDim];
  const float* krows[kChunk];
  const float* vrows[kChunk];
  alignas(64) float s[kRows][kChunk];
  float m[kRows], l[kRows];
  int64_t lo[kRows], hi[kRows];  // keys [lo, hi) visible to each row
  int64_t lo_all = seq_len, hi_all = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t qi = (r0 + r) / g.group;
    const int head = h * g.group + static_cast<int>((r0 + r) % g.group);
    load_row(q + (q_start + qi) * g.q_s0 + head * g.q_s1, qf[r], d);
    for (int i = 0; i < d; ++i) qf[r][i] *= g.scale;
    std::fill(acc[r], acc[r] + d, 0.f);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.f;
    const int64_t pos = seq_len - q_len + qi;  // the query's position among its keys
    lo[r] = g.window_left >= 0 ? std::max<int64_t>(0, pos - g.window_left) : 0;
    hi[r] = g.window_right >= 0 ? std::min<int64_t>(seq_len, pos + g.window_right + 1) : seq_len;
    if (lo[r] < hi[r]) {
      lo_all = std::min(lo_all, lo[r]);
      hi_all = std::max(hi_all, hi[r]);
    }
  }
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t k_head = h * g.k_s2, v_head = h * g.v_s2;
  for (int64_t c0 = lo_all; c0 < hi_all; c0 += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, hi_all - c0));
    if (c0 + kChunk < hi_all) {
      const int next = static_cast<int>(std::min<int64_t>(kChunk, hi_all - c0 - kChunk));
      prefetch_rows(k_cache, g.k_s0, g.k_s1, k_head, block_row, g.block_size, c0 + kChunk, next, d);
      prefetch_rows(v_cache, g.v_s0, g.v_s1, v_head, block_row, g.block_size, c0 + kChunk, next, d);
    } else if (c0 == lo_all) {
      prefetch_rows(v_cache, g.v_s0, g.v_s1, v_head, block_row, g.block_size, c0, n, d);
    }
    chunk_rows(k_cache, g.k_s0, g.k_s1, k_head, block_row, g.block_size, c0, n, d, kbuf, krows);
    bool any = false;
    for (int r = 0; r < rows; ++r) {
      float* sr = s[r];
      scores(qf[r], krows, n, d, sr);
      if (g.softcap > 0.f) {
        for (int j = 0; j < n; ++j) sr[j] = g.softcap * std::tanh(sr[j] / g.softcap);
      }
      const int64_t a = std::max<int64_t>(lo[r] - c0, 0), b = std::min<int64_t>(hi[r] - c0, n);
      float cmax = neg_inf;
      for (int j = 0; j < n; ++j) {
        if (j < a || j >= b) sr[j] = neg_inf;
        cmax = std::max(cmax, sr[j]);
      }
      if (cmax == neg_inf) {  // no visible key in this chunk: weight 0 for each
        std::fill(sr, sr + n, 0.f);
        continue;
      }
      any = true;
      const float m_new = std::max(m[r], cmax);
      const float rescale = exp_neg(m[r] - m_new);  // 0 on the first chunk (m = -inf)
      if (rescale != 1.f) {
        for (int i = 0; i < d; ++i) acc[r][i] *= rescale;
      }
      exp_shifted(sr, n, m_new);
      float sum = 0.f;
      for (int j = 0; j < n; ++j) sum += sr[j];
      l[r] = l[r] * rescale + sum;
      m[r] = m_new;
    }
    if (!any) continue;
    chunk_rows(v_cache, g.v_s0, g.v_s1, v_head, block_row, g.block_size, c0, n, d, vbuf, vrows);
    for (int r = 0; r < rows; ++r) accumulate(s[r], vrows, n, d, acc[r]);
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t qi = (r0 + r) / g.group;
    const int head = h * g.group + static_cast<int>((r0 + r) % g.group);
    T* o = out + (q_start + qi) * g.o_s0 + head * g.o_s1;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    for (int i = 0; i < d; ++i) o[i] = static_cast<T>(acc[r][i] * inv);
  }
}

template <typename T>
void paged_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, const at::Tensor& block_table,
                const Geometry& g) {
  const int64_t batch = seq_lens.size(0);
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  // Work items: (sequence, kv head, tile of kRows query rows), flattened so the OpenMP
  // threads share them evenly whatever the mix of decode and longer queries.
  std::vector<int64_t> first_item(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t rows = static_cast<int64_t>(cu[b + 1] - cu[b]) * g.group;
    first_item[b + 1] = first_item[b] + g.num_kv_heads * ((rows + kRows - 1) / kRows);
  }
  const int64_t items = first_item[batch];
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    int64_t b = std::upper_bound(first_item.begin(), first_item.end(), begin) - first_item.begin() - 1;
    for (int64_t item = begin; item < end; ++item) {
      while (item >= first_item[b + 1]) ++b;
      const int64_t q_start = cu[b], q_len = cu[b + 1] - cu[b];
      const int64_t tiles = (q_len * g.group + kRows - 1) / kRows;
      const int64_t local = item - first_item[b];
      const int h = static_cast<int>(local / tiles);
      const int64_t r0 = (local % tiles) * kRows;
      const int64_t r1 = std::min<int64_t>(r0 + kRows, q_len * g.group);
      attend_item<T>(qp, op, kp, vp, bt + b * g.bt_s0, q_start, q_len, lens[b], h, r0, r1, g);
    }
  });
}

// Everything the kernel relies on, checked here (O(batch + blocks used), serial) so that a
// caller that skips the Python validation (a framework's per-layer fast path) can never read
// or write outside a tensor: a bad call raises, naming the argument.
void check_paged(const at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, const at::Tensor& block_table) {
  const char* fn = "accel_cpu.paged_attention: ";
  TORCH_CHECK(q.dim() == 3 && out.sizes() == q.sizes(), fn, "q and out must be [total_q, num_heads, head_dim], "
              "the same shape; got ", shape(q.sizes()), " and ", shape(out.sizes()));
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(), fn, "k_cache and v_cache must be "
              "[num_blocks, block_size, num_kv_heads, head_dim], the same shape; got ", shape(k_cache.sizes()),
              " and ", shape(v_cache.sizes()));
  TORCH_CHECK(k_cache.size(3) == q.size(2), fn, "head_dim of the cache (", num(k_cache.size(3)), ") must equal q's (",
              num(q.size(2)), ")");
  TORCH_CHECK(q.size(2) >= 1 && q.size(2) <= kMaxHeadDim, fn, "head_dim must be in [1, ", num(kMaxHeadDim), "]; got ",
              num(q.size(2)));
  TORCH_CHECK(k_cache.size(2) >= 1 && q.size(1) % k_cache.size(2) == 0, fn, "num_heads (", num(q.size(1)),
              ") must be a multiple of num_kv_heads (", num(k_cache.size(2)), ")");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&out, &k_cache, &v_cache}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), fn, "q, out, k_cache and v_cache must share one dtype");
  }
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q, &out, &k_cache, &v_cache, &cu_seqlens_q, &seq_lens, &block_table}) {
    TORCH_CHECK(t->device().is_cpu(), fn, "CPU tensors only");
    TORCH_CHECK(t->dim() == 0 || t->stride(t->dim() - 1) == 1 || t->size(t->dim() - 1) <= 1, fn,
                "every tensor's last dim must be contiguous");
  }
  TORCH_CHECK(cu_seqlens_q.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  block_table.scalar_type() == at::kInt,
              fn, "cu_seqlens_q, seq_lens and block_table must be int32");
  const int64_t batch = seq_lens.numel();
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.is_contiguous() && cu_seqlens_q.dim() == 1 &&
                  cu_seqlens_q.is_contiguous() && cu_seqlens_q.numel() == batch + 1,
              fn, "seq_lens must be [batch] and cu_seqlens_q [batch + 1], contiguous");
  TORCH_CHECK(block_table.dim() == 2 && block_table.size(0) == batch, fn,
              "block_table must be [batch, max_blocks_per_seq]; got ", shape(block_table.sizes()));
  const int32_t* cu = cu_seqlens_q.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* bt = block_table.data_ptr<int32_t>();
  const int64_t bs = k_cache.size(1), num_blocks = k_cache.size(0), width = block_table.size(1);
  TORCH_CHECK(batch == 0 || (cu[0] >= 0 && cu[batch] <= q.size(0)), fn,
              "cu_seqlens_q must start at >= 0 and end at <= q.shape[0]");
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t q_len = static_cast<int64_t>(cu[b + 1]) - cu[b];
    TORCH_CHECK(q_len >= 0, fn, "cu_seqlens_q must be non-decreasing (sequence ", num(b), ")");
    if (q_len == 0) continue;  // skipped: its table row is never read
    TORCH_CHECK(lens[b] >= q_len, fn, "seq_lens[", num(b), "] (", num(lens[b]), ") must be >= its query length (",
                num(q_len), ")");
    const int64_t used = (lens[b] + bs - 1) / bs;
    TORCH_CHECK(used <= width, fn, "seq_lens[", num(b), "] (", num(lens[b]), ") needs ", num(used),
                " blocks; block_table has ", num(width), " per sequence");
    for (int64_t i = 0; i < used; ++i) {
      const int32_t id = bt[b * block_table.stride(0) + i];
      TORCH_CHECK(id >= 0 && id < num_blocks, fn, "block_table[", num(b), ", ", num(i), "] = ", num(id),
                  " is outside [0, num_blocks = ", num(num_blocks), ")");
    }
  }
}

void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, const at::Tensor& block_table,
                     double softmax_scale, double softcap, int64_t window_left, int64_t window_right) {
  check_paged(out, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table);
  Geometry g;
  g.q_s0 = q.stride(0);
  g.q_s1 = q.stride(1);
  g.o_s0 = out.stride(0);
  g.o_s1 = out.stride(1);
  g.k_s0 = k_cache.stride(0);
  g.k_s1 = k_cache.stride(1);
  g.k_s2 = k_cache.stride(2);
  g.v_s0 = v_cache.stride(0);
  g.v_s1 = v_cache.stride(1);
  g.v_s2 = v_cache.stride(2);
  g.bt_s0 = block_table.stride(0);
  g.block_size = static_cast<int>(k_cache.size(1));
  g.num_kv_heads = static_cast<int>(k_cache.size(2));
  g.head_dim = static_cast<int>(q.size(2));
  g.group = static_cast<int>(q.size(1) / k_cache.size(2));
  g.scale = static_cast<float>(softmax_scale);
  g.softcap = static_cast<float>(softcap);
  g.window_left = window_left;
  g.window_right = window_right;
  switch (q.scalar_type()) {
    case at::kFloat: paged_impl<float>(out, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, g); break;
    case at::kBFloat16:
      paged_impl<c10::BFloat16>(out, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, g);
      break;
    case at::kHalf: paged_impl<c10::Half>(out, q, k_cache, v_cache, cu_seqlens_q, seq_lens, block_table, g); break;
    default: TORCH_CHECK(false, "accel_cpu.paged_attention: dtype must be float32, bfloat16 or float16");
  }
}

// k/v [T, Hkv, D] -> caches [blocks, block_size, Hkv, D] at slot_mapping (-1: skip).
void write_kv_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor k_cache, at::Tensor v_cache,
                    const at::Tensor& slot_mapping) {
  const char* fn = "accel_cpu.write_kv_cache: ";
  TORCH_CHECK(k.dim() == 3 && v.sizes() == k.sizes(), fn, "k and v must be [num_tokens, num_kv_heads, head_dim], "
              "the same shape; got ", shape(k.sizes()), " and ", shape(v.sizes()));
  TORCH_CHECK(k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes() && k_cache.size(2) == k.size(1) &&
                  k_cache.size(3) == k.size(2),
              fn, "k_cache and v_cache must be [num_blocks, block_size, ", num(k.size(1)), ", ", num(k.size(2)),
              "]; got ", shape(k_cache.sizes()), " and ", shape(v_cache.sizes()));
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&v, &k_cache, &v_cache}) {
    TORCH_CHECK(t->scalar_type() == k.scalar_type(), fn, "k, v, k_cache and v_cache must share one dtype");
  }
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&k, &v, &k_cache, &v_cache, &slot_mapping}) {
    TORCH_CHECK(t->device().is_cpu(), fn, "CPU tensors only");
    TORCH_CHECK(t->dim() == 0 || t->stride(t->dim() - 1) == 1 || t->size(t->dim() - 1) <= 1, fn,
                "every tensor's last dim must be contiguous");
  }
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.numel() == k.size(0) &&
                  (slot_mapping.scalar_type() == at::kLong || slot_mapping.scalar_type() == at::kInt),
              fn, "slot_mapping must be int64 or int32 [num_tokens = ", num(k.size(0)), "]");
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t capacity = k_cache.size(0) * k_cache.size(1);
  const int64_t* check = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < slots.numel(); ++t) {
    TORCH_CHECK(check[t] >= -1 && check[t] < capacity, fn, "slot_mapping[", num(t), "] = ", num(check[t]),
                " must be -1 (skip) or in [0, num_blocks x block_size = ", num(capacity), ")");
  }
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t tokens = k.size(0), heads = k.size(1), d = k.size(2);
  const int64_t bs = k_cache.size(1);
  const int64_t elem = k.element_size();
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = sp[t];
      if (slot < 0) continue;
      const int64_t block = slot / bs, off = slot % bs;
      for (int64_t h = 0; h < heads; ++h) {
        std::memcpy(kc + (block * k_cache.stride(0) + off * k_cache.stride(1) + h * k_cache.stride(2)) * elem,
                    kp + (t * k.stride(0) + h * k.stride(1)) * elem, d * elem);
        std::memcpy(vc + (block * v_cache.stride(0) + off * v_cache.stride(1) + h * v_cache.stride(2)) * elem,
                    vp + (t * v.stride(0) + h * v.stride(1)) * elem, d * elem);
      }
    }
  });
}

}  // namespace

TORCH_LIBRARY(accel_cpu, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
        "Tensor seq_lens, Tensor block_table, float softmax_scale, float softcap, int window_left, "
        "int window_right) -> ()");
  m.def("write_kv_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(accel_cpu, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("write_kv_cache", &write_kv_cache);
}
