// coda/coda.hpp — libcoda, the C++ library of coda_ext: fused GEMM + epilogue kernels for
// NVIDIA Hopper (SM90), usable without Python or torch.
//
//   #include <coda/coda.hpp>
//   coda::Status s = coda::gemm_bias_act(coda::matrix(dA, coda::DType::kBFloat16, M, K),
//                                        coda::matrix(dW, coda::DType::kBFloat16, N, K),
//                                        coda::vector(dbias, coda::DType::kBFloat16, N),
//                                        coda::Activation::kSilu,
//                                        coda::matrix(dD, coda::DType::kBFloat16, M, N),
//                                        {workspace, workspace_bytes}, stream);
//   if (!s.ok()) std::fprintf(stderr, "%s\n", s.message().c_str());
//
// CMake: find_package(coda) and target_link_libraries(app PRIVATE coda::coda).
// Other languages: coda/coda.h is the same API as plain C functions.
#pragma once

#include "coda/export.h"
#include "coda/ops.hpp"
#include "coda/types.hpp"

namespace coda {

// "0.1.0": the version of the linked library (compare with kVersionMajor/... of the headers).
CODA_API const char* version_string();

}  // namespace coda
