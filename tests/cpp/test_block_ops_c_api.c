/* The C API of the Transformer-block ops (coda/coda.h) from C: NULL for optional tensors, codes
 * and messages. Linked into test_block_ops_host, which calls coda_c_block_ops_checks(). No GPU. */
#include <coda/coda.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define C_EXPECT(cond)                                                                       \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      ++failures;                                                                            \
      fprintf(stderr, "%s:%d: FAILED: %s (last error: \"%s\")\n", __FILE__, __LINE__, #cond, \
              coda_last_error_message());                                                    \
    }                                                                                        \
  } while (0)

#define HAS(fragment) (strstr(coda_last_error_message(), fragment) != NULL)

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

static coda_tensor vector(unsigned long long addr, int32_t dtype, int64_t length) {
  coda_tensor t = matrix(addr, dtype, length, 0);
  t.rank = 1;
  t.stride[0] = 1;
  return t;
}

/* A call with valid arguments stops before any launch: not built, no SM90 device here, or (on an
 * SM90 machine) the pointer check finds that the fake pointers are not CUDA memory. */
static int stopped_before_launch(int rc) {
  return rc == CODA_ERROR_NOT_BUILT || rc == CODA_ERROR_UNSUPPORTED_DEVICE ||
         (rc == CODA_ERROR_INVALID_ARGUMENT && HAS("CUDA"));
}

int coda_c_block_ops_checks(void) {
  const int64_t M = 200, K = 136;
  coda_tensor A = matrix(1, CODA_DTYPE_BF16, M, K);
  coda_tensor B = matrix(2, CODA_DTYPE_BF16, 264, K);
  coda_tensor D = matrix(3, CODA_DTYPE_BF16, M, 264);
  coda_tensor H = matrix(4, CODA_DTYPE_BF16, M, 264);
  coda_tensor residual = matrix(5, CODA_DTYPE_BF16, M, 264);
  coda_tensor norm_weight = vector(6, CODA_DTYPE_BF16, 264);
  coda_tensor rstd = vector(7, CODA_DTYPE_FP32, M);
  coda_tensor Y = matrix(8, CODA_DTYPE_BF16, M, 132);
  coda_tensor B_qkv = matrix(2, CODA_DTYPE_BF16, 512, K);
  coda_tensor out = matrix(3, CODA_DTYPE_BF16, M, 512);
  coda_tensor positions = vector(9, CODA_DTYPE_FP32, M);
  coda_tensor freqs = matrix(10, CODA_DTYPE_FP32, 2, 512);
  coda_tensor target = vector(11, CODA_DTYPE_INT32, M);
  coda_tensor loss = vector(12, CODA_DTYPE_FP32, 1);
  coda_tensor lse = vector(13, CODA_DTYPE_FP32, M);
  coda_options options = {0, 0, CODA_RASTER_ALONG_N, 0};
  float table[2 * 512];
  int rc;

  rc = coda_linear_residual_norm(&A, &B, &residual, &norm_weight, 1e-6f, &D, NULL, &rstd, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("coda_linear_residual_norm: H is NULL"));
  rc = coda_linear_residual_norm(&A, &B, &residual, &norm_weight, -2.0f, &D, &H, &rstd, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("eps = -2"));

  rc = coda_rms_linear(&A, &B, NULL, CODA_ACT_SILU, &D, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("coda_rms_linear: rstd is NULL"));
  rc = coda_rms_linear(&A, &B, &rstd, 11, &D, NULL, 0, NULL, &options);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("activation 11"));

  /* rstd and Z optional: NULL */
  rc = coda_linear_swiglu(&A, &B, NULL, NULL, &Y, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_WORKSPACE || stopped_before_launch(rc));
  if (rc == CODA_ERROR_NOT_BUILT) C_EXPECT(HAS("linear_swiglu_bf16"));
  rc = coda_linear_swiglu(&A, &B, &rstd, &D, NULL, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("coda_linear_swiglu: Y is NULL"));
  rc = coda_linear_swiglu(&A, &B, &rstd, &D, &Y, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_WORKSPACE || stopped_before_launch(rc));
  if (rc == CODA_ERROR_NOT_BUILT) C_EXPECT(HAS("linear_swiglu_train_bf16"));

  rc = coda_qkv_rope(&A, &B_qkv, &positions, NULL, 4, 2, NULL, NULL, NULL, 1e-6f, &out, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("coda_qkv_rope: freqs is NULL"));
  rc = coda_qkv_rope(&A, &B_qkv, &positions, &freqs, 4, 2, NULL, &norm_weight, NULL, 1e-6f, &out, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("needs both q_norm_weight and k_norm_weight"));
  rc = coda_qkv_rope(&A, &B_qkv, &positions, &freqs, 4, 2, NULL, NULL, NULL, 1e-6f, &out, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_WORKSPACE || stopped_before_launch(rc));

  rc = coda_rope_frequencies(64, 4, 2, 10000.0, NULL, table, 2 * 512);
  C_EXPECT(rc == CODA_OK && table[384] == 0.0f && table[0] > 0.0f && table[1] == table[0]);
  C_EXPECT(strcmp(coda_last_error_message(), "") == 0);
  rc = coda_rope_frequencies(64, 4, 2, 10000.0, NULL, table, 100);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("out holds 100 floats"));

  rc = coda_lm_head_cross_entropy(&A, &B, &target, NULL, -100, 7, &loss, &lse, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("reduction 7"));
  rc = coda_lm_head_cross_entropy(&A, &B, &target, NULL, -100, CODA_REDUCTION_NONE, &loss, &lse, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("loss must have length M"));
  rc = coda_lm_head_cross_entropy(&A, &B, &target, &rstd, -100, CODA_REDUCTION_SUM, &loss, NULL, NULL, 0, NULL, NULL);
  C_EXPECT(rc == CODA_ERROR_INVALID_ARGUMENT && HAS("lse is NULL"));
  rc = coda_lm_head_cross_entropy(&A, &B, &target, &rstd, -100, CODA_REDUCTION_SUM, &loss, &lse, NULL, 0, NULL, &options);
  C_EXPECT(rc == CODA_ERROR_WORKSPACE || stopped_before_launch(rc));

  C_EXPECT(coda_workspace_size_of(CODA_OP_LM_HEAD_CROSS_ENTROPY, CODA_DTYPE_BF16, 0, 1000, 64) == 0);
  C_EXPECT(coda_is_built(CODA_OP_QKV_ROPE, CODA_DTYPE_INT32) == 0);
  C_EXPECT(coda_is_built(CODA_OP_LM_HEAD_CROSS_ENTROPY, CODA_DTYPE_BF16) == 0 ||
           coda_workspace_size_of(CODA_OP_LM_HEAD_CROSS_ENTROPY, CODA_DTYPE_BF16, 200, 1000, 136) > 0);
  return failures;
}
