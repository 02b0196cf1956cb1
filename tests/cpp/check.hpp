// tests/cpp/check.hpp — the few assertions libcoda's CTests need (no test framework to fetch).
#pragma once

#include <coda/coda.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace check {

inline int failures = 0;
inline int checks = 0;

inline void expect(bool ok, const char* what, const char* file, int line) {
  ++checks;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what);
  }
}

// `s` has `code` and its message contains every fragment.
inline void expect_status(const coda::Status& s, coda::StatusCode code, std::initializer_list<const char*> fragments,
                          const char* what, const char* file, int line) {
  ++checks;
  bool ok = s.code() == code;
  for (const char* f : fragments) ok = ok && std::strstr(s.message().c_str(), f) != nullptr;
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n  expected %s with", file, line, what, coda::status_code_name(code));
    for (const char* f : fragments) std::fprintf(stderr, " \"%s\"", f);
    std::fprintf(stderr, "\n  got      %s\n", s.to_string().c_str());
  } else if (std::getenv("CODA_TEST_VERBOSE")) {
    std::printf("  ok: %s\n", s.to_string().c_str());
  }
}

inline int finish(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace check

#define EXPECT(cond) ::check::expect(static_cast<bool>(cond), #cond, __FILE__, __LINE__)
#define EXPECT_STATUS(expr, code, ...) \
  ::check::expect_status((expr), (code), {__VA_ARGS__}, #expr, __FILE__, __LINE__)
