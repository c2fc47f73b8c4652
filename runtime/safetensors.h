/* safetensors.h -- read and write Hugging Face safetensors files, and the small strict JSON
 * parser they (and checkpoint config.json / state.json) need.
 *
 * The format (https://github.com/huggingface/safetensors):
 *   bytes [0, 8)        N, the header length, u64 little-endian
 *   bytes [8, 8+N)      a JSON object, padded with spaces so that 8+N is a multiple of 8:
 *                         {"__metadata__": {"key": "value", ...},            (optional)
 *                          "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}, ...}
 *   bytes [8+N, end)    the data. Offsets are relative to 8+N; tensors are tightly packed, with
 *                       no holes and no overlaps, and the last one ends at the end of the file.
 *                       Elements are little-endian, row-major.
 *
 * Writing is atomic: a temporary file in the target's directory, fsynced, renamed over the
 * target, then the directory fsynced. A crash leaves the old file or the new one, never a mix.
 * The writer orders the data by element size, largest first (stable), so that every tensor's
 * data is aligned to its element size; the header lists tensors in data order.
 *
 * Reading maps the file (or reads it whole) and validates the whole header before returning:
 * any corrupt, truncated or inconsistent file gives an error naming the file and the tensor.
 * A view's data pointer is aligned only if the writer aligned it (moec's writer does); use
 * st_get_f32 (memcpy-based) when in doubt. st_open maps the file read-only: never truncate or
 * rewrite an open file in place (a SIGBUS); moec's writers replace files by rename, which is
 * safe for readers that have the old file open.
 *
 * All functions that can fail take (char *err, size_t errlen) and write one line, without a
 * trailing newline, there; err may be NULL.
 */
#ifndef MOEC_SAFETENSORS_H
#define MOEC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u) /* same limit as the reference implementation */

typedef enum {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_F8_E8M0,
  ST_I16, ST_U16, ST_F16, ST_BF16,
  ST_I32, ST_U32, ST_F32,
  ST_I64, ST_U64, ST_F64, ST_C64,
  ST_DTYPE_COUNT
} st_dtype;

const char *st_dtype_name(st_dtype t);       /* "F32"; "?" when out of range */
size_t st_dtype_size(st_dtype t);            /* bytes per element; 0 when out of range */
int st_dtype_parse(const char *s, st_dtype *out); /* 1 known, 0 unknown */

/* f32 <-> bf16. Round to nearest, ties to even; NaN stays NaN (quiet), sign kept; overflow
 * rounds to infinity as IEEE requires. */
uint16_t st_f32_to_bf16(float f);
float st_bf16_to_f32(uint16_t h);
float st_f16_to_f32(uint16_t h);

/* ---- writing ---- */

typedef struct {
  const char *name;
  st_dtype dtype;             /* dtype stored in the file */
  int ndim;                   /* 0 = scalar (one element) */
  int64_t shape[ST_MAX_DIMS];
  const void *data;           /* numel elements of dtype, little-endian; or float[] if from_f32 */
  int from_f32;               /* data is float[]; converted to dtype on write (BF16 or F32 only) */
  /* Or, with data NULL: produce fills dst with the tensor's bytes (numel elements of dtype) when
   * the writer reaches it, so a caller need not hold every tensor at once (a checkpoint
   * transposing weights, or fetching them from a GPU, one at a time). 0, or -1 with err set. */
  int (*produce)(void *ctx, void *dst, uint64_t bytes, char *err, size_t errlen);
  void *produce_ctx;
} st_tensor;

typedef struct {
  const char *key, *value;
} st_kv;

/* Writes path atomically. meta may be NULL when n_meta is 0 (then no "__metadata__" key is
 * written). Names must be unique, non-empty, and not "__metadata__". Returns 0 on success,
 * -1 with err set (and no file left behind, and the old target untouched) on failure. */
int st_write(const char *path, const st_tensor *tensors, size_t n, const st_kv *meta,
             size_t n_meta, char *err, size_t errlen);

/* ---- reading ---- */

typedef struct {
  const char *name;
  st_dtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  int64_t numel;              /* 1 for a scalar; 0 when some dimension is 0 */
  uint64_t begin, end;        /* data_offsets, relative to the start of the data */
  const void *data;           /* end - begin bytes; valid until st_close */
} st_view;

typedef struct st_file st_file;

st_file *st_open(const char *path, char *err, size_t errlen);
/* Parses a file image held in memory (copied); label names it in errors. For tests/fuzzing. */
st_file *st_open_buffer(const void *buf, size_t len, const char *label, char *err, size_t errlen);
void st_close(st_file *f);

size_t st_count(const st_file *f);                       /* tensors, in data order */
const st_view *st_at(const st_file *f, size_t i);
const st_view *st_find(const st_file *f, const char *name); /* NULL when absent */
const char *st_meta(const st_file *f, const char *key);     /* NULL when absent */
size_t st_meta_count(const st_file *f);
const st_kv *st_meta_at(const st_file *f, size_t i);
const char *st_path(const st_file *f);

/* Copies tensor name into dst as f32, converting from F32, BF16 or F16. Fails (with the file
 * and tensor named) when the tensor is absent, has another element count than numel, or
 * another dtype. */
int st_get_f32(const st_file *f, const char *name, float *dst, int64_t numel, char *err,
               size_t errlen);

/* Formats a shape as "[2, 3]" ("[]" for a scalar) into buf; returns buf. */
char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

/* ---- JSON (strict RFC 8259 subset: objects, arrays, strings, numbers, true/false/null) ----
 * Duplicate object keys, trailing commas, comments, invalid UTF-8, \u0000, nesting deeper
 * than 64 and trailing garbage are errors. Integers that fit int64 are ST_JSON_INT (d holds
 * them too); other numbers are ST_JSON_NUM. Errors give the byte offset. */

typedef enum {
  ST_JSON_NULL, ST_JSON_BOOL, ST_JSON_INT, ST_JSON_NUM, ST_JSON_STR, ST_JSON_ARR, ST_JSON_OBJ
} st_json_type;

typedef struct st_json {
  st_json_type type;
  int b;                      /* BOOL */
  int64_t i;                  /* INT */
  double d;                   /* INT, NUM */
  char *s;                    /* STR: NUL-terminated UTF-8 */
  size_t n;                   /* ARR, OBJ: number of items */
  struct st_json *items;      /* ARR, OBJ: n values */
  char **keys;                /* OBJ: n keys, in file order */
} st_json;

/* Parses len bytes; trailing whitespace is allowed. Returns NULL with err set on error. */
st_json *st_json_parse(const char *text, size_t len, char *err, size_t errlen);
void st_json_free(st_json *j);
const st_json *st_json_get(const st_json *obj, const char *key); /* NULL if absent / not OBJ */
const char *st_json_type_name(st_json_type t);

/* Appends s to buf as a JSON string literal with quotes ("..." with \" \\ and \u00XX for
 * control characters). Returns the length it needs (like snprintf); writes at most len-1
 * bytes plus a NUL. */
size_t st_json_quote(const char *s, char *buf, size_t len);

/* Formats d with %.17g in the C locale (round-trip exact, whatever setlocale says).
 * Returns 0, or -1 for NaN and infinities, which JSON cannot hold. */
int st_json_fmt_double(double d, char *buf, size_t len);

/* ---- durable file helpers (also used by ckpt.c) ---- */

/* Writes len bytes to path atomically: temporary file in the same directory (created with
 * O_EXCL), write, fsync, close, rename over path, fsync the directory. */
int st_write_atomic(const char *path, const void *buf, size_t len, char *err, size_t errlen);
/* fsyncs a directory, so that renames and creations in it are durable. */
int st_fsync_dir(const char *dir, char *err, size_t errlen);

#endif
