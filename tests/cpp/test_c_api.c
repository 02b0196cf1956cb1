/* The C API (coda/coda.h) from C: the header compiles as C, codes and messages come through.
 * Linked into test_host_validation, which calls coda_c_header_checks(). No GPU needed. */
#include <coda/coda.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define C_EXPECT(cond)                                                          \
  do {                                                                          \
    if (!(cond)) {                                                              \
      ++failures;                                                               \
      fprintf(stderr, "%s:%d: FAILED: %s (last error: \"%s\")\n", __FILE__, __LINE__, #cond, \
              coda_last_error_message());                                       \
    }                                                                           \
  } while (0)

static coda_tensor matrix(unsigned long long addr, int32_t dtype, int64_t rows, int64_t cols) {
  coda_tensor t;
  t.data = (void*)(addr << 36);
  t.dtype = dtype;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.stride[0] = cols;
  t.stride[1] = 1;
  return t;
}

int coda_c_header_checks(void) {
  coda_tensor A = matrix(1, CODA_DTYPE_BF16, 200, 136);
  coda_tensor B = matrix(2, CODA_DTYPE_BF16, 264, 136);
  coda_tensor D = matrix(3, CODA_DTYPE_BF16, 200, 264);
  coda_tensor bias = matrix(4, CODA_DTYPE_BF16, 264, 0);
  coda_tensor A100 = matrix(1, CODA_DTYPE_BF16, 200, 100);
  coda_tensor B100 = matrix(2, CODA_DTYPE_BF16, 264, 100);
  coda_options options = {0, 0, 0, 0};
  int rc;

  bias.rank = 1;
  bias.stride[0] = 1;

  rc = coda_gemm(NULL, &B, &D, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT);
  C_EXPECT(strstr(coda_last_error_message(), "coda_gemm: A is NULL") != NULL);

  rc = coda_gemm(&A100, &B100, &D, NULL, 0, NULL, &options);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT);
  C_EXPECT(strstr(coda_last_error_message(), "K = 100 must be a multiple of 8") != NULL);

  rc = coda_gemm_bias_act(&A, &B, &bias, 9, &D, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT);
  C_EXPECT(strstr(coda_last_error_message(), "activation 9") != NULL);

  rc = coda_gemm_residual(&A, &B, NULL, &D, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && strstr(coda_last_error_message(), "residual is NULL") != NULL);
  rc = coda_gemm_swiglu(&A, &B, &D, &D, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && strstr(coda_last_error_message(), "Y must have shape") != NULL);
  rc = coda_gemm_row_sumsq(&A, &B, &D, &bias, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && strstr(coda_last_error_message(), "sumsq") != NULL);

  C_EXPECT(strcmp(coda_status_name(CODA_OK), "ok") == 0);
  C_EXPECT(strcmp(coda_status_name(CODA_ERROR_NOT_BUILT), "kernel not built") == 0);
  C_EXPECT(strcmp(coda_status_name(CODA_ERROR_WORKSPACE), "bad workspace") == 0);
  C_EXPECT(strcmp(coda_version(), "0.1.0") == 0);
  C_EXPECT(coda_workspace_size_of(CODA_OP_GEMM, CODA_DTYPE_BF16, 0, 8, 8) == 0);
  C_EXPECT(coda_is_built(CODA_OP_GEMM, CODA_DTYPE_FP32) == 0);
  C_EXPECT(coda_is_built(CODA_OP_GEMM_ROW_SUMSQ, CODA_DTYPE_BF16) == 0 ||
           coda_workspace_size_of(CODA_OP_GEMM_ROW_SUMSQ, CODA_DTYPE_BF16, 200, 264, 136) > 0);
  return failures;
}
