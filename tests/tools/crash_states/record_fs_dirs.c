// record_fs.c's directory operations: mkdir, rmdir, unlink, remove, rename (with its flags),
// hard links and truncate by path, each logged when it succeeded on a path under the root.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "record_fs.h"

REAL(int, truncate, const char*, off_t)
REAL(int, rename, const char*, const char*)
REAL(int, renameat, int, const char*, int, const char*)
REAL(int, renameat2, int, const char*, int, const char*, unsigned)
REAL(int, link, const char*, const char*)
REAL(int, linkat, int, const char*, int, const char*, int)
REAL(int, unlink, const char*)
REAL(int, unlinkat, int, const char*, int)
REAL(int, rmdir, const char*)
REAL(int, remove, const char*)
REAL(int, mkdir, const char*, mode_t)
REAL(int, mkdirat, int, const char*, mode_t)

// Logs a path operation that succeeded.
static int path_op(const char* op, const char* abs, int rc) {
  if (rc != 0) return rc;
  const int saved = errno;
  pthread_mutex_lock(&g_lock);
  log_line("%s\t%s", op, abs);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  return rc;
}

int truncate(const char* path, off_t len) {
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return get_truncate()(path, len);
  const int rc = get_truncate()(path, len);
  if (rc == 0) {
    pthread_mutex_lock(&g_lock);
    log_line("truncpath\t%s\t%lld", abs, (long long)len);
    pthread_mutex_unlock(&g_lock);
  }
  return rc;
}

int mkdirat(int dirfd, const char* path, mode_t mode) {
  char abs[PATH_MAX];
  if (!watched(dirfd, path, abs)) return get_mkdirat()(dirfd, path, mode);
  return path_op("mkdir", abs, get_mkdirat()(dirfd, path, mode));
}
int mkdir(const char* path, mode_t mode) {
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return get_mkdir()(path, mode);
  return path_op("mkdir", abs, get_mkdir()(path, mode));
}
int unlinkat(int dirfd, const char* path, int flags) {
  char abs[PATH_MAX];
  if (!watched(dirfd, path, abs)) return get_unlinkat()(dirfd, path, flags);
  return path_op((flags & AT_REMOVEDIR) ? "rmdir" : "unlink", abs, get_unlinkat()(dirfd, path, flags));
}
int unlink(const char* path) {
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return get_unlink()(path);
  return path_op("unlink", abs, get_unlink()(path));
}
int rmdir(const char* path) {
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return get_rmdir()(path);
  return path_op("rmdir", abs, get_rmdir()(path));
}
// glibc's remove() calls unlink or rmdir internally, out of this library's sight.
int remove(const char* path) {
  char abs[PATH_MAX];
  if (!watched(AT_FDCWD, path, abs)) return get_remove()(path);
  struct stat st;
  const int dir = lstat(path, &st) == 0 && S_ISDIR(st.st_mode);
  return path_op(dir ? "rmdir" : "unlink", abs, get_remove()(path));
}

static int two_paths(const char* op, int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                     char a[PATH_MAX], char b[PATH_MAX]) {
  if (g_log < 0 || !oldpath || !newpath) return 0;
  if (!resolve(olddirfd, oldpath, a) || !resolve(newdirfd, newpath, b)) return 0;
  const int ia = under_root(a), ib = under_root(b);
  if (ia != ib && strcmp(op, "link") != 0) {
    pthread_mutex_lock(&g_lock);
    log_line("outside\t%s\t%s", op, ia ? b : a);
    pthread_mutex_unlock(&g_lock);
    return 0;
  }
  return ib;
}

static int renamed(int rc, const char* a, const char* b, unsigned flags) {
  if (rc != 0) return rc;
  const int saved = errno;
  pthread_mutex_lock(&g_lock);
  log_line("rename\t%s\t%s\t%u", a, b, flags);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  return rc;
}

int renameat2(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, unsigned flags) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!two_paths("rename", olddirfd, oldpath, newdirfd, newpath, a, b))
    return get_renameat2()(olddirfd, oldpath, newdirfd, newpath, flags);
  return renamed(get_renameat2()(olddirfd, oldpath, newdirfd, newpath, flags), a, b, flags);
}
int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!two_paths("rename", olddirfd, oldpath, newdirfd, newpath, a, b))
    return get_renameat()(olddirfd, oldpath, newdirfd, newpath);
  return renamed(get_renameat()(olddirfd, oldpath, newdirfd, newpath), a, b, 0);
}
int rename(const char* oldpath, const char* newpath) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!two_paths("rename", AT_FDCWD, oldpath, AT_FDCWD, newpath, a, b)) return get_rename()(oldpath, newpath);
  return renamed(get_rename()(oldpath, newpath), a, b, 0);
}

// A link into the root from outside it: the source's bytes are saved as they are now, with
// its inode (the replayer checks that one linked twice did not change in between).
static int linked(int rc, const char* a, const char* b) {
  if (rc != 0) return rc;
  const int saved = errno;
  long long at = -1, len = 0;
  struct stat st = {0};
  if (!under_root(a)) {
    const int fd = (int)syscall(SYS_openat, AT_FDCWD, b, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) abort();
    char* buf = malloc((size_t)st.st_size + 1);
    if (!buf || pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) abort();
    syscall(SYS_close, fd);
    pthread_mutex_lock(&g_lock);
    at = put_data(buf, (size_t)st.st_size);
    len = st.st_size;
    pthread_mutex_unlock(&g_lock);
    free(buf);
  }
  pthread_mutex_lock(&g_lock);
  log_line("link\t%s\t%s\t%lld\t%lld\t%llu:%llu", a, b, at, len, (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
  pthread_mutex_unlock(&g_lock);
  errno = saved;
  return rc;
}

int linkat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath, int flags) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!two_paths("link", olddirfd, oldpath, newdirfd, newpath, a, b))
    return get_linkat()(olddirfd, oldpath, newdirfd, newpath, flags);
  return linked(get_linkat()(olddirfd, oldpath, newdirfd, newpath, flags), a, b);
}
int link(const char* oldpath, const char* newpath) {
  char a[PATH_MAX], b[PATH_MAX];
  if (!two_paths("link", AT_FDCWD, oldpath, AT_FDCWD, newpath, a, b)) return get_link()(oldpath, newpath);
  return linked(get_link()(oldpath, newpath), a, b);
}
