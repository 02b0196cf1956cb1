/* A C translation unit of the consumer: coda/coda.h compiles as C and links. */
#include <coda/coda.h>
#include <stdio.h>
#include <string.h>

int c_api_user(void) {
  int rc = coda_gemm(NULL, NULL, NULL, NULL, 0, NULL, NULL);
  printf("C API: %s: %s\n", coda_status_name(rc), coda_last_error_message());
  return rc == CODA_ERROR_INVALID_ARGUMENT && strstr(coda_last_error_message(), "A is NULL") != NULL ? 0 : 1;
}
