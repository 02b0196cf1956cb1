// csrc/lib/names.cpp — names of libcoda's enums (messages, kernel names) and its version.
#include "coda/coda.hpp"
#include "detail.hpp"

namespace coda {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat32: return "fp32";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: return 2;
    case DType::kFloat16: return 2;
    case DType::kFloat32: return 4;
    case DType::kInt32: return 4;
  }
  return 0;
}

const char* status_code_name(StatusCode code) {
  switch (code) {
#define CODA_STATUS_NAME(constant, enumerator, value, name) \
  case StatusCode::enumerator: return name;
    CODA_STATUS_LIST(CODA_STATUS_NAME)
#undef CODA_STATUS_NAME
  }
  return "unknown status";
}

const char* op_name(Op op) {
  switch (op) {
#define CODA_OP_NAME(NAME, enumerator, value, name) \
  case Op::enumerator: return name;
    CODA_OP_LIST(CODA_OP_NAME)
#undef CODA_OP_NAME
  }
  return "unknown";
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kIdentity: return "identity";
    case Activation::kRelu: return "relu";
    case Activation::kSilu: return "silu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kGelu: return "gelu";
  }
  return "unknown";
}

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone: return "none";
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
  }
  return "unknown";
}

const char* version_string() { return CODA_VERSION_STRING; }

namespace detail {
std::string kernel_name(Op op, DType dtype) { return cat(op_name(op), "_", dtype_name(dtype)); }
}  // namespace detail

}  // namespace coda
