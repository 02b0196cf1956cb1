// The consumer of an installed libcoda: includes the installed headers, links coda::coda, and
// makes calls that need no GPU (argument validation, workspace query, version).
#include <coda/coda.hpp>

#include <cstdio>
#include <cstring>

extern "C" int c_api_user(void);  // c_api_user.c: the C header from C

int main() {
  std::printf("coda %s, kernels: %s\n", coda::version_string(), CODA_PACKAGE_KERNELS);
  const coda::DType bf16 = coda::DType::kBFloat16;
  alignas(16) static char fake[16];  // never dereferenced: the call fails validation first
  // K = 100 is not a multiple of 8: a Status with a message, nothing launched.
  coda::Status s = coda::gemm(coda::matrix(fake, bf16, 64, 100), coda::matrix(fake, bf16, 64, 100),
                              coda::matrix(fake, bf16, 64, 64), {}, nullptr);
  std::printf("expected failure: %s\n", s.to_string().c_str());
  int failures = 0;
  failures += s.code() != coda::StatusCode::kInvalidArgument;
  failures += std::strstr(s.message().c_str(), "multiple of 8") == nullptr;
  failures += std::strcmp(coda::version_string(), "0.1.0") != 0;
  failures += coda::gemm_workspace_size(bf16, 0, 64, 64) != 0;
  failures += c_api_user();
  std::printf("coda_consumer: %s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
