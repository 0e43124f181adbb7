#include "runtime/small_gemm.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/debug_env.h"

namespace loom::runtime {
namespace {

// dst[c][r] = scale * src[r][c] element by element: the portable path, and the edges the AVX2
// path's 8 x 8 register tiles leave (rows from r_done and, above it, columns from c_done).
void transpose_edges(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                     int64_t cols, int64_t r_done, int64_t c_done, float scale) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = (r < r_done ? c_done : 0); c < cols; ++c)
      dst[c * ldd + r] = scale * src[r * lds + c];
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void transpose_avx2(const float* src, int64_t lds, float* dst,
                                                    int64_t ldd, int64_t rows, int64_t cols,
                                                    float scale) {
  const __m256 factor = _mm256_set1_ps(scale);
  const int64_t r_done = rows / 8 * 8, c_done = cols / 8 * 8;
  // In strips of 128 rows, columns outside, rows inside: each tile then adds 32 bytes to the
  // same 8 rows of dst, which fill in order (rows outside would scatter 8 partial lines 4 KiB
  // apart per tile, thrashing one cache set at a power-of-two stride), and the strip's source
  // lines stay in the first-level cache for the next 8 columns.
  constexpr int64_t kStrip = 128;
  for (int64_t strip = 0; strip < r_done; strip += kStrip)
    for (int64_t c = 0; c < c_done; c += 8) {
      for (int64_t r = strip; r < std::min(strip + kStrip, r_done); r += 8) {
        __m256 x[8], y[8];
        for (int i = 0; i < 8; ++i) x[i] = _mm256_loadu_ps(src + (r + i) * lds + c);
        for (int i = 0; i < 8; i += 2) {
          y[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
          y[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
          x[i] = _mm256_shuffle_ps(y[i], y[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
          x[i + 1] = _mm256_shuffle_ps(y[i], y[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
          x[i + 2] = _mm256_shuffle_ps(y[i + 1], y[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
          x[i + 3] = _mm256_shuffle_ps(y[i + 1], y[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        // x[0..3] hold columns 0, 1, 2, 3 of rows 0-3 (low lanes) and columns 4-7 (high lanes);
        // x[4..7] the same for rows 4-7.
        for (int i = 0; i < 4; ++i) {
          const __m256 lo = _mm256_permute2f128_ps(x[i], x[i + 4], 0x20);
          const __m256 hi = _mm256_permute2f128_ps(x[i], x[i + 4], 0x31);
          _mm256_storeu_ps(dst + (c + i) * ldd + r, _mm256_mul_ps(lo, factor));
          _mm256_storeu_ps(dst + (c + i + 4) * ldd + r, _mm256_mul_ps(hi, factor));
        }
      }
    }
  transpose_edges(src, lds, dst, ldd, rows, cols, r_done, c_done, scale);
}
#endif

}  // namespace

bool cpu_has_avx2_fma() {
  static const bool yes = [] {
#if defined(__x86_64__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           debug_env_int("LOOM_DEBUG_NO_AVX2", 0) != 1;
#else
    return false;
#endif
  }();
  return yes;
}

void gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  at::native::cpublas::brgemm(m, n, k, lda, ldb, ldc, accumulate, a, b, c, false);
}

void transpose_rows(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                    int64_t cols, float scale) {
#if defined(__x86_64__)
  if (cpu_has_avx2_fma()) return transpose_avx2(src, lds, dst, ldd, rows, cols, scale);
#endif
  transpose_edges(src, lds, dst, ldd, rows, cols, 0, 0, scale);
}

}  // namespace loom::runtime
