/* coda/op_list.h — libcoda's ops, listed once. Plain C.
 *
 * CODA_OP_LIST(X) expands X(NAME, Enumerator, value, "name") for every op: coda/coda.h makes the C
 * constants CODA_OP_<NAME> of it, coda/types.hpp the enum class coda::Op, and coda::op_name returns
 * "name", which is also how CODA_KERNELS and the kernels' entry points spell the op
 * ("<name>_<dtype>"); cmake/CodaKernels.cmake reads the names from this file. With a dtype, an op
 * names one compiled kernel; an op with variants (linear_swiglu with or without Z, qkv_rope with or
 * without QK-norm) has an op for each, and the op function picks it. The ops of a Transformer block
 * (kLinearResidualNorm and after) are compiled from the graphs of coda_ext.ops (`python -m coda_ext
 * libgen`), whose kernel list tests/unit/test_c_contract.py checks against this one. */
#ifndef CODA_OP_LIST_H
#define CODA_OP_LIST_H

#define CODA_OP_LIST(X)                                                                              \
  X(GEMM, kGemm, 0, "gemm")                                   /* D = A·Bᵀ */                         \
  X(GEMM_BIAS_ACT, kGemmBiasAct, 1, "gemm_bias_act")          /* D = act(A·Bᵀ + bias) */             \
  X(GEMM_RESIDUAL, kGemmResidual, 2, "gemm_residual")         /* D = A·Bᵀ + residual */              \
  /* Z = A·Bᵀ; Y[:, i] = silu(Z[:, 2i]) · Z[:, 2i+1] */                                              \
  X(GEMM_SWIGLU, kGemmSwiglu, 3, "gemm_swiglu")                                                      \
  /* D = A·Bᵀ; sumsq[m] = Σ_n (A·Bᵀ)[m, n]² (fp32) */                                                \
  X(GEMM_ROW_SUMSQ, kGemmRowSumSq, 4, "gemm_row_sumsq")                                              \
  /* D = A·Bᵀ + residual, H = D ⊙ norm_weight, rstd */                                               \
  X(LINEAR_RESIDUAL_NORM, kLinearResidualNorm, 5, "linear_residual_norm")                            \
  X(RMS_LINEAR, kRmsLinear, 6, "rms_linear")                  /* D = act(rstd ⊙row A·Bᵀ) */          \
  X(LINEAR_SWIGLU, kLinearSwiglu, 7, "linear_swiglu")         /* linear_swiglu without Z: only Y */  \
  X(LINEAR_SWIGLU_TRAIN, kLinearSwigluTrain, 8, "linear_swiglu_train")  /* linear_swiglu with Z */   \
  X(QKV_ROPE, kQkvRope, 9, "qkv_rope")      /* qkv_rope without QK-norm (head_dim 64 or 128) */      \
  X(QKV_ROPE_QK_NORM64, kQkvRopeQkNorm64, 10, "qkv_rope_qk_norm64")     /* with QK-norm, head_dim 64 */  \
  X(QKV_ROPE_QK_NORM128, kQkvRopeQkNorm128, 11, "qkv_rope_qk_norm128")  /* with QK-norm, head_dim 128 */ \
  X(LM_HEAD_CROSS_ENTROPY, kLmHeadCrossEntropy, 12, "lm_head_cross_entropy")

#endif /* CODA_OP_LIST_H */
