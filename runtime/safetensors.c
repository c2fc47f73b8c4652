/* safetensors.c -- safetensors reader/writer and the strict JSON parser (see safetensors.h). */
#include "safetensors.h"
#include "sbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "moec's safetensors code assumes a little-endian host"
#endif

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* ================================================================ dtypes */

static const struct {
  const char *name;
  size_t size;
} dtypes[ST_DTYPE_COUNT] = {
  [ST_BOOL] = {"BOOL", 1},       [ST_U8] = {"U8", 1},       [ST_I8] = {"I8", 1},
  [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
  [ST_F8_E8M0] = {"F8_E8M0", 1}, [ST_I16] = {"I16", 2},     [ST_U16] = {"U16", 2},
  [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},   [ST_I32] = {"I32", 4},
  [ST_U32] = {"U32", 4},         [ST_F32] = {"F32", 4},     [ST_I64] = {"I64", 8},
  [ST_U64] = {"U64", 8},         [ST_F64] = {"F64", 8},     [ST_C64] = {"C64", 8},
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == ST_DTYPE_COUNT, "one row per dtype");

const char *st_dtype_name(st_dtype t) {
  return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].name : "?";
}
size_t st_dtype_size(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtypes[t].size : 0; }
int st_dtype_parse(const char *s, st_dtype *out) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++)
    if (strcmp(s, dtypes[i].name) == 0) {
      *out = (st_dtype)i;
      return 1;
    }
  return 0;
}

uint16_t st_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float st_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float st_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else { /* subnormal: renormalise */
      exp = 127 - 15 + 1;
      while (!(man & 0x400u)) {
        man <<= 1;
        exp--;
      }
      man &= 0x3ffu;
      u = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t len) {
  size_t k = 0;
  if (len == 0) return buf;
  buf[0] = 0;
  k += (size_t)snprintf(buf + k, len - k, "[");
  for (int i = 0; i < ndim && k < len; i++)
    k += (size_t)snprintf(buf + k, len - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (k < len) snprintf(buf + k, len - k, "]");
  return buf;
}

/* numel of a shape; -1 on a negative dimension or int64 overflow */
static int64_t shape_numel(const int64_t *shape, int ndim) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) return -1;
    if (shape[i] == 0) n = 0; /* keep checking the other dims for negatives */
    else if (n > INT64_MAX / shape[i]) return -1;
    else n *= shape[i];
  }
  return n;
}

/* ================================================================ JSON */

typedef struct {
  const char *s;
  size_t len, pos;
  char *err;
  size_t errlen;
  int failed, depth;
} jparser;

#define JSON_MAX_DEPTH 64
#define JSON_MAX_NUMBER 512

static void jfail(jparser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jfail(jparser *p, const char *fmt, ...) {
  if (p->failed) return;
  p->failed = 1;
  if (!p->err || !p->errlen) return;
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  seterr(p->err, p->errlen, "byte %zu: %s", p->pos, msg);
}

static void jskip_ws(jparser *p) {
  while (p->pos < p->len) {
    char c = p->s[p->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    p->pos++;
  }
}

static void json_clear(st_json *j) {
  if (!j) return;
  if (j->type == ST_JSON_STR) free(j->s);
  if (j->type == ST_JSON_ARR || j->type == ST_JSON_OBJ) {
    for (size_t i = 0; i < j->n; i++) {
      json_clear(&j->items[i]);
      if (j->keys) free(j->keys[i]);
    }
    free(j->items);
    free(j->keys);
  }
  memset(j, 0, sizeof *j);
}

void st_json_free(st_json *j) {
  json_clear(j);
  free(j);
}

const char *st_json_type_name(st_json_type t) {
  static const char *names[] = {"null", "a boolean", "an integer", "a number",
                                "a string", "an array", "an object"};
  return (unsigned)t <= ST_JSON_OBJ ? names[t] : "?";
}

const st_json *st_json_get(const st_json *obj, const char *key) {
  if (!obj || obj->type != ST_JSON_OBJ) return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
  return NULL;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int jread_hex4(jparser *p, unsigned *out) {
  if (p->len - p->pos < 4) {
    jfail(p, "truncated \\u escape");
    return 0;
  }
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(p->s[p->pos + (size_t)i]);
    if (h < 0) {
      jfail(p, "bad hex digit in \\u escape");
      return 0;
    }
    v = v * 16 + (unsigned)h;
  }
  p->pos += 4;
  *out = v;
  return 1;
}

/* length of a valid UTF-8 sequence at s[0..avail), or 0 if invalid */
static size_t utf8_len(const unsigned char *s, size_t avail) {
  unsigned c = s[0];
  size_t n;
  unsigned min, cp;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, min = 0x80, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, min = 0x800, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, min = 0x10000, cp = c & 0x07;
  else return 0;
  if (avail < n) return 0;
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

static char *jparse_string(jparser *p) {
  /* at the opening quote */
  p->pos++;
  size_t cap = 16, n = 0;
  char *out = malloc(cap);
  if (!out) {
    jfail(p, "out of memory");
    return NULL;
  }
  for (;;) {
    if (p->pos >= p->len) {
      jfail(p, "unterminated string");
      break;
    }
    unsigned char c = (unsigned char)p->s[p->pos];
    char enc[4];
    size_t k = 0;
    if (c == '"') {
      p->pos++;
      out[n] = 0;
      return out;
    } else if (c < 0x20) {
      jfail(p, "control character 0x%02x inside a string", c);
      break;
    } else if (c == '\\') {
      if (p->pos + 1 >= p->len) {
        jfail(p, "unterminated escape");
        break;
      }
      char e = p->s[p->pos + 1];
      p->pos += 2;
      switch (e) {
      case '"': enc[k++] = '"'; break;
      case '\\': enc[k++] = '\\'; break;
      case '/': enc[k++] = '/'; break;
      case 'b': enc[k++] = '\b'; break;
      case 'f': enc[k++] = '\f'; break;
      case 'n': enc[k++] = '\n'; break;
      case 'r': enc[k++] = '\r'; break;
      case 't': enc[k++] = '\t'; break;
      case 'u': {
        unsigned cp;
        if (!jread_hex4(p, &cp)) goto fail;
        if (cp >= 0xdc00 && cp <= 0xdfff) {
          jfail(p, "lone low surrogate in \\u escape");
          goto fail;
        }
        if (cp >= 0xd800 && cp <= 0xdbff) {
          unsigned lo;
          if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
            jfail(p, "high surrogate not followed by a low surrogate");
            goto fail;
          }
          p->pos += 2;
          if (!jread_hex4(p, &lo)) goto fail;
          if (lo < 0xdc00 || lo > 0xdfff) {
            jfail(p, "high surrogate not followed by a low surrogate");
            goto fail;
          }
          cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) {
          jfail(p, "\\u0000 is not allowed in a string");
          goto fail;
        }
        if (cp < 0x80) enc[k++] = (char)cp;
        else if (cp < 0x800) {
          enc[k++] = (char)(0xc0 | (cp >> 6));
          enc[k++] = (char)(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
          enc[k++] = (char)(0xe0 | (cp >> 12));
          enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
          enc[k++] = (char)(0x80 | (cp & 0x3f));
        } else {
          enc[k++] = (char)(0xf0 | (cp >> 18));
          enc[k++] = (char)(0x80 | ((cp >> 12) & 0x3f));
          enc[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
          enc[k++] = (char)(0x80 | (cp & 0x3f));
        }
        break;
      }
      default:
        p->pos--;
        jfail(p, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
        goto fail;
      }
    } else {
      size_t ul = utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
      if (!ul) {
        jfail(p, "invalid UTF-8 in a string");
        break;
      }
      memcpy(enc, p->s + p->pos, ul);
      k = ul;
      p->pos += ul;
    }
    if (n + k + 1 > cap) {
      cap *= 2;
      char *nb = realloc(out, cap);
      if (!nb) {
        jfail(p, "out of memory");
        break;
      }
      out = nb;
    }
    memcpy(out + n, enc, k);
    n += k;
  }
fail:
  free(out);
  return NULL;
}

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) { c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }
static locale_t get_c_locale(void) {
  pthread_once(&c_locale_once, c_locale_init);
  return c_locale;
}

int st_json_fmt_double(double d, char *buf, size_t len) {
  if (!isfinite(d)) return -1;
  locale_t loc = get_c_locale(), old = loc ? uselocale(loc) : (locale_t)0;
  snprintf(buf, len, "%.17g", d);
  if (loc) uselocale(old);
  return 0;
}

static void jparse_number(jparser *p, st_json *out) {
  size_t start = p->pos, i = p->pos;
  const char *s = p->s;
  int is_int = 1;
  if (i < p->len && s[i] == '-') i++;
  if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) {
    jfail(p, "invalid number");
    return;
  }
  if (s[i] == '0') {
    i++;
    if (i < p->len && s[i] >= '0' && s[i] <= '9') {
      jfail(p, "leading zero in a number");
      return;
    }
  } else {
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < p->len && s[i] == '.') {
    is_int = 0;
    i++;
    if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) {
      p->pos = i;
      jfail(p, "digit expected after '.'");
      return;
    }
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
    is_int = 0;
    i++;
    if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
    if (i >= p->len || !(s[i] >= '0' && s[i] <= '9')) {
      p->pos = i;
      jfail(p, "digit expected in exponent");
      return;
    }
    while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
  }
  size_t nlen = i - start;
  if (nlen >= JSON_MAX_NUMBER) {
    jfail(p, "number too long");
    return;
  }
  char buf[JSON_MAX_NUMBER];
  memcpy(buf, s + start, nlen);
  buf[nlen] = 0;
  if (is_int) {
    int neg = buf[0] == '-';
    uint64_t v = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    int ovf = 0;
    for (size_t k = (size_t)neg; k < nlen; k++) {
      unsigned dgt = (unsigned)(buf[k] - '0');
      if (v > (lim - dgt) / 10) {
        ovf = 1;
        break;
      }
      v = v * 10 + dgt;
    }
    if (!ovf) {
      out->type = ST_JSON_INT;
      out->i = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
      out->d = (double)out->i;
      p->pos = i;
      return;
    }
  }
  locale_t loc = get_c_locale();
  double d = loc ? strtod_l(buf, NULL, loc) : strtod(buf, NULL);
  if (!isfinite(d)) {
    jfail(p, "number out of range");
    return;
  }
  out->type = ST_JSON_NUM;
  out->d = d;
  p->pos = i;
}

static int jlit(jparser *p, const char *lit) {
  size_t n = strlen(lit);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, lit, n) != 0) return 0;
  p->pos += n;
  return 1;
}

static int jappend(jparser *p, st_json *arr, size_t *cap, const st_json *item, char *key) {
  if (arr->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 4;
    st_json *ni = realloc(arr->items, nc * sizeof *ni);
    if (!ni) goto oom;
    arr->items = ni;
    if (arr->type == ST_JSON_OBJ) {
      char **nk = realloc(arr->keys, nc * sizeof *nk);
      if (!nk) goto oom;
      arr->keys = nk;
    }
    *cap = nc;
  }
  arr->items[arr->n] = *item;
  if (arr->type == ST_JSON_OBJ) arr->keys[arr->n] = key;
  arr->n++;
  return 1;
oom:
  jfail(p, "out of memory");
  return 0;
}

static void jparse_value(jparser *p, st_json *out) {
  memset(out, 0, sizeof *out);
  jskip_ws(p);
  if (p->pos >= p->len) {
    jfail(p, "unexpected end of JSON");
    return;
  }
  char c = p->s[p->pos];
  if (c == '{' || c == '[') {
    int obj = c == '{';
    char close = obj ? '}' : ']';
    size_t cap = 0;
    if (++p->depth > JSON_MAX_DEPTH) {
      jfail(p, "nesting deeper than %d", JSON_MAX_DEPTH);
      return;
    }
    out->type = obj ? ST_JSON_OBJ : ST_JSON_ARR;
    p->pos++;
    jskip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++;
      p->depth--;
      return;
    }
    for (;;) {
      char *key = NULL;
      st_json item;
      jskip_ws(p);
      if (obj) {
        if (p->pos >= p->len || p->s[p->pos] != '"') {
          jfail(p, p->pos >= p->len ? "unexpected end of JSON" : "object key (a string) expected");
          return;
        }
        key = jparse_string(p);
        if (!key) return;
        for (size_t k = 0; k < out->n; k++)
          if (strcmp(out->keys[k], key) == 0) {
            jfail(p, "duplicate key \"%.64s\"", key);
            free(key);
            return;
          }
        jskip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
          free(key);
          jfail(p, "':' expected after an object key");
          return;
        }
        p->pos++;
      }
      jparse_value(p, &item);
      if (p->failed || !jappend(p, out, &cap, &item, key)) {
        json_clear(&item);
        free(key);
        return;
      }
      jskip_ws(p);
      if (p->pos >= p->len) {
        jfail(p, "unexpected end of JSON");
        return;
      }
      if (p->s[p->pos] == ',') {
        p->pos++;
        jskip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == close) {
          jfail(p, "trailing comma");
          return;
        }
        continue;
      }
      if (p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return;
      }
      jfail(p, obj ? "',' or '}' expected" : "',' or ']' expected");
      return;
    }
  }
  if (c == '"') {
    char *s = jparse_string(p);
    if (!s) return;
    out->type = ST_JSON_STR;
    out->s = s;
    return;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    jparse_number(p, out);
    return;
  }
  if (jlit(p, "true")) {
    out->type = ST_JSON_BOOL;
    out->b = 1;
    return;
  }
  if (jlit(p, "false")) {
    out->type = ST_JSON_BOOL;
    return;
  }
  if (jlit(p, "null")) {
    out->type = ST_JSON_NULL;
    return;
  }
  jfail(p, "unexpected character '%c'", c >= 0x20 && c < 0x7f ? c : '?');
}

st_json *st_json_parse(const char *text, size_t len, char *err, size_t errlen) {
  jparser p = {.s = text, .len = len, .err = err, .errlen = errlen};
  st_json *j = calloc(1, sizeof *j);
  if (!j) {
    seterr(err, errlen, "out of memory");
    return NULL;
  }
  jparse_value(&p, j);
  if (!p.failed) {
    jskip_ws(&p);
    if (p.pos != p.len) jfail(&p, "trailing characters after the JSON value");
  }
  if (p.failed) {
    st_json_free(j);
    return NULL;
  }
  return j;
}

size_t st_json_quote(const char *s, char *buf, size_t len) {
  size_t k = 0;
#define PUT(ch)                                                                                    \
  do {                                                                                             \
    if (k + 1 < len) buf[k] = (ch);                                                                \
    k++;                                                                                           \
  } while (0)
  PUT('"');
  for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
    if (*u == '"' || *u == '\\') {
      PUT('\\');
      PUT((char)*u);
    } else if (*u < 0x20) {
      static const char hex[] = "0123456789abcdef";
      PUT('\\');
      PUT('u');
      PUT('0');
      PUT('0');
      PUT(hex[*u >> 4]);
      PUT(hex[*u & 15]);
    } else {
      PUT((char)*u);
    }
  }
  PUT('"');
#undef PUT
  if (len) buf[k < len ? k : len - 1] = 0;
  return k;
}

/* ================================================================ writing */

static int valid_utf8(const char *s) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n;) {
    size_t k = utf8_len((const unsigned char *)s + i, n - i);
    if (!k) return 0;
    i += k;
  }
  return 1;
}


static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    size_t chunk = n > (1u << 30) ? (1u << 30) : n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (w == 0) {
      errno = ENOSPC;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* directory part of path ("." when none), into buf */
static void dir_of(const char *path, char *buf, size_t len) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(buf, len, ".");
  else if (slash == path) snprintf(buf, len, "/");
  else snprintf(buf, len, "%.*s", (int)(slash - path), path);
}

int st_fsync_dir(const char *dir, char *err, size_t errlen) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    seterr(err, errlen, "%s: cannot open directory to fsync it: %s", dir, strerror(errno));
    return -1;
  }
  if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
    int e = errno;
    close(fd);
    seterr(err, errlen, "%s: fsync of the directory failed: %s", dir, strerror(e));
    return -1;
  }
  close(fd);
  return 0;
}

/* The atomic-write machinery: open a fresh temporary next to path, let fill() write it,
 * fsync, close, rename over path, fsync the directory. */
typedef int (*fill_fn)(int fd, void *ctx, const char *tmp, const char *path, char *err,
                       size_t errlen);

static int atomic_write(const char *path, fill_fn fill, void *ctx, char *err, size_t errlen) {
  char dir[4096], tmp[4096 + 64];
  static unsigned counter;
  if (strlen(path) >= sizeof dir) {
    seterr(err, errlen, "%.200s...: path too long", path);
    return -1;
  }
  dir_of(path, dir, sizeof dir);
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  if (!*base) {
    seterr(err, errlen, "%s: not a file name (ends with '/')", path);
    return -1;
  }
  int fd = -1;
  for (int tries = 0; tries < 100 && fd < 0; tries++) {
    unsigned c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld-%u", dir, base, (long)getpid(), c);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    int e = errno;
    struct stat sb;
    if (stat(dir, &sb) != 0)
      seterr(err, errlen, "%s: cannot write: directory %s does not exist", path, dir);
    else
      seterr(err, errlen, "%s: cannot create a temporary file in %s: %s%s", path, dir,
             strerror(e), e == EACCES || e == EROFS ? " (is the directory writable?)" : "");
    return -1;
  }
  if (fill(fd, ctx, tmp, path, err, errlen) != 0) goto fail_open;
  if (fsync(fd) != 0) {
    seterr(err, errlen, "%s: fsync failed: %s (disk full or I/O error?)", path, strerror(errno));
    goto fail_open;
  }
  if (close(fd) != 0) {
    fd = -1;
    seterr(err, errlen, "%s: close failed: %s", path, strerror(errno));
    goto fail;
  }
  fd = -1;
  if (rename(tmp, path) != 0) {
    seterr(err, errlen, "%s: cannot rename the temporary file into place: %s", path,
           strerror(errno));
    goto fail;
  }
  return st_fsync_dir(dir, err, errlen);
fail_open:
  close(fd);
fail:
  unlink(tmp);
  return -1;
}

static int fill_buffer(int fd, void *ctx, const char *tmp, const char *path, char *err,
                       size_t errlen) {
  (void)tmp;
  const struct {
    const void *p;
    size_t n;
  } *b = ctx;
  if (write_all(fd, b->p, b->n) != 0) {
    seterr(err, errlen, "%s: write failed: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int st_write_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen) {
  struct {
    const void *p;
    size_t n;
  } b = {buf, len};
  return atomic_write(path, fill_buffer, &b, err, errlen);
}

typedef struct {
  const st_tensor *t;
  size_t n;
  size_t *order;      /* data order */
  uint64_t *nbytes;   /* per tensor, file bytes */
  sbuf header;
} st_wctx;

static int fill_safetensors(int fd, void *vctx, const char *tmp, const char *path, char *err,
                            size_t errlen) {
  (void)tmp;
  st_wctx *c = vctx;
  void *buf = NULL; /* the produced tensors', one at a time */
  size_t buf_cap = 0;
  unsigned char len8[8];
  uint64_t hn = c->header.n;
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hn >> (8 * i));
  if (write_all(fd, len8, 8) != 0 || write_all(fd, c->header.p, c->header.n) != 0) goto werr;
  uint16_t conv[8192];
  for (size_t k = 0; k < c->n; k++) {
    const st_tensor *t = &c->t[c->order[k]];
    uint64_t nb = c->nbytes[c->order[k]];
    if (nb == 0) continue;
    if (!t->data) {
      if (nb > buf_cap) {
        void *nbuf = realloc(buf, (size_t)nb);
        if (!nbuf) {
          free(buf);
          seterr(err, errlen, "%s: out of memory for tensor '%s' (%llu bytes)", path, t->name, (unsigned long long)nb);
          return -1;
        }
        buf = nbuf, buf_cap = (size_t)nb;
      }
      char perr[512] = "";
      if (t->produce(t->produce_ctx, buf, nb, perr, sizeof perr) != 0) {
        free(buf);
        seterr(err, errlen, "%s: tensor '%s': %s", path, t->name, perr);
        return -1;
      }
      if (write_all(fd, buf, (size_t)nb) != 0) goto werr;
      continue;
    }
    if (t->from_f32 && t->dtype == ST_BF16) {
      const float *src = t->data;
      size_t numel = (size_t)(nb / 2);
      for (size_t i = 0; i < numel;) {
        size_t m = numel - i < 8192 ? numel - i : 8192;
        for (size_t j = 0; j < m; j++) conv[j] = st_f32_to_bf16(src[i + j]);
        if (write_all(fd, conv, m * 2) != 0) goto werr;
        i += m;
      }
    } else {
      if (write_all(fd, t->data, (size_t)nb) != 0) goto werr;
    }
  }
  free(buf);
  return 0;
werr:
  seterr(err, errlen, "%s: write failed: %s", path, strerror(errno));
  free(buf);
  return -1;
}

int st_write(const char *path, const st_tensor *tensors, size_t n, const st_kv *meta,
             size_t n_meta, char *err, size_t errlen) {
  st_wctx c = {.t = tensors, .n = n};
  int rc = -1;
  c.order = malloc((n ? n : 1) * sizeof *c.order);
  c.nbytes = malloc((n ? n : 1) * sizeof *c.nbytes);
  if (!c.order || !c.nbytes) {
    seterr(err, errlen, "%s: out of memory", path);
    goto out;
  }
  /* validate */
  for (size_t i = 0; i < n; i++) {
    const st_tensor *t = &tensors[i];
    const char *nm = t->name ? t->name : "(null)";
    if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0 || !valid_utf8(t->name)) {
      seterr(err, errlen, "%s: tensor %zu has an invalid name \"%s\"", path, i, nm);
      goto out;
    }
    if ((unsigned)t->dtype >= ST_DTYPE_COUNT) {
      seterr(err, errlen, "%s: tensor '%s': invalid dtype %d", path, nm, (int)t->dtype);
      goto out;
    }
    if (t->from_f32 && t->dtype != ST_F32 && t->dtype != ST_BF16) {
      seterr(err, errlen, "%s: tensor '%s': cannot convert f32 to %s (only F32, BF16)", path, nm,
             st_dtype_name(t->dtype));
      goto out;
    }
    if (t->ndim < 0 || t->ndim > ST_MAX_DIMS) {
      seterr(err, errlen, "%s: tensor '%s': %d dimensions (at most %d)", path, nm, t->ndim,
             ST_MAX_DIMS);
      goto out;
    }
    int64_t numel = shape_numel(t->shape, t->ndim);
    size_t es = st_dtype_size(t->dtype);
    char sh[160];
    if (numel < 0 || (uint64_t)numel > UINT64_MAX / 8) {
      seterr(err, errlen, "%s: tensor '%s': invalid shape %s", path, nm,
             st_shape_str(t->shape, t->ndim, sh, sizeof sh));
      goto out;
    }
    c.nbytes[i] = (uint64_t)numel * es;
    if (t->produce && (t->data || t->from_f32)) {
      seterr(err, errlen, "%s: tensor '%s': give data or a producer, not both (a producer writes dtype's bytes)", path, nm);
      goto out;
    }
    if (numel > 0 && !t->data && !t->produce) {
      seterr(err, errlen, "%s: tensor '%s': no data for shape %s", path, nm,
             st_shape_str(t->shape, t->ndim, sh, sizeof sh));
      goto out;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(tensors[j].name, t->name) == 0) {
        seterr(err, errlen, "%s: tensor name '%s' given twice", path, nm);
        goto out;
      }
  }
  for (size_t i = 0; i < n_meta; i++)
    if (!meta[i].key || !meta[i].value || !valid_utf8(meta[i].key) || !valid_utf8(meta[i].value)) {
      seterr(err, errlen, "%s: metadata entry %zu: key or value NULL or not UTF-8", path, i);
      goto out;
    }
  /* data order: element size descending, stable (insertion sort: n is small) */
  for (size_t i = 0; i < n; i++) {
    size_t j = i;
    while (j > 0 && st_dtype_size(tensors[c.order[j - 1]].dtype) < st_dtype_size(tensors[i].dtype)) {
      c.order[j] = c.order[j - 1];
      j--;
    }
    c.order[j] = i;
  }
  /* header */
  sb_str(&c.header, "{");
  int first = 1;
  if (n_meta) {
    sb_str(&c.header, "\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++) {
      if (i) sb_str(&c.header, ",");
      sb_quote(&c.header, meta[i].key);
      sb_str(&c.header, ":");
      sb_quote(&c.header, meta[i].value);
    }
    sb_str(&c.header, "}");
    first = 0;
  }
  uint64_t off = 0;
  for (size_t k = 0; k < n; k++) {
    const st_tensor *t = &tensors[c.order[k]];
    if (!first) sb_str(&c.header, ",");
    first = 0;
    sb_quote(&c.header, t->name);
    sb_printf(&c.header, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++) sb_printf(&c.header, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    sb_printf(&c.header, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
              (unsigned long long)(off + c.nbytes[c.order[k]]));
    off += c.nbytes[c.order[k]];
  }
  sb_str(&c.header, "}");
  while ((8 + c.header.n) % 8) sb_str(&c.header, " ");
  if (c.header.oom) {
    seterr(err, errlen, "%s: out of memory", path);
    goto out;
  }
  if (c.header.n > ST_MAX_HEADER) {
    seterr(err, errlen, "%s: header of %zu bytes exceeds the format's limit of %u", path,
           c.header.n, ST_MAX_HEADER);
    goto out;
  }
  rc = atomic_write(path, fill_safetensors, &c, err, errlen);
out:
  free(c.order);
  free(c.nbytes);
  free(c.header.p);
  return rc;
}

/* ================================================================ reading */

struct st_file {
  char *path;
  unsigned char *base; /* file image */
  size_t size;
  int mapped;
  st_json *hdr;
  st_view *views;      /* data order */
  size_t n;
  size_t *by_name;     /* indices into views, sorted by name */
  st_kv *meta;
  size_t n_meta;
};

void st_close(st_file *f) {
  if (!f) return;
  if (f->mapped) munmap(f->base, f->size);
  else free(f->base);
  st_json_free(f->hdr);
  free(f->views);
  free(f->by_name);
  free(f->meta);
  free(f->path);
  free(f);
}

static int cmp_offsets(const void *a, const void *b) {
  const st_view *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int cmp_names(const void *a, const void *b, void *views) {
  const st_view *v = views;
  return strcmp(v[*(const size_t *)a].name, v[*(const size_t *)b].name);
}

/* validates f->base/f->size; fills the rest of f */
static int st_parse(st_file *f, char *err, size_t errlen) {
  const char *P = f->path;
  if (f->size < 8) {
    seterr(err, errlen, "%s: file is %zu bytes, too short for a safetensors file (truncated?)", P,
           f->size);
    return -1;
  }
  uint64_t hn = 0;
  for (int i = 7; i >= 0; i--) hn = (hn << 8) | f->base[i];
  if (hn > f->size - 8) {
    seterr(err, errlen,
           "%s: header length %llu is larger than the file (%zu bytes): truncated or not a "
           "safetensors file",
           P, (unsigned long long)hn, f->size);
    return -1;
  }
  if (hn > ST_MAX_HEADER) {
    seterr(err, errlen, "%s: header length %llu exceeds the format's limit of %u", P,
           (unsigned long long)hn, ST_MAX_HEADER);
    return -1;
  }
  if (hn < 2 || f->base[8] != '{') {
    seterr(err, errlen, "%s: header does not start with '{': not a safetensors file", P);
    return -1;
  }
  char jerr[256];
  f->hdr = st_json_parse((const char *)f->base + 8, (size_t)hn, jerr, sizeof jerr);
  if (!f->hdr) {
    seterr(err, errlen, "%s: corrupt header JSON: %s", P, jerr);
    return -1;
  }
  const st_json *h = f->hdr;
  if (h->type != ST_JSON_OBJ) {
    seterr(err, errlen, "%s: header is not a JSON object", P);
    return -1;
  }
  uint64_t data_len = f->size - 8 - hn;
  f->views = calloc(h->n ? h->n : 1, sizeof *f->views);
  f->by_name = calloc(h->n ? h->n : 1, sizeof *f->by_name);
  if (!f->views || !f->by_name) {
    seterr(err, errlen, "%s: out of memory", P);
    return -1;
  }
  for (size_t i = 0; i < h->n; i++) {
    const char *name = h->keys[i];
    const st_json *e = &h->items[i];
    if (strcmp(name, "__metadata__") == 0) {
      if (e->type != ST_JSON_OBJ) {
        seterr(err, errlen, "%s: __metadata__ is %s, not an object", P, st_json_type_name(e->type));
        return -1;
      }
      f->meta = calloc(e->n ? e->n : 1, sizeof *f->meta);
      if (!f->meta) {
        seterr(err, errlen, "%s: out of memory", P);
        return -1;
      }
      for (size_t k = 0; k < e->n; k++) {
        if (e->items[k].type != ST_JSON_STR) {
          seterr(err, errlen, "%s: __metadata__ value for \"%s\" is %s, not a string", P,
                 e->keys[k], st_json_type_name(e->items[k].type));
          return -1;
        }
        f->meta[k].key = e->keys[k];
        f->meta[k].value = e->items[k].s;
      }
      f->n_meta = e->n;
      continue;
    }
    if (!*name) {
      seterr(err, errlen, "%s: a tensor has an empty name", P);
      return -1;
    }
    if (e->type != ST_JSON_OBJ) {
      seterr(err, errlen, "%s: tensor '%s': entry is %s, not an object", P, name,
             st_json_type_name(e->type));
      return -1;
    }
    const st_json *dt = NULL, *sh = NULL, *of = NULL;
    for (size_t k = 0; k < e->n; k++) {
      if (strcmp(e->keys[k], "dtype") == 0) dt = &e->items[k];
      else if (strcmp(e->keys[k], "shape") == 0) sh = &e->items[k];
      else if (strcmp(e->keys[k], "data_offsets") == 0) of = &e->items[k];
      else {
        seterr(err, errlen, "%s: tensor '%s': unknown field \"%s\"", P, name, e->keys[k]);
        return -1;
      }
    }
    st_view *v = &f->views[f->n];
    v->name = name;
    if (!dt || dt->type != ST_JSON_STR) {
      seterr(err, errlen, "%s: tensor '%s': missing or non-string \"dtype\"", P, name);
      return -1;
    }
    if (!st_dtype_parse(dt->s, &v->dtype)) {
      seterr(err, errlen, "%s: tensor '%s': unsupported dtype \"%s\"", P, name, dt->s);
      return -1;
    }
    if (!sh || sh->type != ST_JSON_ARR) {
      seterr(err, errlen, "%s: tensor '%s': missing or non-array \"shape\"", P, name);
      return -1;
    }
    if (sh->n > ST_MAX_DIMS) {
      seterr(err, errlen, "%s: tensor '%s': %zu dimensions (at most %d supported)", P, name, sh->n,
             ST_MAX_DIMS);
      return -1;
    }
    v->ndim = (int)sh->n;
    for (size_t k = 0; k < sh->n; k++) {
      if (sh->items[k].type != ST_JSON_INT || sh->items[k].i < 0) {
        seterr(err, errlen, "%s: tensor '%s': shape[%zu] is not a non-negative integer", P, name, k);
        return -1;
      }
      v->shape[k] = sh->items[k].i;
    }
    v->numel = shape_numel(v->shape, v->ndim);
    char shs[160];
    if (v->numel < 0 || (uint64_t)v->numel > UINT64_MAX / st_dtype_size(v->dtype)) {
      seterr(err, errlen, "%s: tensor '%s': shape %s overflows", P, name,
             st_shape_str(v->shape, v->ndim, shs, sizeof shs));
      return -1;
    }
    if (!of || of->type != ST_JSON_ARR || of->n != 2 || of->items[0].type != ST_JSON_INT ||
        of->items[1].type != ST_JSON_INT || of->items[0].i < 0 || of->items[1].i < 0) {
      seterr(err, errlen, "%s: tensor '%s': \"data_offsets\" must be [begin, end], two "
             "non-negative integers", P, name);
      return -1;
    }
    v->begin = (uint64_t)of->items[0].i;
    v->end = (uint64_t)of->items[1].i;
    if (v->end < v->begin) {
      seterr(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] are reversed", P, name,
             (unsigned long long)v->begin, (unsigned long long)v->end);
      return -1;
    }
    if (v->end > data_len) {
      seterr(err, errlen,
             "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the data (%llu "
             "bytes): truncated file?",
             P, name, (unsigned long long)v->begin, (unsigned long long)v->end,
             (unsigned long long)data_len);
      return -1;
    }
    uint64_t need = (uint64_t)v->numel * st_dtype_size(v->dtype);
    if (v->end - v->begin != need) {
      seterr(err, errlen,
             "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %llu", P,
             name, (unsigned long long)v->begin, (unsigned long long)v->end,
             (unsigned long long)(v->end - v->begin), st_dtype_name(v->dtype),
             st_shape_str(v->shape, v->ndim, shs, sizeof shs), (unsigned long long)need);
      return -1;
    }
    v->data = f->base + 8 + hn + v->begin;
    f->n++;
  }
  /* tensors must tile the data exactly: sorted by offset, no overlap, no hole */
  qsort(f->views, f->n, sizeof *f->views, cmp_offsets);
  uint64_t at = 0;
  for (size_t i = 0; i < f->n; i++) {
    const st_view *v = &f->views[i];
    if (v->begin < at) {
      seterr(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s'", P,
             v->name, (unsigned long long)v->begin, (unsigned long long)v->end,
             f->views[i - 1].name);
      return -1;
    }
    if (v->begin > at) {
      seterr(err, errlen, "%s: tensor '%s': data_offsets [%llu, %llu] leave a hole of %llu bytes "
             "before it", P, v->name, (unsigned long long)v->begin, (unsigned long long)v->end,
             (unsigned long long)(v->begin - at));
      return -1;
    }
    at = v->end;
  }
  if (at != data_len) {
    seterr(err, errlen,
           "%s: the tensors cover %llu bytes of data but the file holds %llu after the header "
           "(trailing garbage or a wrong header length)",
           P, (unsigned long long)at, (unsigned long long)data_len);
    return -1;
  }
  for (size_t i = 0; i < f->n; i++) f->by_name[i] = i;
  qsort_r(f->by_name, f->n, sizeof *f->by_name, cmp_names, f->views);
  return 0;
}

static st_file *st_new(const char *label) {
  st_file *f = calloc(1, sizeof *f);
  if (f) f->path = strdup(label ? label : "(buffer)");
  if (f && !f->path) {
    free(f);
    f = NULL;
  }
  return f;
}

st_file *st_open_buffer(const void *buf, size_t len, const char *label, char *err, size_t errlen) {
  st_file *f = st_new(label);
  if (!f || !(f->base = malloc(len ? len : 1))) {
    seterr(err, errlen, "%s: out of memory", label ? label : "(buffer)");
    st_close(f);
    return NULL;
  }
  if (len) memcpy(f->base, buf, len);
  f->size = len;
  if (st_parse(f, err, errlen) != 0) {
    st_close(f);
    return NULL;
  }
  return f;
}

st_file *st_open(const char *path, char *err, size_t errlen) {
  st_file *f = st_new(path);
  if (!f) {
    seterr(err, errlen, "%s: out of memory", path);
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    seterr(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    goto fail;
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    seterr(err, errlen, "%s: not a regular file", path);
    close(fd);
    goto fail;
  }
  f->size = (size_t)sb.st_size;
  if (f->size > 0) {
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m != MAP_FAILED) {
      f->base = m;
      f->mapped = 1;
    } else { /* fall back to reading it whole */
      f->base = malloc(f->size);
      size_t got = 0;
      while (f->base && got < f->size) {
        ssize_t r = pread(fd, f->base + got, f->size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
      }
      if (!f->base || got != f->size) {
        seterr(err, errlen, "%s: read failed: %s", path, f->base ? strerror(errno) : "out of memory");
        close(fd);
        goto fail;
      }
    }
  }
  close(fd);
  if (st_parse(f, err, errlen) != 0) goto fail;
  return f;
fail:
  st_close(f);
  return NULL;
}

size_t st_count(const st_file *f) { return f->n; }
const st_view *st_at(const st_file *f, size_t i) { return i < f->n ? &f->views[i] : NULL; }
const char *st_path(const st_file *f) { return f->path; }
size_t st_meta_count(const st_file *f) { return f->n_meta; }
const st_kv *st_meta_at(const st_file *f, size_t i) { return i < f->n_meta ? &f->meta[i] : NULL; }

const st_view *st_find(const st_file *f, const char *name) {
  size_t lo = 0, hi = f->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(f->views[f->by_name[mid]].name, name);
    if (c == 0) return &f->views[f->by_name[mid]];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return NULL;
}

const char *st_meta(const st_file *f, const char *key) {
  for (size_t i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
  return NULL;
}

int st_get_f32(const st_file *f, const char *name, float *dst, int64_t numel, char *err,
               size_t errlen) {
  const st_view *v = st_find(f, name);
  char sh[160];
  if (!v) {
    seterr(err, errlen, "%s: no tensor named '%s'", f->path, name);
    return -1;
  }
  if (v->numel != numel) {
    seterr(err, errlen, "%s: tensor '%s' has shape %s (%lld elements), expected %lld elements",
           f->path, name, st_shape_str(v->shape, v->ndim, sh, sizeof sh), (long long)v->numel,
           (long long)numel);
    return -1;
  }
  const unsigned char *src = v->data;
  switch (v->dtype) {
  case ST_F32:
    if (numel) memcpy(dst, src, (size_t)numel * 4);
    return 0;
  case ST_BF16:
  case ST_F16:
    for (int64_t i = 0; i < numel; i++) {
      uint16_t h;
      memcpy(&h, src + 2 * i, 2);
      dst[i] = v->dtype == ST_BF16 ? st_bf16_to_f32(h) : st_f16_to_f32(h);
    }
    return 0;
  default:
    seterr(err, errlen, "%s: tensor '%s' is %s, which cannot be read as f32", f->path, name,
           st_dtype_name(v->dtype));
    return -1;
  }
}
