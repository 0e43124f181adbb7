// Row-major float32 products and transposes on raw CPU buffers, for kernels that multiply many
// small matrices (attention's per-head blocks) or want a product without an operand copy. The
// products run on LibTorch's small-GEMM kernel (oneDNN's brgemm where the CPU has it, its BLAS
// otherwise); one call runs on the calling thread.
#pragma once

#include <cstdint>

namespace loom::runtime {

// C[m, n] = A[m, k] · B[k, n], or C += A · B when `accumulate`; lda, ldb, ldc are row strides in
// elements.
void gemm_rows(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
               int64_t ldb, float* c, int64_t ldc, bool accumulate);

// dst[c, r] = scale · src[r, c] for a rows x cols matrix (row strides lds, ldd), in register tiles.
void transpose_rows(const float* src, int64_t lds, float* dst, int64_t ldd, int64_t rows,
                    int64_t cols, float scale);

// Whether loom's own vector loops take their AVX2 and FMA paths: the CPU has both and
// LOOM_DEBUG_NO_AVX2 (core/debug_env.h) is not 1. Read once per process.
bool cpu_has_avx2_fma();

}  // namespace loom::runtime
