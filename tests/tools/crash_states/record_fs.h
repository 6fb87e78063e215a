// The recorder's internals shared by record_fs.c (state, the log, paths, fd operations) and
// record_fs_dirs.c (directory operations); hidden, so the process sees only the wrappers.
#pragma once

#include <limits.h>
#include <pthread.h>
#include <stddef.h>

#pragma GCC visibility push(hidden)
extern char g_root[PATH_MAX];
extern size_t g_root_len;
extern int g_log;               // the log's fd; -1: nothing is recorded
extern pthread_mutex_t g_lock;  // held while a log line or its data is written

// Appends a log line (the caller holds g_lock); aborts on failure, since a recording
// with holes would replay wrong states.
void log_line(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Appends bytes to the .data file; returns where they start (the caller holds g_lock).
long long put_data(const void* p, size_t n);
// The absolute, lexically normalised form of `path` relative to `dirfd`; 0 on failure.
int resolve(int dirfd, const char* path, char out[PATH_MAX]);
int under_root(const char* abs);
// Resolves `path` into `abs` and says whether the call is to be recorded.
int watched(int dirfd, const char* path, char abs[PATH_MAX]);
#pragma GCC visibility pop

// The real function `name` (the next definition after this library), looked up once.
#define REAL(ret, name, ...)                                           \
  static ret (*real_##name)(__VA_ARGS__);                              \
  static ret (*get_##name(void))(__VA_ARGS__) {                        \
    if (!real_##name) *(void**)&real_##name = dlsym(RTLD_NEXT, #name); \
    return real_##name;                                                \
  }
