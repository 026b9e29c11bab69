#pragma once
/// @file
/// anvil's own single-precision matrix product for AVX-512 cores, for the sizes of RL
/// networks (a few hundred rows and columns). Light header.
///
/// Why: on Intel Xeons with two AVX-512 FMA units a core does 64 float FLOPs a cycle, and
/// OpenBLAS 0.3.21's SkylakeX sgemm reaches about 55% of that on the 256 x 256 x 256
/// products of a 256-wide SAC update (docs/benchmarks/main-job.md). This product keeps a
/// 8 x 32 block of C in 16 registers, streams a packed 32-column panel of op(B) from L1
/// and broadcasts op(A) from where it lies, or from a copy in blocks of 8 rows when A is
/// transposed; both are packed once a call (16 x 16 register transposes for B^T).
///
/// `sgemm_avx512` is row-major C[m, n] = alpha op(A) op(B) + beta C, as `blas::gemm`; with
/// beta 0, C is not read. Each element of C sums its k products in order, one fused
/// multiply-add at a time, so a result does not depend on the blocking or the thread.

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <anvil/core/simd.hpp>

namespace anvil::simd {

/// What a product does to each element of C once alpha op(A) op(B) + beta C is summed, in
/// this order: add `bias[j]` (one per column of C); ReLU (`v > 0 ? v : 0`); keep it only where
/// `keep[i * ldkeep + j] > 0` (ReLU's backward from its output), else 0. Each is the same
/// float operation as the element-wise kernel it replaces (`add_bias`, `relu_backward`), so
/// fused into the product's last pass over C or run after it, the results are the same bits.
/// `row_sums`, where given, receives the sums over p of op(A)[i, p] (one per row of C),
/// summed in order from 0 as `column_sums` does: a weight gradient's bias gradient, read
/// while op(A) = dy^T is packed.
struct Epilogue {
  const float* bias = nullptr;
  bool relu = false;
  const float* keep = nullptr;
  std::int64_t ldkeep = 0;
  float* row_sums = nullptr;
  [[nodiscard]] bool empty() const noexcept { return !bias && !relu && !keep && !row_sums; }
};

/// The epilogue `e` as element-wise passes after a product that did not fuse it: C [m, n]
/// with row stride ldc, op(A) [m, k] as `trans_a`, a, lda describe it.
inline void apply_epilogue(const Epilogue& e, bool trans_a, std::int64_t m, std::int64_t n, std::int64_t k,
                           const float* a, std::int64_t lda, float* c, std::int64_t ldc) {
  if (e.row_sums) {
    if (trans_a && lda == m) {
      column_sums(e.row_sums, a, k, m);
    } else {
      for (std::int64_t i = 0; i < m; ++i) {
        float t = 0.f;
        for (std::int64_t p = 0; p < k; ++p) t += trans_a ? a[p * lda + i] : a[i * lda + p];
        e.row_sums[i] = t;
      }
    }
  }
  if (e.bias || e.relu) {
    if (ldc == n) {
      if (e.bias) add_bias(c, e.bias, m, n, e.relu);
      else relu(c, m * n);
    } else {
      for (std::int64_t i = 0; i < m; ++i) {
        if (e.bias) add_bias(c + i * ldc, e.bias, 1, n, e.relu);
        else relu(c + i * ldc, n);
      }
    }
  }
  if (e.keep) {
    if (ldc == n && e.ldkeep == n) relu_backward(c, e.keep, m * n);
    else
      for (std::int64_t i = 0; i < m; ++i) relu_backward(c + i * ldc, e.keep + i * e.ldkeep, n);
  }
}

#if ANVIL_SIMD_X86
namespace detail::sgemm {

inline constexpr int kRows = 8;   // rows of C a tile holds
inline constexpr int kCols = 32;  // columns of C a tile holds: two registers of 16 floats

ANVIL_TARGET_AVX512 inline __mmask16 low_mask(std::int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1u);
}

// The two-source permutes' indices that transpose16 and lane_sums16 interleave with: by
// float and by pairs of floats within each 128-bit lane (the low and high halves of two
// registers), and the even and odd 128-bit lanes of two registers.
struct Interleaves {
  __m512i lo_ps, hi_ps, lo_pd, hi_pd, even_lanes, odd_lanes;
};
ANVIL_TARGET_AVX512 inline Interleaves interleaves() {
  return {_mm512_setr_epi32(0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29),
          _mm512_setr_epi32(2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31),
          _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
          _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31),
          _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
          _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31)};
}

// In-register transpose of 16 rows of 16 floats. The interleaves and lane shuffles are
// written as two-source permutes (GCC 12 warns on its unpack and shuffle intrinsics'
// undefined operand).
ANVIL_TARGET_AVX512 inline void transpose16(__m512 r[16]) {
  const auto [lo_ps, hi_ps, lo_pd, hi_pd, even_lanes, odd_lanes] = interleaves();
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // pairs of rows interleaved by float within each 128-bit lane
    t[2 * i] = _mm512_permutex2var_ps(r[2 * i], lo_ps, r[2 * i + 1]);
    t[2 * i + 1] = _mm512_permutex2var_ps(r[2 * i], hi_ps, r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // then by pairs of floats: each lane holds 4 rows' column
    r[4 * i] = _mm512_permutex2var_ps(t[4 * i], lo_pd, t[4 * i + 2]);
    r[4 * i + 1] = _mm512_permutex2var_ps(t[4 * i], hi_pd, t[4 * i + 2]);
    r[4 * i + 2] = _mm512_permutex2var_ps(t[4 * i + 1], lo_pd, t[4 * i + 3]);
    r[4 * i + 3] = _mm512_permutex2var_ps(t[4 * i + 1], hi_pd, t[4 * i + 3]);
  }
  // r[4i + q] now holds, in 128-bit lane L, column 4L + q of rows 4i .. 4i+3; the lanes of
  // four such registers make a column.
  for (int q = 0; q < 4; ++q) {
    const __m512 u0 = _mm512_permutex2var_ps(r[q], even_lanes, r[4 + q]);
    const __m512 u1 = _mm512_permutex2var_ps(r[q], odd_lanes, r[4 + q]);
    const __m512 u2 = _mm512_permutex2var_ps(r[8 + q], even_lanes, r[12 + q]);
    const __m512 u3 = _mm512_permutex2var_ps(r[8 + q], odd_lanes, r[12 + q]);
    t[q] = _mm512_permutex2var_ps(u0, even_lanes, u2);
    t[4 + q] = _mm512_permutex2var_ps(u1, even_lanes, u3);
    t[8 + q] = _mm512_permutex2var_ps(u0, odd_lanes, u2);
    t[12 + q] = _mm512_permutex2var_ps(u1, odd_lanes, u3);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// Packs op(B) [k, n] into panels of kCols columns: panel j holds, for each p, the 32 values
// op(B)[p, 32j .. 32j+31] (zeros past column n), one panel after another. B is packed too:
// read in place, a panel's rows lie a row of B apart, and at 256 columns (1 KiB) they fall
// in a few of L1's sets and evict each other (the products ran 1.1-1.2x slower so).
ANVIL_TARGET_AVX512 inline void pack_b(bool trans_b, std::int64_t n, std::int64_t k, const float* b, std::int64_t ldb,
                                       float* out) {
  const std::int64_t panels = (n + kCols - 1) / kCols;
  for (std::int64_t j = 0; j < panels; ++j) {
    float* dst = out + j * k * kCols;
    const std::int64_t j0 = j * kCols, w = n - j0;
    if (!trans_b) {  // op(B) = B [k, n]: each p copies a row's 32 columns
      const __mmask16 m0 = low_mask(w), m1 = low_mask(w - 16);
      for (std::int64_t p = 0; p < k; ++p) {
        const float* src = b + p * ldb + j0;
        _mm512_store_ps(dst + p * kCols, _mm512_maskz_loadu_ps(m0, src));
        _mm512_store_ps(dst + p * kCols + 16, _mm512_maskz_loadu_ps(m1, src + 16));
      }
      continue;
    }
    // op(B) = B^T, B [n, k]: columns j0.. of op(B) are rows j0.. of B; 16 x 16 transposes.
    for (int half = 0; half < 2; ++half) {
      const std::int64_t rows = w - 16 * half;  // rows of B this half reads (may be <= 0)
      for (std::int64_t p0 = 0; p0 < k; p0 += 16) {
        const __mmask16 kmask = low_mask(k - p0);
        __m512 r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = i < rows ? _mm512_maskz_loadu_ps(kmask, b + (j0 + 16 * half + i) * ldb + p0) : _mm512_setzero_ps();
        transpose16(r);
        const std::int64_t qs = k - p0 < 16 ? k - p0 : 16;
        for (std::int64_t q = 0; q < qs; ++q) _mm512_store_ps(dst + (p0 + q) * kCols + 16 * half, r[q]);
      }
    }
  }
}

// Packs op(A) = A^T (A [k, m]) into blocks of kRows rows: block i holds, for each p, the 8
// values op(A)[8i .. 8i+7, p] = A[p, 8i .. 8i+7] (zeros past row m). Read in place, a
// tile's column p of op(A) lies a row of A after column p - 1: at 256 columns (1 KiB) the
// k lines fall in 4 of L1's 64 sets and evict each other, and half of each line is
// another tile's. Eight blocks (64 columns of A) at a time, so each line of A is read once;
// with `sums`, sums[i] = the sum over p of A[p, i], in order from 0 (a bias gradient, as
// `column_sums`), four independent chains of additions at a time.
ANVIL_TARGET_AVX512 inline void pack_a_trans(std::int64_t m, std::int64_t k, const float* a, std::int64_t lda,
                                             float* out, float* sums) {
  constexpr int kGroups = 4;  // 16 columns of A each
  for (std::int64_t c0 = 0; c0 < m; c0 += 16 * kGroups) {
    __mmask8 mlo[kGroups], mhi[kGroups];
    float* lo[kGroups];
    __m512 s[kGroups];
    int groups = 0;
    for (int g = 0; g < kGroups && c0 + 16 * g < m; ++g, ++groups) {
      const std::int64_t i0 = c0 + 16 * g;
      const __mmask16 mask = low_mask(m - i0);
      mlo[g] = static_cast<__mmask8>(mask & 0xFF);
      mhi[g] = static_cast<__mmask8>(mask >> 8);
      lo[g] = out + (i0 / kRows) * k * kRows;  // then the second block (unused past m)
      s[g] = _mm512_setzero_ps();
    }
    for (std::int64_t p = 0; p < k; ++p) {
      const float* src = a + p * lda + c0;
      for (int g = 0; g < groups; ++g) {
        const __m256 x0 = _mm256_maskz_loadu_ps(mlo[g], src + 16 * g);
        _mm256_store_ps(lo[g] + p * kRows, x0);
        if (mhi[g]) {
          const __m256 x1 = _mm256_maskz_loadu_ps(mhi[g], src + 16 * g + kRows);
          _mm256_store_ps(lo[g] + k * kRows + p * kRows, x1);
          if (sums) s[g] = _mm512_add_ps(s[g], _mm512_insertf32x8(_mm512_castps256_ps512(x0), x1, 1));
        } else if (sums) {
          s[g] = _mm512_add_ps(s[g], _mm512_castps256_ps512(x0));
        }
      }
    }
    if (sums)
      for (int g = 0; g < groups; ++g) _mm512_mask_storeu_ps(sums + c0 + 16 * g, low_mask(m - c0 - 16 * g), s[g]);
  }
}

// A tile's share of an Epilogue: its columns' biases and its first row's `keep`.
struct Fused {
  const float* bias;
  bool relu;
  const float* keep;
  std::int64_t ldkeep;
};

// One tile: C[R rows, up to 32 columns] from R rows of op(A) and a packed panel of op(B),
// then the epilogue's steps on it (`f`).
// op(A)[r, p] is a[r * lda + p] (A as stored) or a[p * kRows + r] (`Packed`: a block of
// pack_a_trans).
template <int R, bool Packed>
ANVIL_TARGET_AVX512 inline void tile(const float* a, std::int64_t lda, const float* panel, std::int64_t k, float* c,
                                     std::int64_t ldc, std::int64_t cols, float alpha, float beta, const Fused& f) {
  __m512 lo[R], hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  if constexpr (Packed) {  // op(A)'s column p is R consecutive floats of the block
    const float* ap = a;
#pragma GCC unroll 2
    for (std::int64_t p = 0; p < k; ++p, ap += kRows) {
      const __m512 b0 = _mm512_load_ps(panel + p * kCols), b1 = _mm512_load_ps(panel + p * kCols + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(ap[r]);
        lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
        hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
      }
    }
  } else {  // R rows of A, each read along p
    const float* ar[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) ar[r] = a + r * lda;
#pragma GCC unroll 2
    for (std::int64_t p = 0; p < k; ++p) {
      const __m512 b0 = _mm512_load_ps(panel + p * kCols), b1 = _mm512_load_ps(panel + p * kCols + 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 x = _mm512_set1_ps(ar[r][p]);
        lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
        hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
      }
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = low_mask(cols), m1 = low_mask(cols - 16);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, lo[r]), x1 = _mm512_mul_ps(va, hi[r]);
    if (beta != 0.f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, cr + 16), x1);
    }
    if (f.bias) {
      x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, f.bias));
      x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, f.bias + 16));
    }
    if (f.relu) {
      x0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x0, _mm512_setzero_ps(), _CMP_GT_OQ), x0);
      x1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x1, _mm512_setzero_ps(), _CMP_GT_OQ), x1);
    }
    if (f.keep) {
      const float* kr = f.keep + r * f.ldkeep;
      x0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m0, kr), _mm512_setzero_ps(), _CMP_GT_OQ), x0);
      x1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(m1, kr + 16), _mm512_setzero_ps(), _CMP_GT_OQ),
                               x1);
    }
    _mm512_mask_storeu_ps(cr, m0, x0);
    _mm512_mask_storeu_ps(cr + 16, m1, x1);
  }
}

template <int R, bool Packed>
ANVIL_TARGET_AVX512 inline void tile_rows(int rows, const float* a, std::int64_t lda, const float* panel,
                                          std::int64_t k, float* c, std::int64_t ldc, std::int64_t cols, float alpha,
                                          float beta, const Fused& f) {
  if constexpr (R > 1)
    if (rows < R) return tile_rows<R - 1, Packed>(rows, a, lda, panel, k, c, ldc, cols, alpha, beta, f);
  tile<R, Packed>(a, lda, panel, k, c, ldc, cols, alpha, beta, f);
}

// Every tile of C, panel by panel (a panel of op(B) stays in L1 while the rows pass); op(A)
// is A as it lies or, `Packed`, pack_a_trans's blocks.
template <bool Packed>
ANVIL_TARGET_AVX512 inline void tiles(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                                      std::int64_t lda, const float* packed, float beta, float* c,
                                      std::int64_t ldc, const Epilogue& e) {
  const std::int64_t panels = (n + kCols - 1) / kCols;
  for (std::int64_t j = 0; j < panels; ++j) {
    const std::int64_t j0 = j * kCols, cols = n - j0;
    const float* panel = packed + j * k * kCols;
    for (std::int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int rows = static_cast<int>(m - i0 < kRows ? m - i0 : kRows);
      const Fused f{e.bias ? e.bias + j0 : nullptr, e.relu, e.keep ? e.keep + i0 * e.ldkeep + j0 : nullptr, e.ldkeep};
      tile_rows<kRows, Packed>(rows, Packed ? a + i0 * k : a + i0 * lda, lda, panel, k, c + i0 * ldc + j0, ldc, cols,
                               alpha, beta, f);
    }
  }
}

// This thread's packed op(B) (`which` 0) or op(A) (1): reused call after call, 64-byte aligned.
inline float* pack_buffer(int which, std::int64_t floats) {
  thread_local std::vector<float> storage[2];
  const std::size_t need = static_cast<std::size_t>(floats) + 16;
  if (storage[which].size() < need) storage[which].resize(need);
  auto addr = reinterpret_cast<std::uintptr_t>(storage[which].data());
  return reinterpret_cast<float*>((addr + 63) & ~std::uintptr_t(63));
}

// v[l] = the sum of a[l]'s 16 lanes, for 16 registers: pairs of registers interleaved and
// added, then pairs of floats, then 128-bit lanes (each sum's additions in a fixed order).
ANVIL_TARGET_AVX512 inline __m512 lane_sums16(const __m512 a[16]) {
  const auto [lo_ps, hi_ps, lo_pd, hi_pd, even_lanes, odd_lanes] = interleaves();
  __m512 p[8], v[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // p[i]: per 128-bit lane, partial sums of a[2i] and a[2i + 1]
    p[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[2 * i], lo_ps, a[2 * i + 1]),
                         _mm512_permutex2var_ps(a[2 * i], hi_ps, a[2 * i + 1]));
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)  // v[j]'s 128-bit lane L: a[4j .. 4j+3]'s sums over that lane
    v[j] = _mm512_add_ps(_mm512_permutex2var_ps(p[2 * j], lo_pd, p[2 * j + 1]),
                         _mm512_permutex2var_ps(p[2 * j], hi_pd, p[2 * j + 1]));
  const __m512 s01 = _mm512_add_ps(_mm512_permutex2var_ps(v[0], even_lanes, v[1]),
                                   _mm512_permutex2var_ps(v[0], odd_lanes, v[1]));
  const __m512 s23 = _mm512_add_ps(_mm512_permutex2var_ps(v[2], even_lanes, v[3]),
                                   _mm512_permutex2var_ps(v[2], odd_lanes, v[3]));
  return _mm512_add_ps(_mm512_permutex2var_ps(s01, even_lanes, s23), _mm512_permutex2var_ps(s01, odd_lanes, s23));
}

// R rows of C = alpha A B^T (+ bias, ReLU), B [n, k] read as it lies: 16 / R columns at a
// time, each (row, column) a register of 16 partial dot products along k, summed across
// lanes at the end (lane_sums16). No packing: what acting for a few envs needs, where each
// weight is used R times and transposing it would cost as much as using it.
template <int R>
ANVIL_TARGET_AVX512 inline void rows_bt(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                        std::int64_t n, std::int64_t k, float alpha, float* c, std::int64_t ldc,
                                        const float* bias, bool relu) {
  constexpr int T = 16 / R;
  const __m512 zero = _mm512_setzero_ps(), va = _mm512_set1_ps(alpha);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (std::int64_t j0 = 0; j0 < n; j0 += T) {
    const int tn = static_cast<int>(n - j0 < T ? n - j0 : T);
    __m512 acc[16];
#pragma GCC unroll 16
    for (int l = 0; l < 16; ++l) acc[l] = zero;
    for (std::int64_t p0 = 0; p0 < k; p0 += 16) {
      const __mmask16 km = low_mask(k - p0);
      __m512 x[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) x[r] = _mm512_maskz_loadu_ps(km, a + r * lda + p0);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const __m512 w = t < tn ? _mm512_maskz_loadu_ps(km, b + (j0 + t) * ldb + p0) : zero;
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) acc[r * T + t] = _mm512_fmadd_ps(x[r], w, acc[r * T + t]);
      }
    }
    __m512 s = _mm512_mul_ps(va, lane_sums16(acc));  // lane r * T + t: row r, column j0 + t
    const __mmask16 tm = low_mask(tn);
    // (lane moves as two-source permutes: GCC 12 warns on the one-source ones' undefined operand)
    if (bias) {
      __m512 bv = _mm512_maskz_loadu_ps(tm, bias + j0);  // columns in lanes 0 .. T-1, repeated per row
      if constexpr (T < 16) bv = _mm512_permutex2var_ps(bv, _mm512_and_epi32(iota, _mm512_set1_epi32(T - 1)), bv);
      s = _mm512_add_ps(s, bv);
    }
    if (relu) s = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, zero, _CMP_GT_OQ), s);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      _mm512_mask_storeu_ps(c + r * ldc + j0, tm,
                            r == 0 ? s : _mm512_permutex2var_ps(s, _mm512_add_epi32(iota, _mm512_set1_epi32(r * T)), s));
  }
}


// Calls `run(rows, i)` for rows [i, i + rows) of [0, m), taken 4, 2 and 1 at a time (`rows`
// a std::integral_constant): the few-rows products' order, which gives each row the same
// additions in every group.
template <class Run>
inline void in_row_groups(std::int64_t m, Run&& run) {
  std::int64_t i = 0;
  for (; i + 4 <= m; i += 4) run(std::integral_constant<int, 4>{}, i);
  if (i + 2 <= m) run(std::integral_constant<int, 2>{}, i), i += 2;
  if (i < m) run(std::integral_constant<int, 1>{}, i);
}

// R rows of C = alpha A B (+ bias, ReLU) for B [k, n] as stored (a kept copy of a weight's
// transpose), C columns [0, 16 Q): each element of A broadcast along a row of B, R x Q
// registers of C, the last of the Q vectors masked to `last`. No sums across lanes: what a
// few rows through a layer of 16 or more outputs want, once the transpose is at hand.
template <int R, int Q>
ANVIL_TARGET_AVX512 inline void rows_b(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                       std::int64_t k, float alpha, float* c, std::int64_t ldc, const float* bias,
                                       bool relu, __mmask16 last) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 acc[R][Q];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) acc[r][q] = zero;
  for (std::int64_t p = 0; p < k; ++p) {
    const float* row = b + p * ldb;
    __m512 w[Q];
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) w[q] = q + 1 < Q ? _mm512_loadu_ps(row + 16 * q) : _mm512_maskz_loadu_ps(last, row + 16 * q);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) acc[r][q] = _mm512_fmadd_ps(x, w[q], acc[r][q]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) {
    const __mmask16 mk = q + 1 < Q ? static_cast<__mmask16>(0xFFFF) : last;
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(mk, bias + 16 * q) : zero;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512 s = _mm512_mul_ps(va, acc[r][q]);
      if (bias) s = _mm512_add_ps(s, bv);
      if (relu) s = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, zero, _CMP_GT_OQ), s);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * q, mk, s);
    }
  }
}

// R rows of C = alpha A B (+ bias, ReLU), B [k, n]: 64 columns at a time, then the rest.
template <int R>
ANVIL_TARGET_AVX512 inline void rows_b(const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                       std::int64_t n, std::int64_t k, float alpha, float* c, std::int64_t ldc,
                                       const float* bias, bool relu) {
  std::int64_t j = 0;
  for (; j + 64 <= n; j += 64)
    rows_b<R, 4>(a, lda, b + j, ldb, k, alpha, c + j, ldc, bias ? bias + j : nullptr, relu, 0xFFFF);
  const std::int64_t rest = n - j;
  if (rest == 0) return;
  const __mmask16 last = low_mask(rest - (rest - 1) / 16 * 16);
  const float* bj = bias ? bias + j : nullptr;
  switch ((rest + 15) / 16) {
    case 1: return rows_b<R, 1>(a, lda, b + j, ldb, k, alpha, c + j, ldc, bj, relu, last);
    case 2: return rows_b<R, 2>(a, lda, b + j, ldb, k, alpha, c + j, ldc, bj, relu, last);
    case 3: return rows_b<R, 3>(a, lda, b + j, ldb, k, alpha, c + j, ldc, bj, relu, last);
    default: return rows_b<R, 4>(a, lda, b + j, ldb, k, alpha, c + j, ldc, bj, relu, last);
  }
}

}  // namespace detail::sgemm

/// Row-major C[m, n] = alpha op(A) op(B) + beta C on AVX-512 (call only where `avx512()`);
/// lda, ldb, ldc are the row strides as stored. With beta 0, C is not read. `e`'s steps run
/// on each tile as it is stored (Epilogue; `row_sums` while op(A) is packed when transposed).
ANVIL_TARGET_AVX512 inline void sgemm_avx512(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                                             std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                             const float* b, std::int64_t ldb, float beta, float* c,
                                             std::int64_t ldc, const Epilogue& e = {}) {
  namespace d = detail::sgemm;
  if (m <= 0 || n <= 0) {
    if (m > 0 && e.row_sums) apply_epilogue(Epilogue{.row_sums = e.row_sums}, trans_a, m, n, k, a, lda, c, ldc);
    return;
  }
  const std::int64_t panels = (n + d::kCols - 1) / d::kCols;
  float* packed = d::pack_buffer(0, panels * (k > 0 ? k : 1) * d::kCols);
  if (k > 0) d::pack_b(trans_b, n, k, b, ldb, packed);
  if (!trans_a) {
    d::tiles<false>(m, n, k, alpha, a, lda, packed, beta, c, ldc, e);
    if (e.row_sums) apply_epilogue(Epilogue{.row_sums = e.row_sums}, false, m, n, k, a, lda, c, ldc);
    return;
  }
  const std::int64_t blocks = (m + 2 * d::kRows - 1) / (2 * d::kRows) * 2;
  float* packed_a = d::pack_buffer(1, blocks * (k > 0 ? k : 1) * d::kRows);
  d::pack_a_trans(m, k, a, lda, packed_a, e.row_sums);
  d::tiles<true>(m, n, k, alpha, packed_a, d::kRows, packed, beta, c, ldc, e);
}

/// Row-major C[m, n] = alpha A B^T for a few rows (acting for a few envs: m below 8, where
/// `sgemm_avx512` would pack B for a handful of uses of each weight), on AVX-512 (call only
/// where `avx512()`): B [n, k] read where it lies, each element of C a dot product of 16
/// lanes along k summed across them at the end, then `e`'s bias and ReLU (its `keep` and
/// `row_sums` are not taken here: the forward pass's steps only). C is not read. Each row's
/// result depends on that row alone (rows are taken 4, 2 and 1 at a time; the order of its
/// additions is the same in each).
ANVIL_TARGET_AVX512 inline void sgemm_rows_bt_avx512(std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                                     const float* a, std::int64_t lda, const float* b,
                                                     std::int64_t ldb, float* c, std::int64_t ldc,
                                                     const Epilogue& e = {}) {
  namespace d = detail::sgemm;
  d::in_row_groups(m, [&](auto rows, std::int64_t i) {
    d::rows_bt<rows()>(a + i * lda, lda, b, ldb, n, k, alpha, c + i * ldc, ldc, e.bias, e.relu);
  });
}

/// Row-major C[m, n] = alpha A B for a few rows (m below 8) with B [k, n] as stored: a copy
/// of a layer's weight transposed and kept while the weight stays the same (nn::MlpTape),
/// on AVX-512 (call only where `avx512()`). Each element of A is broadcast along a row of
/// B into registers of C: no sums across lanes, about twice `sgemm_rows_bt_avx512`'s speed
/// from 16 columns up and ten times at a 3-wide first layer. Then `e`'s bias and ReLU (not
/// its `keep` or `row_sums`). C is not read. Each element of C sums its k products in
/// order, one fused multiply-add at a time, so a row's result depends on that row alone.
ANVIL_TARGET_AVX512 inline void sgemm_rows_b_avx512(std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                                    const float* a, std::int64_t lda, const float* b,
                                                    std::int64_t ldb, float* c, std::int64_t ldc,
                                                    const Epilogue& e = {}) {
  namespace d = detail::sgemm;
  d::in_row_groups(m, [&](auto rows, std::int64_t i) {
    d::rows_b<rows()>(a + i * lda, lda, b, ldb, n, k, alpha, c + i * ldc, ldc, e.bias, e.relu);
  });
}
#endif

}  // namespace anvil::simd
