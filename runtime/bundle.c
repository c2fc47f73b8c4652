/* bundle.c -- the payload of a compiled training executable.
 *
 * Layout, appended to the ELF file (little-endian):
 *   "MOECSRC1", u32 n_sources, n x (u32 path_len, path, u64 text_len, text),
 *   u32 n_sets, n x (u32 name_len, name, u32 value_len, value),
 *   trailer: u64 payload_len, u32 crc32 of the payload, "MOECEXE1"
 */
#include "bundle.h"
#include "sbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define TRAILER_MAGIC "MOECEXE1"
#define PAYLOAD_MAGIC "MOECSRC1"
#define TRAILER_LEN 20

static void put_u32(sbuf *b, uint32_t v) {
  unsigned char x[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16), (unsigned char)(v >> 24)};
  sb_add(b, x, 4);
}

static void put_u64(sbuf *b, uint64_t v) {
  put_u32(b, (uint32_t)v);
  put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(sbuf *b, const char *s) {
  put_u32(b, (uint32_t)strlen(s));
  sb_add(b, s, strlen(s));
}

/* Reads the whole file at path. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  sbuf b = {0};
  char chunk[65536];
  size_t r;
  while ((r = fread(chunk, 1, sizeof chunk, f)) > 0) sb_add(&b, chunk, r);
  int bad = ferror(f) || b.oom;
  fclose(f);
  if (bad) {
    free(b.p);
    return NULL;
  }
  *len = b.n;
  return b.p;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* Length of this program's own binary, without any bundle already appended. */
static size_t plain_length(const char *exe, size_t len) {
  if (len >= TRAILER_LEN && memcmp(exe + len - 8, TRAILER_MAGIC, 8) == 0) {
    uint64_t payload = get_u64((const unsigned char *)exe + len - TRAILER_LEN);
    if (payload <= len - TRAILER_LEN) return len - TRAILER_LEN - (size_t)payload;
  }
  return len;
}

int bundle_write(const char *out, const moec_bundle *bd, char *err, size_t errlen) {
  size_t exe_len;
  char *exe = slurp("/proc/self/exe", &exe_len);
  if (!exe) {
    snprintf(err, errlen, "cannot read this program's own binary (/proc/self/exe): %s", strerror(errno));
    return -1;
  }
  sbuf b = {0};
  sb_add(&b, exe, plain_length(exe, exe_len));
  size_t start = b.n;
  sb_add(&b, PAYLOAD_MAGIC, 8);
  put_u32(&b, (uint32_t)bd->sources.n);
  for (int i = 0; i < bd->sources.n; i++) {
    put_str(&b, bd->sources.v[i].path);
    put_u64(&b, bd->sources.v[i].len);
    sb_add(&b, bd->sources.v[i].text, bd->sources.v[i].len);
  }
  put_u32(&b, (uint32_t)bd->n_sets);
  for (int i = 0; i < bd->n_sets; i++) {
    put_str(&b, bd->sets[i].name);
    put_str(&b, bd->sets[i].value);
  }
  size_t payload = b.n - start;
  uint32_t crc = b.oom ? 0 : (uint32_t)crc32(0L, (const Bytef *)b.p + start, (uInt)payload);
  put_u64(&b, payload);
  put_u32(&b, crc);
  sb_add(&b, TRAILER_MAGIC, 8);
  free(exe);
  if (b.oom) {
    free(b.p);
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  int rc = fd < 0 ? -1 : 0;
  for (size_t off = 0; rc == 0 && off < b.n;) {
    ssize_t w = write(fd, b.p + off, b.n - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) rc = -1;
    else off += (size_t)w;
  }
  if (rc == 0 && (fchmod(fd, 0755) != 0 || fsync(fd) != 0)) rc = -1;
  int e = errno;
  if (fd >= 0 && close(fd) != 0 && rc == 0) rc = -1, e = errno;
  if (rc == 0 && rename(tmp, out) != 0) rc = -1, e = errno;
  if (rc != 0) {
    unlink(tmp);
    snprintf(err, errlen, "cannot write '%s': %s", out, strerror(e));
  }
  free(b.p);
  return rc;
}

/* A bounds-checked reader over the payload. */
typedef struct {
  const unsigned char *p, *end;
  int bad;
} rd;

static const unsigned char *take(rd *r, uint64_t n) {
  if (r->bad || n > (uint64_t)(r->end - r->p)) {
    r->bad = 1;
    return NULL;
  }
  const unsigned char *q = r->p;
  r->p += n;
  return q;
}

static uint64_t take_uint(rd *r, int bytes) {
  const unsigned char *q = take(r, (uint64_t)bytes);
  uint64_t v = 0;
  for (int i = bytes - 1; q && i >= 0; i--) v = v << 8 | q[i];
  return v;
}

static char *take_str(rd *r, uint64_t n) {
  const unsigned char *q = take(r, n);
  char *s = q ? malloc((size_t)n + 1) : NULL;
  if (!s) {
    r->bad = 1;
    return NULL;
  }
  memcpy(s, q, (size_t)n);
  s[n] = 0;
  return s;
}

void bundle_free(moec_bundle *b) {
  moec_sources_free(&b->sources);
  for (int i = 0; i < b->n_sets; i++) {
    free((char *)b->sets[i].name);
    free((char *)b->sets[i].value);
  }
  free(b->sets);
  memset(b, 0, sizeof *b);
}

int bundle_read_self(moec_bundle *b, char *err, size_t errlen) {
  memset(b, 0, sizeof *b);
  /* only the 16-byte trailer is read unless it is there: plain moec starts fast */
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  struct stat st;
  unsigned char trailer[TRAILER_LEN];
  if (fd < 0) return 0;
  if (fstat(fd, &st) != 0 || st.st_size < TRAILER_LEN ||
      pread(fd, trailer, TRAILER_LEN, st.st_size - TRAILER_LEN) != TRAILER_LEN ||
      memcmp(trailer + 12, TRAILER_MAGIC, 8) != 0) {
    close(fd);
    return 0;
  }
  uint64_t payload = get_u64(trailer);
  uint32_t crc = (uint32_t)trailer[8] | (uint32_t)trailer[9] << 8 | (uint32_t)trailer[10] << 16 | (uint32_t)trailer[11] << 24;
  unsigned char *data = payload <= (uint64_t)st.st_size - TRAILER_LEN ? malloc((size_t)payload + 1) : NULL;
  int ok = data && pread(fd, data, (size_t)payload, st.st_size - TRAILER_LEN - (off_t)payload) == (ssize_t)payload &&
           (uint32_t)crc32(0L, data, (uInt)payload) == crc;
  close(fd);
  rd r = {data, data + (ok ? payload : 0), !ok};
  const unsigned char *magic = take(&r, 8);
  if (!magic || memcmp(magic, PAYLOAD_MAGIC, 8) != 0) r.bad = 1;
  uint32_t n = (uint32_t)take_uint(&r, 4);
  for (uint32_t i = 0; i < n && !r.bad; i++) {
    char *path = take_str(&r, take_uint(&r, 4));
    uint64_t tl = take_uint(&r, 8);
    const unsigned char *text = take(&r, tl);
    if (!r.bad && moec_sources_add(&b->sources, path, (const char *)text, (size_t)tl) != 0) r.bad = 1;
    free(path);
  }
  uint32_t ns = (uint32_t)take_uint(&r, 4);
  if (ns >= 4096) r.bad = 1;
  if (!r.bad && ns > 0 && !(b->sets = calloc(ns, sizeof *b->sets))) r.bad = 1;
  for (uint32_t i = 0; i < ns && !r.bad; i++) {
    char *name = take_str(&r, take_uint(&r, 4));
    char *value = name ? take_str(&r, take_uint(&r, 4)) : NULL;
    b->sets[b->n_sets++] = (moec_set){name, value};
    if (!value) r.bad = 1;
  }
  int bad = r.bad || r.p != r.end || b->sources.n == 0;
  free(data);
  if (bad) {
    bundle_free(b);
    snprintf(err, errlen, "this executable's embedded model is damaged; compile it again with 'moec compile'");
    return -1;
  }
  return 1;
}
