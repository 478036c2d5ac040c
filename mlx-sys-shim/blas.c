/* Which BLAS serves MLX's CPU matmuls.
 *
 * The Linux mlx-cpu wheel links libmlx against the reference netlib BLAS it bundles, which runs
 * f32 GEMM about 30x slower than an optimised one. When built with ZIMAGE_OPENBLAS, this file
 * defines the CBLAS GEMM entry points that libmlx imports and forwards them to OpenBLAS (the
 * scipy-openblas32 build, whose symbols carry a `scipy_` prefix). The executable exports these
 * definitions, and the dynamic linker searches the executable before libmlx's own dependencies,
 * so libmlx binds to them instead of the bundled library.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);

#ifdef ZIMAGE_OPENBLAS
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                       int);
void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                       double*, int);
void scipy_cblas_cgemm(int, int, int, int, int, int, const void*, const void*, int, const void*, int,
                       const void*, void*, int);
char* scipy_openblas_get_config(void);

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  scipy_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  scipy_cblas_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_cgemm(int order, int ta, int tb, int m, int n, int k, const void* alpha, const void* a, int lda,
                 const void* b, int ldb, const void* beta, void* c, int ldc) {
  scipy_cblas_cgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

/* The library that the process-wide `cblas_sgemm` (the one libmlx binds to) lives in. */
static const char* sgemm_owner(void** fn) {
  *fn = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  Dl_info info;
  if (*fn == NULL || dladdr(*fn, &info) == 0 || info.dli_fname == NULL) return NULL;
  return info.dli_fname;
}

const char* mlxs_blas_description(void) {
  /* One buffer per thread, so that two threads asking at once cannot tear each other's text. */
  static _Thread_local char text[512];
  void* fn = NULL;
  const char* owner = sgemm_owner(&fn);
  if (owner == NULL) {
    snprintf(text, sizeof text, "no cblas_sgemm in the process (MLX uses the platform BLAS)");
    return text;
  }
#ifdef ZIMAGE_OPENBLAS
  if (fn == (void*)&cblas_sgemm) {
    snprintf(text, sizeof text, "OpenBLAS (%s)", scipy_openblas_get_config());
    return text;
  }
#endif
  snprintf(text, sizeof text, "%s", owner);
  return text;
}

void* mlxs_sgemm_symbol(void) {
  void* fn = NULL;
  sgemm_owner(&fn);
  return fn;
}

int mlxs_blas_sgemm(int m, int n, int k, const float* a, const float* b, float* c) {
  void* fn = NULL;
  sgemm_owner(&fn);
  if (fn == NULL) return 1;
  ((sgemm_fn)fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  return 0;
}
