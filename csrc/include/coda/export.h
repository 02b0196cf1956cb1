/* coda/export.h — symbol visibility of libcoda's public functions.
 *
 * libcoda is built with hidden visibility; only functions marked CODA_API are exported.
 * The kernels' own entry points (coda_<op>_<dtype>_run, see coda/abi.h) stay internal. */
#ifndef CODA_EXPORT_H
#define CODA_EXPORT_H

#if defined(_WIN32)
#  if defined(CODA_BUILDING_LIBRARY)
#    define CODA_API __declspec(dllexport)
#  else
#    define CODA_API __declspec(dllimport)
#  endif
#else
#  define CODA_API __attribute__((visibility("default")))
#endif

#endif /* CODA_EXPORT_H */
