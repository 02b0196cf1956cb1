// csrc/lib/launch.cpp — the one launch path of libcoda's ops: kernel lookup, workspace,
// device and pointer checks, then the kernel's plain-C entry point (coda/abi.h).
#include <atomic>

#include "detail.hpp"

namespace coda::detail {
namespace {

// Compute capability per device, cached: 0 = not yet asked, else major * 10 + minor.
constexpr int kMaxDevices = 64;
std::atomic<int> g_capability[kMaxDevices];

// A CUDA runtime error as a Status; clears the (non-sticky) error our query left behind.
Status cuda_failure(const char* op, const char* what, cudaError_t err) {
  (void)cudaGetLastError();
  return Status(StatusCode::kCudaError, cat("coda::", op, ": ", what, " failed: ", cudaGetErrorName(err), " (",
                                            cudaGetErrorString(err), ")"));
}

}  // namespace

Status check_current_device(const char* op) {
  int device = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::kUnsupportedDevice,
                  cat("coda::", op, ": no usable CUDA device (", cudaGetErrorName(err), ": ", cudaGetErrorString(err),
                      "); libcoda's kernels need an SM90 GPU (H100/H200) and its driver"));
  }
  int cc = device >= 0 && device < kMaxDevices ? g_capability[device].load(std::memory_order_relaxed) : 0;
  if (cc == 0) {
    int major = 0, minor = 0;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (err != cudaSuccess) return cuda_failure(op, "querying the compute capability of the current device", err);
    cc = major * 10 + minor;
    if (device >= 0 && device < kMaxDevices) g_capability[device].store(cc, std::memory_order_relaxed);
  }
  if (cc != 90) {
    cudaDeviceProp prop{};
    const char* name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "unknown";
    (void)cudaGetLastError();
    return Status(StatusCode::kUnsupportedDevice,
                  cat("coda::", op, ": device ", device, " (", name, ") has compute capability ", cc / 10, ".", cc % 10,
                      "; libcoda's kernels are built for sm_90a and need an H100 or H200"));
  }
  return Status();
}

Status check_pointers(const Validator& v) {
  int device = -1;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cuda_failure(v.op(), "cudaGetDevice", err);
  for (int i = 0; i < v.num_regions(); ++i) {
    const Region& r = v.region(i);
    const void* ptr = reinterpret_cast<const void*>(r.begin);
    cudaPointerAttributes attr{};
    err = cudaPointerGetAttributes(&attr, ptr);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return v.fail(cat(r.name, " (", hex(ptr), ") is not memory the CUDA runtime knows (", cudaGetErrorName(err),
                        "); pass device memory from cudaMalloc"));
    }
    switch (attr.type) {
      case cudaMemoryTypeDevice:
        if (attr.device != device)
          return v.fail(cat(r.name, " (", hex(ptr), ") is memory of device ", attr.device, " but the current device is ",
                            device, "; call cudaSetDevice(", attr.device, ") before the call, or move the data"));
        break;
      case cudaMemoryTypeManaged:
        break;
      case cudaMemoryTypeHost:
        return v.fail(cat(r.name, " (", hex(ptr), ") is pinned host memory; libcoda's kernels read and write device "
                          "memory: copy it to a cudaMalloc buffer"));
      default:
        return v.fail(cat(r.name, " (", hex(ptr), ") is not CUDA memory (a host pointer?); allocate it with cudaMalloc "
                          "or cudaMallocManaged"));
    }
  }
  return Status();
}

CodaLaunch make_launch(const Validator& v, const TensorRef& A, const TensorRef& B, const TensorRef& D) {
  CodaLaunch L{};
  L.abi_version = CODA_ABI_VERSION;
  L.M = v.M();
  L.N = v.N();
  L.K = v.K();
  L.A = A.data;
  L.lda = A.stride[0];
  L.B = B.data;
  L.ldb = B.stride[0];
  L.D = D.data;
  L.ldd = D.stride[0];
  L.num_slots = 0;
  return L;
}

Status prepare(Validator& v, Op op, CodaLaunch& L, const Workspace& workspace, const Options& options,
               KernelEntry* kernel_out, char** host_part) {
  Status s = v.options(options);
  if (!s.ok()) return s;
  s = v.no_overlap();
  if (!s.ok()) return s;
  const KernelEntry kernel = find_kernel(op, v.dtype());
  if (!kernel)
    return Status(StatusCode::kNotBuilt,
                  cat("coda::", v.op(), ": this libcoda was built without the ", kernel_name(op, v.dtype()),
                      " kernel (it has: ", *built_kernel_list() ? built_kernel_list() : "no kernels",
                      "); reconfigure with -DCODA_BUILD_OPS=ON -DCODA_KERNELS=all and rebuild"));
  const size_t host = host_workspace_bytes(op, L.M, L.N);
  s = v.workspace(workspace, host + kernel.workspace_size(L.M, L.N, L.K));  // also checks its overlaps
  if (!s.ok()) return s;
  s = check_current_device(v.op());
  if (!s.ok()) return s;
  if (options.check_pointers) {
    s = check_pointers(v);
    if (!s.ok()) return s;
  }
  char* base = static_cast<char*>(workspace.data);
  if (host > 0) {  // the op's own part first, the kernel's after it
    L.workspace = base + host;
    L.workspace_bytes = workspace.bytes - host;
  } else {
    L.workspace = workspace.data;
    L.workspace_bytes = workspace.bytes;
  }
  const LaunchDefaults defaults = launch_defaults(op);
  L.sm_count = options.sm_count;
  L.max_swizzle = options.swizzle != 0 ? options.swizzle : defaults.swizzle;
  switch (options.raster) {
    case Raster::kAlongM: L.raster_order = 1; break;
    case Raster::kAlongN: L.raster_order = 2; break;
    case Raster::kHeuristic: L.raster_order = 0; break;
    default: L.raster_order = defaults.raster_order; break;  // kDefault
  }
  *kernel_out = kernel;
  *host_part = host > 0 ? base : nullptr;
  return Status();
}

Status run(const Validator& v, const KernelEntry& kernel, CodaLaunch& L, cudaStream_t stream) {
  char err[512] = {0};
  const int code = kernel.run(&L, static_cast<void*>(stream), err, sizeof(err));
  if (code == CODA_OK) return Status();
  return Status(static_cast<StatusCode>(code), cat("coda::", v.op(), ": ", err));
}

Status launch(Validator& v, Op op, CodaLaunch& L, const Workspace& workspace, cudaStream_t stream,
              const Options& options) {
  KernelEntry kernel;
  char* host_part = nullptr;
  Status s = prepare(v, op, L, workspace, options, &kernel, &host_part);
  if (!s.ok()) return s;
  return run(v, kernel, L, stream);
}

}  // namespace coda::detail
