// benchmarks/initcheck_probe.cu — does compute-sanitizer's initcheck see what Hopper's bulk-copy
// (TMA) engine writes and reads? benchmarks/sanitize.py builds this with nvcc (sm_90a) and runs it
// once plain (the values) and once under `compute-sanitizer --tool initcheck` (the reports).
//
// Each probe has its own fresh cudaMalloc buffer of 4 KB and its own kernel names, so a report is
// attributed by the kernel named in it and by its address:
//   st_global     written by plain st.global stores                       read_after_st_global
//   bulk_store    written by cp.async.bulk (1-D, shared -> global)         read_after_bulk_store
//   tma_store     written by cp.async.bulk.tensor.2d (fp32 tensor map),    read_after_tma_store
//                 then cp.async.bulk.wait_group 0
//   tma_store_3d  written as CUTLASS's SM90 epilogue writes D: a rank-3    read_after_tma_store_3d
//                 bf16 tensor map, cp.async.bulk.tensor.3d, then only
//                 cp.async.bulk.wait_group.read 0 before the kernel exits
//   unwritten     never written (the positive control)                     read_after_unwritten
//   tma_load      never written, read by a TMA tensor load (global ->      tma_load_from_unwritten
//                 shared), then copied out with st.global
// Every reader is one warp reading 32 4-byte words spread over the buffer, so a buffer that
// initcheck thinks uninitialized gives 32 device reports; the host then copies each buffer back
// with cudaMemcpy (initcheck checks that too, as a "Host API" access) and checks the values.
// Output: one line per probe,
//   probe <name> buffer 0x<address> bytes <n> values <ok|bad|n/a>
// and "probe done" last. Exit status 0 unless a CUDA call failed or the TMA load timed out.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kWords = 1024;                       // 4 KB per buffer
constexpr unsigned kBytes = kWords * sizeof(uint32_t);
constexpr int kRows = 16;                          // the 2-D/3-D views: 16 rows of 256 bytes
constexpr int kColsF32 = 64;
constexpr int kColsB16 = 128;

#define CHECK(call)                                                                                    \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      std::printf("probe error %s at line %d: %s\n", #call, __LINE__, cudaGetErrorString(e_));         \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

__host__ __device__ uint32_t f32_word(int i) {  // the bits of float(i)
  union { float f; uint32_t u; } v;
  v.f = float(i);
  return v.u;
}
__host__ __device__ uint32_t u16_word(int i) { return uint32_t(2 * i) | (uint32_t(2 * i + 1) << 16); }

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

template <bool Halves>
__device__ void fill_shared(uint32_t* smem) {
  for (int i = threadIdx.x; i < kWords; i += blockDim.x) smem[i] = Halves ? u16_word(i) : f32_word(i);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes -> the async proxy
  __syncthreads();
}

__global__ void write_st_global(uint32_t* dst) {
  for (int i = threadIdx.x; i < kWords; i += blockDim.x) dst[i] = f32_word(i);
}

__global__ void write_bulk_store(uint32_t* dst) {
  __shared__ alignas(128) uint32_t smem[kWords];
  fill_shared<false>(smem);
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 :: "l"(dst), "r"(smem_addr(smem)), "r"(kBytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  __syncthreads();
}

__global__ void write_tma_store(const __grid_constant__ CUtensorMap map) {
  __shared__ alignas(128) uint32_t smem[kWords];
  fill_shared<false>(smem);
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(&map), "r"(0), "r"(0), "r"(smem_addr(smem)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }
  __syncthreads();
}

__global__ void write_tma_store_3d(const __grid_constant__ CUtensorMap map) {
  __shared__ alignas(128) uint32_t smem[kWords];
  fill_shared<true>(smem);
  if (threadIdx.x == 0) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(&map), "r"(0), "r"(0), "r"(0), "r"(smem_addr(smem)) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // as CUTLASS's tma_store_wait<0>
  }
  __syncthreads();
}

// A TMA tensor load of the whole box into shared memory, completed through an mbarrier (a bounded
// wait: a load that never lands sets *timed_out instead of hanging), then copied out.
__global__ void tma_load_from_unwritten(const __grid_constant__ CUtensorMap map, uint32_t* out, int* timed_out) {
  __shared__ alignas(128) uint32_t smem[kWords];
  __shared__ alignas(8) uint64_t bar;
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&bar)) : "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(&bar)), "r"(kBytes) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :: "r"(smem_addr(smem)), "l"(&map), "r"(0), "r"(0), "r"(smem_addr(&bar)) : "memory");
  }
  unsigned done = 0;
  for (long spin = 0; spin < (1L << 24) && !done; ++spin) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done) : "r"(smem_addr(&bar)) : "memory");
  }
  if (!done) {
    if (threadIdx.x == 0) *timed_out = 1;
    return;
  }
  for (int i = threadIdx.x; i < kWords; i += blockDim.x) out[i] = smem[i];
}

__device__ void read_sample(const uint32_t* src, uint32_t* sink) {
  const int lane = threadIdx.x & 31;
  sink[lane] = src[lane * (kWords / 32) + lane];  // one word of each 32-word stretch
}

__global__ void read_after_st_global(const uint32_t* src, uint32_t* sink) { read_sample(src, sink); }
__global__ void read_after_bulk_store(const uint32_t* src, uint32_t* sink) { read_sample(src, sink); }
__global__ void read_after_tma_store(const uint32_t* src, uint32_t* sink) { read_sample(src, sink); }
__global__ void read_after_tma_store_3d(const uint32_t* src, uint32_t* sink) { read_sample(src, sink); }
__global__ void read_after_unwritten(const uint32_t* src, uint32_t* sink) { read_sample(src, sink); }

bool make_map(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap* map, void* base, bool bf16_3d) {
  const cuuint32_t rank = bf16_3d ? 3 : 2;
  const cuuint64_t cols = bf16_3d ? kColsB16 : kColsF32;
  const cuuint64_t elem = bf16_3d ? 2 : 4;
  cuuint64_t dims[3] = {cols, kRows, 1};
  cuuint64_t strides[2] = {cols * elem, cols * elem * kRows};  // bytes, dimensions 1.. (rank - 1)
  cuuint32_t box[3] = {cuuint32_t(cols), kRows, 1};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  CUresult r = encode(map, bf16_3d ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, base,
                      dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("probe error cuTensorMapEncodeTiled returned %d\n", int(r));
  return r == CUDA_SUCCESS;
}

}  // namespace

int main() {
  int device = 0, major = 0;
  CHECK(cudaGetDevice(&device));
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) {
    std::printf("probe error needs an SM90 GPU (compute capability %d.x)\n", major);
    return 1;
  }
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (fn == nullptr || q != cudaDriverEntryPointSuccess) {
    std::printf("probe error cuTensorMapEncodeTiled not found\n");
    return 1;
  }
  auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);

  enum { kStGlobal, kBulk, kTma, kTma3d, kUnwritten, kTmaLoad, kProbes };
  const char* names[kProbes] = {"st_global", "bulk_store", "tma_store", "tma_store_3d", "unwritten", "tma_load"};
  uint32_t* buf[kProbes] = {};
  for (int i = 0; i < kProbes; ++i) CHECK(cudaMalloc(&buf[i], kBytes));
  uint32_t *sink = nullptr, *copied = nullptr;
  int* timed_out = nullptr;
  CHECK(cudaMalloc(&sink, 32 * sizeof(uint32_t)));
  CHECK(cudaMalloc(&copied, kBytes));
  CHECK(cudaMalloc(&timed_out, sizeof(int)));
  CHECK(cudaMemset(timed_out, 0, sizeof(int)));

  CUtensorMap store_map{}, store_map_3d{}, load_map{};
  if (!make_map(encode, &store_map, buf[kTma], false) || !make_map(encode, &store_map_3d, buf[kTma3d], true) ||
      !make_map(encode, &load_map, buf[kTmaLoad], false))
    return 1;

  write_st_global<<<1, 128>>>(buf[kStGlobal]);
  write_bulk_store<<<1, 128>>>(buf[kBulk]);
  write_tma_store<<<1, 128>>>(store_map);
  write_tma_store_3d<<<1, 128>>>(store_map_3d);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  read_after_st_global<<<1, 32>>>(buf[kStGlobal], sink);
  read_after_bulk_store<<<1, 32>>>(buf[kBulk], sink);
  read_after_tma_store<<<1, 32>>>(buf[kTma], sink);
  read_after_tma_store_3d<<<1, 32>>>(buf[kTma3d], sink);
  read_after_unwritten<<<1, 32>>>(buf[kUnwritten], sink);
  tma_load_from_unwritten<<<1, 128>>>(load_map, copied, timed_out);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  int stuck = 0;
  CHECK(cudaMemcpy(&stuck, timed_out, sizeof(int), cudaMemcpyDeviceToHost));
  std::vector<uint32_t> host(kWords);
  for (int i = 0; i < kProbes; ++i) {
    CHECK(cudaMemcpy(host.data(), buf[i], kBytes, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int j = 0; j < kWords; ++j) ok = ok && host[j] == (i == kTma3d ? u16_word(j) : f32_word(j));
    const char* verdict = i < kUnwritten ? (ok ? "ok" : "bad") : "n/a";
    std::printf("probe %s buffer %p bytes %u values %s\n", names[i], static_cast<void*>(buf[i]), kBytes, verdict);
  }
  if (stuck) std::printf("probe error the TMA load did not complete\n");
  for (int i = 0; i < kProbes; ++i) CHECK(cudaFree(buf[i]));
  CHECK(cudaFree(sink));
  CHECK(cudaFree(copied));
  CHECK(cudaFree(timed_out));
  std::printf("probe done\n");
  return stuck ? 1 : 0;
}
