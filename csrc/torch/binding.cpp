// coda_ext torch binding — the only translation unit that includes torch headers.
//
// It packs torch tensors into the plain CodaLaunch of csrc/include/coda/abi.h, allocates the
// kernel's workspace from torch's caching allocator, and calls a kernel library's entry
// point (a function pointer obtained by the Python runtime). It contains no CUDA code, so it
// builds with any torch (CPU or CUDA) through torch.utils.cpp_extension.
#include <torch/extension.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "coda/abi.h"

namespace {

CodaLaunch make_launch(const at::Tensor& A, const at::Tensor& W, const std::optional<at::Tensor>& D,
                       const std::vector<std::optional<at::Tensor>>& slot_tensors,
                       const std::vector<int64_t>& slot_ld, const std::vector<double>& slot_value) {
  if (slot_tensors.size() != slot_ld.size() || slot_tensors.size() != slot_value.size())
    throw std::invalid_argument("coda_ext binding: slot lists have different lengths");
  if (slot_tensors.size() > CODA_MAX_SLOTS)
    throw std::invalid_argument("coda_ext binding: too many slots");
  CodaLaunch L{};
  L.abi_version = CODA_ABI_VERSION;
  L.M = A.size(0);
  L.N = W.size(0);
  L.K = A.size(1);
  L.A = A.data_ptr();
  // The leading (non-unit) stride: the row stride of a K-contiguous operand, the column stride of a
  // transposed view (the Python checks guarantee the layout the kernel was built for).
  L.lda = A.stride(1) == 1 ? A.stride(0) : A.stride(1);
  L.B = W.data_ptr();
  L.ldb = W.stride(1) == 1 ? W.stride(0) : W.stride(1);
  L.D = D.has_value() ? D->data_ptr() : nullptr;  // none: the graph writes no main output
  L.ldd = D.has_value() ? D->stride(0) : L.N;
  L.num_slots = static_cast<int32_t>(slot_tensors.size());
  for (size_t i = 0; i < slot_tensors.size(); ++i) {
    L.slots[i].ptr = slot_tensors[i].has_value() ? slot_tensors[i]->data_ptr() : nullptr;
    L.slots[i].ld = slot_ld[i];
    L.slots[i].value = static_cast<float>(slot_value[i]);
  }
  return L;
}

}  // namespace

// Runs the kernel of one compiled op on `stream` (a cudaStream_t as an integer).
void launch(uintptr_t run_fn, uintptr_t workspace_fn, const at::Tensor& A, const at::Tensor& W,
            const std::optional<at::Tensor>& D, const std::vector<std::optional<at::Tensor>>& slot_tensors,
            const std::vector<int64_t>& slot_ld, const std::vector<double>& slot_value, int64_t max_swizzle,
            int64_t raster_order, int64_t sm_count, uintptr_t stream) {
  CodaLaunch L = make_launch(A, W, D, slot_tensors, slot_ld, slot_value);
  L.max_swizzle = static_cast<int32_t>(max_swizzle);
  L.raster_order = static_cast<int32_t>(raster_order);
  L.sm_count = static_cast<int32_t>(sm_count);   // 0: one persistent CTA per SM
  auto workspace_size = reinterpret_cast<CodaWorkspaceSizeFn>(workspace_fn);
  auto run = reinterpret_cast<CodaRunFn>(run_fn);
  size_t bytes = workspace_size(L.M, L.N, L.K);
  at::Tensor workspace;
  if (bytes > 0) {
    workspace = at::empty({static_cast<int64_t>(bytes)}, A.options().dtype(at::kByte));
    L.workspace = workspace.data_ptr();
    L.workspace_bytes = bytes;
  }
  char err[512] = {0};
  int status = run(&L, reinterpret_cast<void*>(stream), err, sizeof(err));
  if (status != CODA_OK) {
    throw std::runtime_error("coda_ext kernel error " + std::to_string(status) + ": " + err);
  }
}

size_t workspace_size(uintptr_t workspace_fn, int64_t M, int64_t N, int64_t K) {
  return reinterpret_cast<CodaWorkspaceSizeFn>(workspace_fn)(M, N, K);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "coda_ext torch binding: launches compiled epilogue kernels on torch tensors";
  m.def("launch", &launch, "Launch a compiled coda_ext kernel");
  m.def("workspace_size", &workspace_size, "Workspace bytes a kernel needs for (M, N, K)");
  m.attr("abi_version") = CODA_ABI_VERSION;
}
