// An LD_PRELOAD library that records the file-system operations a process makes under one
// directory, so that replay_crash_states.py can rebuild every state a crash could leave.
//
// Environment: STRATA_FSREC_ROOT (an absolute path without symbolic links; only operations
// on paths equal to it or under it are recorded) and STRATA_FSREC_LOG (the log; the bytes
// written go to STRATA_FSREC_LOG.data). Unset: the library records nothing.
//
// Log format, one line per completed (successful) operation, fields separated by tabs,
// paths absolute and lexically normalised (".", ".." and "//" resolved against the working
// directory or the directory fd; symbolic links are not followed):
//   open FD PATH CREATED TRUNCATED DIR   an fd opened on PATH; CREATED: O_CREAT made it;
//                                        TRUNCATED: O_TRUNC emptied an existing file
//   write FD OFFSET LEN DATAOFF          LEN bytes at OFFSET (write, pwrite, writev and
//                                        copy_file_range alike); the bytes are LEN bytes at
//                                        DATAOFF of the .data file
//   trunc FD LEN | truncpath PATH LEN    ftruncate, truncate
//   fsync FD | fdatasync FD | close FD | dup FD NEWFD
//   mkdir PATH | rmdir PATH | unlink PATH
//   rename OLD NEW FLAGS                 rename, renameat, renameat2 (FLAGS: 2 = exchange)
//   link OLD NEW DATAOFF LEN DEV:INO     a hard link; OLD may lie outside the root: its bytes
//                                        when linked are then LEN bytes at DATAOFF and its
//                                        inode DEV:INO (else -1 0 0:0)
//   outside OP PATH                      an operation the replayer cannot model (a rename
//                                        into or out of the root): it fails the replay
// Each fd opened under the root is remembered with its inode; a write to an fd whose inode
// changed since (closed and reused by a call this library does not see) is not recorded.
// The log is written in completion order under one lock: exact for the single thread that
// saves a checkpoint; concurrent savers would be recorded in an order, not the order.
// Calls glibc makes internally (remove() calling unlink, fopen, closedir) are not
// interposable, which is why remove() itself is wrapped. This file holds the state, the
// log, path resolution and the fd operations; record_fs_dirs.c the directory operations.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include "record_fs.h"

#define MAX_FDS 65536

char g_root[PATH_MAX];
size_t g_root_len;
int g_log = -1;
static int g_data = -1;
pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
  dev_t dev;
  ino_t ino;
  unsigned char tracked;
} g_fds[MAX_FDS];

REAL(int, open, const char*, int, ...)
REAL(int, open64, const char*, int, ...)
REAL(int, openat, int, const char*, int, ...)
REAL(int, openat64, int, const char*, int, ...)
REAL(int, __open_2, const char*, int)
REAL(int, __open64_2, const char*, int)
REAL(int, __openat_2, int, const char*, int)
REAL(int, __openat64_2, int, const char*, int)
REAL(ssize_t, write, int, const void*, size_t)
REAL(ssize_t, pwrite, int, const void*, size_t, off_t)
REAL(ssize_t, pwrite64, int, const void*, size_t, off64_t)
REAL(ssize_t, writev, int, const struct iovec*, int)
REAL(int, ftruncate, int, off_t)
REAL(int, ftruncate64, int, off64_t)
REAL(int, fsync, int)
REAL(int, fdatasync, int)
REAL(int, close, int)
REAL(ssize_t, copy_file_range, int, loff_t*, int, loff_t*, size_t, unsigned)

__attribute__((constructor)) static void record_init(void) {
  const char* root = getenv("STRATA_FSREC_ROOT");
  const char* log = getenv("STRATA_FSREC_LOG");
  if (!root || !log || root[0] != '/' || strlen(root) >= sizeof g_root || strlen(log) + 6 >= PATH_MAX) return;
  strcpy(g_root, root);
  g_root_len = strlen(g_root);
  while (g_root_len > 1 && g_root[g_root_len - 1] == '/') g_root[--g_root_len] = '\0';
  char data[PATH_MAX];
  snprintf(data, sizeof data, "%s.data", log);
  // Raw system calls: the wrappers below are not ready, and must not see these files.
  g_log = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  g_data = (int)syscall(SYS_openat, AT_FDCWD, data, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void put_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n > 0) {
    const ssize_t w = syscall(SYS_write, fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) abort();  // a recording with holes would replay wrong states
    c += w;
    n -= (size_t)w;
  }
}

// Appends a log line (the caller holds g_lock).
void log_line(const char* fmt, ...) {
  char line[3 * PATH_MAX + 128];
  va_list ap;
  va_start(ap, fmt);
  const int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0 || n >= (int)sizeof line - 1) abort();
  line[n] = '\n';
  put_all(g_log, line, (size_t)n + 1);
}

// Appends bytes to the .data file; returns where they start (the caller holds g_lock).
long long put_data(const void* p, size_t n) {
  const long long at = (long long)syscall(SYS_lseek, g_data, 0, SEEK_END);
  put_all(g_data, p, n);
  return at;
}

// The absolute, lexically normalised form of `path` relative to `dirfd`; 0 on failure.
int resolve(int dirfd, const char* path, char out[PATH_MAX]) {
  char raw[2 * PATH_MAX + 2];
  if (path[0] == '/') {
    snprintf(raw, sizeof raw, "%s", path);
  } else {
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
      if (!getcwd(base, sizeof base)) return 0;
    } else {
      char link[64];
      snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
      const ssize_t n = readlink(link, base, sizeof base - 1);
      if (n <= 0) return 0;
      base[n] = '\0';
    }
    snprintf(raw, sizeof raw, "%s/%s", base, path);
  }
  size_t len = 0;
  out[0] = '\0';
  for (char *save = NULL, *part = strtok_r(raw, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
    if (strcmp(part, ".") == 0) continue;
    if (strcmp(part, "..") == 0) {
      while (len > 0 && out[len] != '/') --len;
      out[len] = '\0';
      continue;
    }
    const size_t plen = strlen(part);
    if (len + plen + 2 >= PATH_MAX) return 0;
    out[len++] = '/';
    memcpy(out + len, part, plen + 1);
    len += plen;
  }
  if (len == 0) strcpy(out, "/");
  return 1;
}

int under_root(const char* abs) {
  return g_log >= 0 && strncmp(abs, g_root, g_root_len) == 0 && (abs[g_root_len] == '\0' || abs[g_root_len] == '/');
}

// Resolves `path` into `abs` and says whether the call is to be recorded.
int watched(int dirfd, const char* path, char abs[PATH_MAX]) {
  return g_log >= 0 && path && resolve(dirfd, path, abs) && under_root(abs);
}

static int fd_tracked(int fd) {
  if (g_log < 0 || fd < 0 || fd >= MAX_FDS || !g_fds[fd].tracked) return 0;
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == g_fds[fd].dev && st.st_ino == g_fds[fd].ino;
}

// An open under the root: before the call, whether the file exists and its size.
struct pending_open {
  int watched, existed;
  off_t size;
  char abs[PATH_MAX];
};

static void open_before(int dirfd, const char* path, struct pending_open* p) {
  p->watched = watched(dirfd, path, p->abs);
  if (!p->watched) return;
  struct stat st;
  p->existed = fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
  p->size = p->existed ? st.st_size : 0;
}

static int open_after(const struct pending_open* p, int flags, int fd) {
  if (!p->watched || fd < 0 || fd >= MAX_FDS) return fd;
  const int saved = errno;
  struct stat st;
  if (fstat(fd, &st) == 0) {
    const int created = (flags & O_CREAT) && !p->existed;
    const int truncated = p->existed && (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY && p->size > 0;
    pthread_mutex_lock(&g_lock);
    g_fds[fd].dev = st.st_dev;
    g_fds[fd].ino = st.st_ino;
    g_fds[fd].tracked = 1;
    log_line("open\t%d\t%s\t%d\t%d\t%d", fd, p->abs, created, truncated, S_ISDIR(st.st_mode) ? 1 : 0);
    pthread_mutex_unlock(&g_lock);
  }
  errno = saved;
  return fd;
}

static mode_t mode_of(int flags, va_list ap) { return (flags & (O_CREAT | __O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0; }

#define OPEN_WRAPPER(name)                                         \
  int name(const char* path, int flags, ...) {                     \
    va_list ap;                                                    \
    va_start(ap, flags);                                           \
    const mode_t mode = mode_of(flags, ap);                        \
    va_end(ap);                                                    \
    struct pending_open p;                                         \
    open_before(AT_FDCWD, path, &p);                               \
    return open_after(&p, flags, get_##name()(path, flags, mode)); \
  }
#define OPENAT_WRAPPER(name)                                              \
  int name(int dirfd, const char* path, int flags, ...) {                 \
    va_list ap;                                                           \
    va_start(ap, flags);                                                  \
    const mode_t mode = mode_of(flags, ap);                               \
    va_end(ap);                                                           \
    struct pending_open p;                                                \
    open_before(dirfd, path, &p);                                         \
    return open_after(&p, flags, get_##name()(dirfd, path, flags, mode)); \
  }
OPEN_WRAPPER(open)
OPEN_WRAPPER(open64)
OPENAT_WRAPPER(openat)
OPENAT_WRAPPER(openat64)

int __open_2(const char* path, int flags) {
  struct pending_open p;
  open_before(AT_FDCWD, path, &p);
  return open_after(&p, flags, get___open_2()(path, flags));
}
int __open64_2(const char* path, int flags) {
  struct pending_open p;
  open_before(AT_FDCWD, path, &p);
  return open_after(&p, flags, get___open64_2()(path, flags));
}
int __openat_2(int dirfd, const char* path, int flags) {
  struct pending_open p;
  open_before(dirfd, path, &p);
  return open_after(&p, flags, get___openat_2()(dirfd, path, flags));
}
int __openat64_2(int dirfd, const char* path, int flags) {
  struct pending_open p;
  open_before(dirfd, path, &p);
  return open_after(&p, flags, get___openat64_2()(dirfd, path, flags));
}
int creat(const char* path, mode_t mode) { return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode); }
int creat64(const char* path, mode_t mode) { return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode); }

// Records `n` bytes written to `fd` at `offset` (-1: they ended at the file position).
static void record_write(int fd, const void* buf, ssize_t n, long long offset) {
  if (n <= 0 || !fd_tracked(fd)) return;
  const int saved = errno;
  if (offset < 0) offset = (long long)lseek(fd, 0, SEEK_CUR) - n;
  pthread_mutex_lock(&g_lock);
  const long long at = put_data(buf, (size_t)n);
  log_line("write\t%d\t%lld\t%zd\t%lld", fd, offset, n, at);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
}

ssize_t write(int fd, const void* buf, size_t count) {
  const ssize_t n = get_write()(fd, buf, count);
  record_write(fd, buf, n, -1);
  return n;
}
ssize_t pwrite(int fd, const void* buf, size_t count, off_t offset) {
  const ssize_t n = get_pwrite()(fd, buf, count, offset);
  record_write(fd, buf, n, offset);
  return n;
}
ssize_t pwrite64(int fd, const void* buf, size_t count, off64_t offset) {
  const ssize_t n = get_pwrite64()(fd, buf, count, offset);
  record_write(fd, buf, n, offset);
  return n;
}
ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  const ssize_t n = get_writev()(fd, iov, iovcnt);
  if (n <= 0 || !fd_tracked(fd)) return n;
  char* flat = malloc((size_t)n);
  if (!flat) abort();
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < (size_t)n; ++i) {
    const size_t take = iov[i].iov_len < (size_t)n - done ? iov[i].iov_len : (size_t)n - done;
    memcpy(flat + done, iov[i].iov_base, take);
    done += take;
  }
  record_write(fd, flat, n, -1);
  free(flat);
  return n;
}

// The bytes copy_file_range moved are read back from the source at the offset they came from.
ssize_t copy_file_range(int in, loff_t* in_off, int out, loff_t* out_off, size_t len, unsigned flags) {
  const long long in_at = in_off ? *in_off : (long long)lseek(in, 0, SEEK_CUR);
  const long long out_at = out_off ? *out_off : (long long)lseek(out, 0, SEEK_CUR);
  const ssize_t n = get_copy_file_range()(in, in_off, out, out_off, len, flags);
  if (n <= 0 || !fd_tracked(out)) return n;
  const int saved = errno;
  char* buf = malloc((size_t)n);
  if (!buf || pread(in, buf, (size_t)n, in_at) != n) abort();
  record_write(out, buf, n, out_at);
  free(buf);
  errno = saved;
  return n;
}

// Logs "OP\tFD[\tARG]" when fd is tracked and rc says the call succeeded.
static int fd_op(const char* op, int fd, int rc, long long arg, int with_arg) {
  if (rc != 0 || !fd_tracked(fd)) return rc;
  const int saved = errno;
  pthread_mutex_lock(&g_lock);
  if (with_arg)
    log_line("%s\t%d\t%lld", op, fd, arg);
  else
    log_line("%s\t%d", op, fd);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  return rc;
}

int ftruncate(int fd, off_t len) { return fd_op("trunc", fd, get_ftruncate()(fd, len), len, 1); }
int ftruncate64(int fd, off64_t len) { return fd_op("trunc", fd, get_ftruncate64()(fd, len), len, 1); }
int fsync(int fd) { return fd_op("fsync", fd, get_fsync()(fd), 0, 0); }
int fdatasync(int fd) { return fd_op("fdatasync", fd, get_fdatasync()(fd), 0, 0); }

int close(int fd) {
  const int tracked = fd_tracked(fd);
  const int rc = get_close()(fd);
  if (tracked) {
    const int saved = errno;
    pthread_mutex_lock(&g_lock);
    g_fds[fd].tracked = 0;
    log_line("close\t%d", fd);  // logged even if close failed: the fd is gone either way
    pthread_mutex_unlock(&g_lock);
    errno = saved;
  }
  return rc;
}

// A duplicated fd names the same open file: "dup OLD NEW" (the replayer copies the mapping).
static int duped(int oldfd, int newfd) {
  if (newfd < 0 || newfd >= MAX_FDS || oldfd == newfd) return newfd;
  const int saved = errno;
  const int tracked = fd_tracked(oldfd);
  pthread_mutex_lock(&g_lock);
  if (g_fds[newfd].tracked) log_line("close\t%d", newfd);  // dup2 closed it
  g_fds[newfd] = g_fds[oldfd];
  g_fds[newfd].tracked = (unsigned char)tracked;
  if (tracked) log_line("dup\t%d\t%d", oldfd, newfd);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  return newfd;
}
REAL(int, dup, int)
REAL(int, dup2, int, int)
REAL(int, dup3, int, int, int)
int dup(int fd) { return duped(fd, get_dup()(fd)); }
int dup2(int fd, int to) { return duped(fd, get_dup2()(fd, to)); }
int dup3(int fd, int to, int flags) { return duped(fd, get_dup3()(fd, to, flags)); }
