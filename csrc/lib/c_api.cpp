// csrc/lib/c_api.cpp — the C API (coda/coda.h): converts C descriptions to the C++ types,
// calls the C++ op, and keeps the message of the last failure per thread.
#include <string>

#include "coda/coda.h"
#include "coda/coda.hpp"

namespace {

thread_local std::string g_last_error;

// Returns the status code and records the message (cleared on success).
int record(const coda::Status& s) {
  g_last_error = s.ok() ? std::string() : s.message();
  return static_cast<int>(s.code());
}

int null_argument(const char* op, const char* name) {
  return record(coda::Status(coda::StatusCode::kInvalidArgument,
                             std::string("coda_") + op + ": " + name + " is NULL; pass a coda_tensor describing it"));
}

coda::TensorRef to_ref(const coda_tensor& t) {
  coda::TensorRef r;
  r.data = t.data;
  r.dtype = static_cast<coda::DType>(t.dtype);
  r.rank = t.rank;
  r.shape[0] = t.shape[0];
  r.shape[1] = t.shape[1];
  r.stride[0] = t.stride[0];
  r.stride[1] = t.stride[1];
  return r;
}

coda::Options to_options(const coda_options* o) {
  coda::Options options;
  if (o != nullptr) {
    options.sm_count = o->sm_count;
    options.swizzle = o->swizzle;
    options.raster = static_cast<coda::Raster>(o->raster);
    options.check_pointers = o->skip_pointer_checks == 0;
  }
  return options;
}

cudaStream_t to_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// An optional tensor: NULL is none ({}, a null data pointer).
coda::TensorRef to_optional(const coda_tensor* t) { return t != nullptr ? to_ref(*t) : coda::TensorRef{}; }

}  // namespace

#define CODA_C_REQUIRE(op, ptr) \
  if ((ptr) == nullptr) return null_argument(op, #ptr)

extern "C" {

int coda_gemm(const coda_tensor* A, const coda_tensor* B, const coda_tensor* D, void* workspace,
              size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("gemm", A);
  CODA_C_REQUIRE("gemm", B);
  CODA_C_REQUIRE("gemm", D);
  return record(coda::gemm(to_ref(*A), to_ref(*B), to_ref(*D), {workspace, workspace_bytes}, to_stream(stream),
                           to_options(options)));
}

int coda_gemm_bias_act(const coda_tensor* A, const coda_tensor* B, const coda_tensor* bias, int32_t activation,
                       const coda_tensor* D, void* workspace, size_t workspace_bytes, void* stream,
                       const coda_options* options) {
  CODA_C_REQUIRE("gemm_bias_act", A);
  CODA_C_REQUIRE("gemm_bias_act", B);
  CODA_C_REQUIRE("gemm_bias_act", bias);
  CODA_C_REQUIRE("gemm_bias_act", D);
  return record(coda::gemm_bias_act(to_ref(*A), to_ref(*B), to_ref(*bias), static_cast<coda::Activation>(activation),
                                    to_ref(*D), {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

int coda_gemm_residual(const coda_tensor* A, const coda_tensor* B, const coda_tensor* residual, const coda_tensor* D,
                       void* workspace, size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("gemm_residual", A);
  CODA_C_REQUIRE("gemm_residual", B);
  CODA_C_REQUIRE("gemm_residual", residual);
  CODA_C_REQUIRE("gemm_residual", D);
  return record(coda::gemm_residual(to_ref(*A), to_ref(*B), to_ref(*residual), to_ref(*D),
                                    {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

int coda_gemm_swiglu(const coda_tensor* A, const coda_tensor* B, const coda_tensor* Z, const coda_tensor* Y,
                     void* workspace, size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("gemm_swiglu", A);
  CODA_C_REQUIRE("gemm_swiglu", B);
  CODA_C_REQUIRE("gemm_swiglu", Z);
  CODA_C_REQUIRE("gemm_swiglu", Y);
  return record(coda::gemm_swiglu(to_ref(*A), to_ref(*B), to_ref(*Z), to_ref(*Y), {workspace, workspace_bytes},
                                  to_stream(stream), to_options(options)));
}

int coda_gemm_row_sumsq(const coda_tensor* A, const coda_tensor* B, const coda_tensor* D, const coda_tensor* sumsq,
                        void* workspace, size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("gemm_row_sumsq", A);
  CODA_C_REQUIRE("gemm_row_sumsq", B);
  CODA_C_REQUIRE("gemm_row_sumsq", D);
  CODA_C_REQUIRE("gemm_row_sumsq", sumsq);
  return record(coda::gemm_row_sumsq(to_ref(*A), to_ref(*B), to_ref(*D), to_ref(*sumsq), {workspace, workspace_bytes},
                                     to_stream(stream), to_options(options)));
}

int coda_linear_residual_norm(const coda_tensor* A, const coda_tensor* B, const coda_tensor* residual,
                              const coda_tensor* norm_weight, float eps, const coda_tensor* D, const coda_tensor* H,
                              const coda_tensor* rstd, void* workspace, size_t workspace_bytes, void* stream,
                              const coda_options* options) {
  CODA_C_REQUIRE("linear_residual_norm", A);
  CODA_C_REQUIRE("linear_residual_norm", B);
  CODA_C_REQUIRE("linear_residual_norm", residual);
  CODA_C_REQUIRE("linear_residual_norm", norm_weight);
  CODA_C_REQUIRE("linear_residual_norm", D);
  CODA_C_REQUIRE("linear_residual_norm", H);
  CODA_C_REQUIRE("linear_residual_norm", rstd);
  return record(coda::linear_residual_norm(to_ref(*A), to_ref(*B), to_ref(*residual), to_ref(*norm_weight), eps,
                                           to_ref(*D), to_ref(*H), to_ref(*rstd), {workspace, workspace_bytes},
                                           to_stream(stream), to_options(options)));
}

int coda_rms_linear(const coda_tensor* A, const coda_tensor* B, const coda_tensor* rstd, int32_t activation,
                    const coda_tensor* D, void* workspace, size_t workspace_bytes, void* stream,
                    const coda_options* options) {
  CODA_C_REQUIRE("rms_linear", A);
  CODA_C_REQUIRE("rms_linear", B);
  CODA_C_REQUIRE("rms_linear", rstd);
  CODA_C_REQUIRE("rms_linear", D);
  return record(coda::rms_linear(to_ref(*A), to_ref(*B), to_ref(*rstd), static_cast<coda::Activation>(activation),
                                 to_ref(*D), {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

int coda_linear_swiglu(const coda_tensor* A, const coda_tensor* B, const coda_tensor* rstd, const coda_tensor* Z,
                       const coda_tensor* Y, void* workspace, size_t workspace_bytes, void* stream,
                       const coda_options* options) {
  CODA_C_REQUIRE("linear_swiglu", A);
  CODA_C_REQUIRE("linear_swiglu", B);
  CODA_C_REQUIRE("linear_swiglu", Y);
  return record(coda::linear_swiglu(to_ref(*A), to_ref(*B), to_optional(rstd), to_optional(Z), to_ref(*Y),
                                    {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

int coda_qkv_rope(const coda_tensor* A, const coda_tensor* B, const coda_tensor* positions, const coda_tensor* freqs,
                  int32_t n_heads, int32_t n_kv_heads, const coda_tensor* rstd, const coda_tensor* q_norm_weight,
                  const coda_tensor* k_norm_weight, float eps, const coda_tensor* out, void* workspace,
                  size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("qkv_rope", A);
  CODA_C_REQUIRE("qkv_rope", B);
  CODA_C_REQUIRE("qkv_rope", positions);
  CODA_C_REQUIRE("qkv_rope", freqs);
  CODA_C_REQUIRE("qkv_rope", out);
  return record(coda::qkv_rope(to_ref(*A), to_ref(*B), to_ref(*positions), to_ref(*freqs), n_heads, n_kv_heads,
                               to_optional(rstd), to_optional(q_norm_weight), to_optional(k_norm_weight), eps,
                               to_ref(*out), {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

int coda_rope_frequencies(int32_t head_dim, int32_t n_heads, int32_t n_kv_heads, double theta, const double* inv_freq,
                          float* out, int64_t out_count) {
  return record(coda::rope_frequencies(head_dim, n_heads, n_kv_heads, theta, inv_freq, out, out_count));
}

int coda_lm_head_cross_entropy(const coda_tensor* A, const coda_tensor* B, const coda_tensor* target,
                               const coda_tensor* rstd, int32_t ignore_index, int32_t reduction,
                               const coda_tensor* loss, const coda_tensor* lse, void* workspace,
                               size_t workspace_bytes, void* stream, const coda_options* options) {
  CODA_C_REQUIRE("lm_head_cross_entropy", A);
  CODA_C_REQUIRE("lm_head_cross_entropy", B);
  CODA_C_REQUIRE("lm_head_cross_entropy", target);
  CODA_C_REQUIRE("lm_head_cross_entropy", loss);
  CODA_C_REQUIRE("lm_head_cross_entropy", lse);
  return record(coda::lm_head_cross_entropy(to_ref(*A), to_ref(*B), to_ref(*target), to_optional(rstd), ignore_index,
                                            static_cast<coda::Reduction>(reduction), to_ref(*loss), to_ref(*lse),
                                            {workspace, workspace_bytes}, to_stream(stream), to_options(options)));
}

size_t coda_workspace_size_of(int32_t op, int32_t dtype, int64_t M, int64_t N, int64_t K) {
  return coda::workspace_size({static_cast<coda::Op>(op), static_cast<coda::DType>(dtype), M, N, K});
}

int coda_is_built(int32_t op, int32_t dtype) {
  return coda::is_built(static_cast<coda::Op>(op), static_cast<coda::DType>(dtype)) ? 1 : 0;
}

const char* coda_last_error_message(void) { return g_last_error.c_str(); }

const char* coda_status_name(int code) { return coda::status_code_name(static_cast<coda::StatusCode>(code)); }

const char* coda_version(void) { return coda::version_string(); }

}  // extern "C"
