/* data.c -- genomic FASTA into token windows (see data.h for the layout and the rules).
 *
 * Reading goes through htslib's BGZF layer, which reads plain, gzip and BGZF files alike.
 * Every byte of a sequence line is checked against one table; the bases of all records go
 * into one buffer, which is then cut into the train and validation token streams. */
#include "data.h"
#include "hash.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <htslib/bgzf.h>
#include <htslib/hfile.h>
#include <htslib/hts_log.h>
#include <htslib/kstring.h>

struct data_set {
  uint8_t *tok[2];   /* token stream of each split, one byte per token */
  int64_t ntok[2];
  int64_t nwin[2];
  int64_t nbases[2];
  int64_t nrec, acgt;
  int64_t seq, stride;
  int rc_augment;
  uint64_t seed;
};

/* ---- byte tables ---- */

static const char IUPAC[] = "ACGTURYSWKMBDHVN";
static const char IUPAC_COMP[] = "TGCAAYRSWMKVHDBN"; /* complement of IUPAC[i] */

static uint8_t is_acgt_tab[256]; /* 1 for A/C/G/T/a/c/g/t */
static uint8_t comp_tab[256];    /* complement, case-preserving; BOS <-> EOS */
static uint8_t keep_tab[256];    /* sequence byte -> token (0: not a base) */
static uint8_t upper_tab[256];   /* same, lowercase folded to uppercase */

static void tables_init(void) {
  for (int c = 0; c < 256; c++) comp_tab[c] = (uint8_t)c;
  for (int i = 0; IUPAC[i]; i++) {
    int u = (unsigned char)IUPAC[i], l = u + ('a' - 'A');
    int cu = (unsigned char)IUPAC_COMP[i], cl = cu + ('a' - 'A');
    keep_tab[u] = (uint8_t)u;
    keep_tab[l] = (uint8_t)l;
    upper_tab[u] = upper_tab[l] = (uint8_t)u;
    comp_tab[u] = (uint8_t)cu;
    comp_tab[l] = (uint8_t)cl;
  }
  comp_tab[DATA_BOS] = DATA_EOS;
  comp_tab[DATA_EOS] = DATA_BOS;
  for (const char *p = "ACGTacgt"; *p; p++) is_acgt_tab[(unsigned char)*p] = 1;
}

static void tables_init_once(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, tables_init);
}

int data_complement(int token) {
  tables_init_once();
  if (token < 0 || token > 255) return token;
  return comp_tab[token];
}

/* ---- counter-based randomness (splitmix64) ---- */


/* A keyed bijection of [0, n): a 6-round balanced Feistel network over the smallest even
 * number of bits that covers n, cycle-walked until the value falls inside [0, n). */
static int64_t permute(int64_t n, uint64_t key, int64_t x) {
  if (n <= 1) return 0;
  int bits = 0;
  while (bits < 62 && ((int64_t)1 << bits) < n) bits++;
  if (bits & 1) bits++;
  int h = bits / 2;
  uint64_t mask = ((uint64_t)1 << h) - 1, v = (uint64_t)x;
  do {
    uint64_t l = v >> h, r = v & mask;
    for (uint64_t round = 0; round < 6; round++) {
      uint64_t f = hash_mix64(key ^ hash_mix64(r + (round << 56))) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    v = (l << h) | r;
  } while (v >= (uint64_t)n);
  return (int64_t)v;
}

/* ---- errors ---- */

static void fail(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* A printable excerpt of a line around column col (1-based) and a caret under it:
 * "\n  TEXT\n  ^". */
static void excerpt(char *out, size_t outlen, const char *s, size_t n, size_t col) {
  size_t start = col > 31 ? col - 31 : 0, end = start + 60 < n ? start + 60 : n;
  char text[64], caret[64];
  size_t k = 0;
  for (size_t i = start; i < end; i++) {
    unsigned char c = (unsigned char)s[i];
    text[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '.';
  }
  text[k] = 0;
  size_t at = col - 1 - start;
  memset(caret, ' ', at);
  caret[at] = '^';
  caret[at + 1] = 0;
  snprintf(out, outlen, "\n  %s\n  %s", text, caret);
}

static void describe_byte(char *out, size_t outlen, unsigned char c) {
  if (c >= 0x20 && c < 0x7f && c != '\'')
    snprintf(out, outlen, "character '%c' (0x%02x)", c, c);
  else
    snprintf(out, outlen, "byte 0x%02x", c);
}

/* ---- loading ---- */

typedef struct {
  const char *path;
  char *err;
  size_t errlen;
  BGZF *fp;
  const uint8_t *map; /* keep_tab or upper_tab */
  uint8_t *buf;       /* bases of all records, back to back */
  int64_t n, cap;
  int64_t *rlen;      /* bases per record */
  int64_t nrec, rcap;
  int64_t acgt;
  int64_t lineno;
  char name[72];      /* name of the current record, for messages */
  int64_t empty_line; /* header line of the first record with no bases (0: none) */
  char empty_name[72];
  int empty_at_eof;
} loader;

static const char *stream_kind(const BGZF *fp) {
  return !fp->is_compressed ? "file" : fp->is_gzip ? "gzip" : "BGZF";
}

/* The message for an htslib read error, from the BGZF error bits. */
static void read_error(loader *L) {
  const BGZF *fp = L->fp;
  const char *kind = stream_kind(fp);
  const char *what;
  if (!fp->is_compressed)
    what = "read error";
  else if (fp->errcode & BGZF_ERR_IO)
    what = "the compressed data ends early: the file is truncated";
  else if (fp->errcode & BGZF_ERR_CRC)
    what = "checksum mismatch: the compressed data is corrupt";
  else if (fp->errcode & BGZF_ERR_HEADER)
    what = "bad block header: the compressed data is corrupt";
  else
    what = "decompression failed: the compressed data is corrupt";
  fail(L->err, L->errlen,
       "%s: error: %s data: %s (after line %lld); re-download or regenerate the file "
       "(`gzip -t %s` checks it)",
       L->path, kind, what, (long long)L->lineno, L->path);
}

/* After a parse error in compressed input: damaged data decompresses to garbage before zlib
 * notices (gzip checks its CRC only at the end), so read on, and if decompression fails,
 * report that instead of the garbage it produced. Returns 1 if it reported. */
static int corrupt_instead(loader *L) {
  if (!L->fp->is_compressed) return 0;
  char *scratch = malloc(1 << 16);
  if (!scratch) return 0;
  ssize_t r;
  while ((r = bgzf_read(L->fp, scratch, 1 << 16)) > 0) {}
  free(scratch);
  if (r == 0) return 0;
  read_error(L);
  return 1;
}

static int grow_bases(loader *L, int64_t need) {
  if (L->n + need <= L->cap) return 0;
  int64_t cap = L->cap ? L->cap : (1 << 20);
  while (cap < L->n + need) cap *= 2;
  uint8_t *b = realloc(L->buf, (size_t)cap);
  if (!b) return -1;
  L->buf = b;
  L->cap = cap;
  return 0;
}

static int start_record(loader *L, const char *s, size_t n) {
  if (L->nrec == L->rcap) {
    int64_t cap = L->rcap ? L->rcap * 2 : 64;
    int64_t *r = realloc(L->rlen, (size_t)cap * sizeof *r);
    if (!r) return -1;
    L->rlen = r;
    L->rcap = cap;
  }
  L->rlen[L->nrec++] = 0;
  /* name = first word after '>', shortened for messages */
  size_t i = 1, k = 0;
  while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
  while (i < n && s[i] != ' ' && s[i] != '\t' && k < sizeof L->name - 1) {
    if (k == 60) { memcpy(L->name + k, "...", 3); k += 3; break; }
    unsigned char c = (unsigned char)s[i++];
    L->name[k++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
  }
  L->name[k] = 0;
  return 0;
}

/* Closes the current record: the first one with no bases is remembered. */
static void end_record(loader *L, int at_eof, int64_t header_line) {
  if (L->nrec == 0 || L->rlen[L->nrec - 1] != 0 || L->empty_line) return;
  L->empty_line = header_line;
  L->empty_at_eof = at_eof;
  memcpy(L->empty_name, L->name, sizeof L->name);
}

/* A non-header line before the first '>': FASTQ, binary, or text that is not FASTA. */
static void before_header_error(loader *L, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  if (L->lineno == 1 && n >= 2 && u[0] == 0x1f && u[1] == 0x8b) {
    fail(L->err, L->errlen,
         "%s: error: gzip data: the gzip header is incomplete: the file is truncated or "
         "corrupt; re-download or regenerate it (`gzip -t %s` checks it)",
         L->path, L->path);
    return;
  }
  if (u[0] == '@') {
    fail(L->err, L->errlen,
         "%s:%lld: error: this looks like FASTQ (the line starts with '@'), not FASTA; "
         "convert it first, e.g. `seqtk seq -A %s > reads.fa` or `samtools fasta %s > reads.fa`",
         L->path, (long long)L->lineno, L->path, L->path);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (u[i] == 0 || (u[i] < 0x20 && u[i] != '\t') || u[i] == 0x7f) {
      fail(L->err, L->errlen,
           "%s:%lld:%zu: error: binary data (byte 0x%02x): this is not a FASTA text file; "
           "give a FASTA file (.fa, .fa.gz or BGZF) with '>name' header lines and sequence lines",
           L->path, (long long)L->lineno, i + 1, u[i]);
      return;
    }
  }
  char ex[160];
  excerpt(ex, sizeof ex, s, n, 1);
  fail(L->err, L->errlen,
       "%s:%lld: error: expected a '>' header line before any sequence; FASTA records start "
       "with a line '>name' followed by their sequence lines%s",
       L->path, (long long)L->lineno, ex);
}

/* Reads the whole file into L. Returns 0, or -1 with L->err written. */
static int read_fasta(loader *L, data_progress_fn progress, void *ctx, int64_t total) {
  kstring_t ks = {0, 0, NULL};
  int64_t header_line = 0, nonblank = 0, headers = 0, next_report = 1 << 22;
  int rc = -1, r;
  while ((r = bgzf_getline(L->fp, '\n', &ks)) >= 0) {
    L->lineno++;
    const char *s = ks.s;
    size_t n = ks.l;
    if (n && s[n - 1] == '\r') n--;
    if (n == 0) continue;
    nonblank++;
    if (s[0] == '>') {
      if (memchr(s, 0, n)) {
        fail(L->err, L->errlen,
             "%s:%lld: error: binary data (a NUL byte) in a header line: this is not a FASTA "
             "text file",
             L->path, (long long)L->lineno);
        goto parse_error;
      }
      const char *cr = memchr(s, '\r', n);
      if (cr) {
        fail(L->err, L->errlen,
             "%s:%lld:%zu: error: carriage return inside a line: the file seems to use old Mac "
             "line ends (CR only); convert them, e.g. `tr '\\r' '\\n' < %s > fixed.fa`",
             L->path, (long long)L->lineno, (size_t)(cr - s) + 1, L->path);
        goto parse_error;
      }
      end_record(L, 0, header_line);
      if (start_record(L, s, n)) goto oom;
      header_line = L->lineno;
      headers++;
      continue;
    }
    if (headers == 0) {
      /* a line of only spaces/tabs before the first header counts as blank */
      size_t i = 0;
      while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
      if (i == n) { nonblank--; continue; }
      before_header_error(L, s, n);
      goto parse_error;
    }
    if (grow_bases(L, (int64_t)n)) goto oom;
    uint8_t *out = L->buf + L->n;
    const uint8_t *map = L->map;
    size_t k = 0;
    int64_t acgt = 0;
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)s[i];
      uint8_t t = map[c];
      if (!t) {
        if (c == ' ' || c == '\t') continue;
        char what[48], ex[160];
        describe_byte(what, sizeof what, c);
        excerpt(ex, sizeof ex, s, n, i + 1);
        fail(L->err, L->errlen,
             "%s:%lld:%zu: error: invalid %s in the sequence of record '%s'; sequence lines "
             "may hold only IUPAC nucleotide codes (ACGTU RYSWKMBDHVN, either case): fix or "
             "remove it%s",
             L->path, (long long)L->lineno, i + 1, what, L->name, ex);
        goto parse_error;
      }
      out[k++] = t;
      acgt += is_acgt_tab[t];
    }
    L->n += (int64_t)k;
    L->rlen[L->nrec - 1] += (int64_t)k;
    L->acgt += acgt;
    if (progress && L->n >= next_report) {
      next_report = L->n + (1 << 22);
      progress(ctx, (int64_t)htell(L->fp->fp), total);
    }
  }
  if (r < -1) {
    read_error(L);
    goto out;
  }
  end_record(L, 1, header_line);
  if (progress) progress(ctx, total, total);
  if (nonblank == 0) {
    fail(L->err, L->errlen,
         "%s: error: the file is empty%s; expected FASTA: a '>name' header line followed by "
         "sequence lines",
         L->path, L->lineno ? " (only blank lines)" : "");
  } else if (L->n == 0) {
    fail(L->err, L->errlen,
         "%s: error: no sequence: the file has %lld header line%s ('>') and no bases; each "
         "record needs sequence lines after its header",
         L->path, (long long)headers, headers == 1 ? "" : "s");
  } else if (L->empty_line) {
    fail(L->err, L->errlen,
         "%s:%lld: error: record '%s' has no bases (its header is followed by %s); remove the "
         "empty record or add its sequence",
         L->path, (long long)L->empty_line, L->empty_name,
         L->empty_at_eof ? "the end of the file" : "another header");
  } else if (L->acgt == 0) {
    fail(L->err, L->errlen,
         "%s: error: no A/C/G/T bases: all %lld bases are N or other ambiguity codes, so every "
         "label would be masked; give a FASTA with real sequence",
         L->path, (long long)L->n);
  } else {
    rc = 0;
  }
  goto out;
parse_error:
  corrupt_instead(L);
  goto out;
oom:
  fail(L->err, L->errlen, "%s: error: out of memory after %lld bases (line %lld)", L->path,
       (long long)L->n, (long long)L->lineno);
out:
  free(ks.s);
  return rc;
}

/* Opens path for reading, with a message for each way that fails. */
static BGZF *open_input(const char *path, int64_t *size, char *err, size_t errlen) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      fail(err, errlen,
           "%s: error: no such file; check the path (the bundled genomes are "
           "data/chr20_slice.fa.gz and data/lambda_phage.fa.gz; scripts/fetch_data.sh "
           "downloads the full data/chr20.fa.gz)",
           path);
    else if (e == EACCES)
      fail(err, errlen,
           "%s: error: permission denied: the file is not readable; make it readable "
           "(`chmod a+r %s`) or copy it somewhere you can read",
           path, path);
    else if (e == EISDIR)
      fail(err, errlen, "%s: error: is a directory; give a FASTA file (.fa, .fa.gz or BGZF)",
           path);
    else
      fail(err, errlen, "%s: error: cannot open: %s", path, strerror(e));
    return NULL;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    fail(err, errlen, "%s: error: is a directory; give a FASTA file (.fa, .fa.gz or BGZF)",
         path);
    close(fd);
    return NULL;
  }
  *size = S_ISREG(st.st_mode) ? (int64_t)st.st_size : 0;
  if (S_ISREG(st.st_mode) && st.st_size == 0) {
    fail(err, errlen,
         "%s: error: the file is empty (0 bytes); expected FASTA: a '>name' header line "
         "followed by sequence lines",
         path);
    close(fd);
    return NULL;
  }
  errno = 0;
  BGZF *fp = bgzf_dopen(fd, "r"); /* takes fd */
  if (!fp) {
    fail(err, errlen,
         "%s: error: cannot read it as FASTA, gzip or BGZF: %s; re-download or regenerate it",
         path, errno ? strerror(errno) : "unknown format");
    return NULL;
  }
  if (fp->is_compressed && !fp->is_gzip && S_ISREG(st.st_mode) && bgzf_check_EOF(fp) == 0) {
    fail(err, errlen,
         "%s: error: BGZF data: the end-of-file marker is missing: the file is truncated; "
         "re-download or regenerate it (`bgzip -t %s` checks it)",
         path, path);
    bgzf_close(fp);
    return NULL;
  }
  return fp;
}

static int check_opts(const char *path, const data_opts *o, char *err, size_t errlen) {
  if (!o) {
    fail(err, errlen, "%s: error: no data options given (data_opts is NULL)", path);
    return -1;
  }
  if (o->seq < 1) {
    fail(err, errlen, "%s: error: seq = %lld is out of range; a window needs seq >= 1 tokens",
         path, (long long)o->seq);
    return -1;
  }
  if (o->stride < 0 || o->stride > o->seq) {
    fail(err, errlen,
         "%s: error: stride = %lld is out of range; use 1..seq (%lld), or 0 for stride = seq "
         "(overlap = seq - stride)",
         path, (long long)o->stride, (long long)o->seq);
    return -1;
  }
  if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0)) {
    fail(err, errlen,
         "%s: error: val_fraction = %g is out of range; use a value in [0, 1), e.g. 0.05 (0 "
         "turns validation off)",
         path, o->val_fraction);
    return -1;
  }
  return 0;
}

/* Cuts the bases in L into the two token streams of d (see data.h). */
static int build_streams(data_set *d, const loader *L, double vf) {
  int64_t ntok[2] = {0, 0};
  for (int64_t r = 0; r < L->nrec; r++) {
    int64_t len = L->rlen[r], v = (int64_t)floor((double)len * vf);
    if (v > len - 1) v = len - 1; /* c >= 1 whatever rounding does */
    int64_t c = len - v;
    ntok[0] += 1 + c + (v == 0);
    ntok[1] += v ? v + 1 : 0;
    d->nbases[0] += c;
    d->nbases[1] += v;
  }
  for (int s = 0; s < 2; s++) {
    d->ntok[s] = ntok[s];
    d->tok[s] = malloc(ntok[s] ? (size_t)ntok[s] : 1);
    if (!d->tok[s]) return -1;
  }
  uint8_t *t = d->tok[0], *v = d->tok[1];
  const uint8_t *b = L->buf;
  for (int64_t r = 0; r < L->nrec; r++) {
    int64_t len = L->rlen[r], nv = (int64_t)floor((double)len * vf);
    if (nv > len - 1) nv = len - 1;
    int64_t c = len - nv;
    *t++ = DATA_BOS;
    memcpy(t, b, (size_t)c);
    t += c;
    if (nv == 0) {
      *t++ = DATA_EOS;
    } else {
      memcpy(v, b + c, (size_t)nv);
      v += nv;
      *v++ = DATA_EOS;
    }
    b += len;
  }
  return 0;
}

static int64_t n_windows_of(int64_t ntok, int64_t seq, int64_t stride) {
  return ntok > seq ? (ntok - seq - 1) / stride + 1 : 0;
}

data_set *data_open_cb(const char *path, const data_opts *o, data_progress_fn progress,
                       void *ctx, char *err, size_t errlen) {
  tables_init_once();
  if (err && errlen) err[0] = 0;
  if (!path || !*path) {
    fail(err, errlen,
         "(no path): error: no FASTA file given; name one (e.g. data/chr20_slice.fa.gz)");
    return NULL;
  }
  if (check_opts(path, o, err, errlen)) return NULL;
  int64_t seq = o->seq, stride = o->stride ? o->stride : o->seq;
  double vf = o->val_fraction;

  enum htsLogLevel saved = hts_get_log_level();
  hts_set_log_level(HTS_LOG_OFF);
  int64_t total = 0;
  loader L;
  memset(&L, 0, sizeof L);
  L.path = path;
  L.err = err;
  L.errlen = errlen;
  L.map = o->uppercase ? upper_tab : keep_tab;
  data_set *d = NULL;
  L.fp = open_input(path, &total, err, errlen);
  if (!L.fp) goto done;
  if (total > 0) {
    /* one allocation in the usual case: bases <= bytes for a plain file, and DNA compresses
     * less than 4:1 with gzip (pages of an overestimate that are never written cost nothing) */
    int64_t guess = L.fp->is_compressed ? 4 * total : total;
    L.buf = malloc((size_t)guess);
    L.cap = L.buf ? guess : 0;
  }
  if (read_fasta(&L, progress, ctx, total)) goto done;

  d = calloc(1, sizeof *d);
  if (!d || build_streams(d, &L, vf)) {
    fail(err, errlen, "%s: error: out of memory building windows of %lld bases", path,
         (long long)L.n);
    data_close(d);
    d = NULL;
    goto done;
  }
  d->nrec = L.nrec;
  d->acgt = L.acgt;
  d->seq = seq;
  d->stride = stride;
  d->rc_augment = o->rc_augment;
  d->seed = o->seed;
  for (int s = 0; s < 2; s++) d->nwin[s] = n_windows_of(d->ntok[s], seq, stride);

  if (d->nwin[0] == 0) {
    int64_t specials = d->ntok[0] - d->nbases[0];
    int64_t need = (int64_t)ceil((double)(seq + 1 - specials) / (1.0 - vf));
    if (need < 1) need = 1;
    fail(err, errlen,
         "%s: error: genome too short for one window: the training split has %lld tokens "
         "(%lld bases + %lld BOS/EOS) but seq = %lld needs %lld (a window and one more token "
         "for its last label); use a smaller seq (at most %lld), or a longer genome (about "
         "%lld bases at val_fraction %g)",
         path, (long long)d->ntok[0], (long long)d->nbases[0], (long long)specials,
         (long long)seq, (long long)(seq + 1), (long long)(d->ntok[0] - 1), (long long)need,
         vf);
    data_close(d);
    d = NULL;
  } else if (vf > 0 && d->nwin[1] == 0) {
    fail(err, errlen,
         "%s: error: validation split too short for one window: the last %g of each record "
         "gives %lld tokens (%lld bases + EOS) but seq = %lld needs %lld; raise val_fraction, "
         "use a smaller seq (at most %lld), or set val_fraction = 0 to skip validation",
         path, vf, (long long)d->ntok[1], (long long)d->nbases[1], (long long)seq,
         (long long)(seq + 1), (long long)(d->ntok[1] > 1 ? d->ntok[1] - 1 : 0));
    data_close(d);
    d = NULL;
  }
done:
  if (L.fp) bgzf_close(L.fp);
  free(L.buf);
  free(L.rlen);
  hts_set_log_level(saved);
  return d;
}

data_set *data_open(const char *path, const data_opts *o, char *err, size_t errlen) {
  return data_open_cb(path, o, NULL, NULL, err, errlen);
}

void data_close(data_set *d) {
  if (!d) return;
  free(d->tok[0]);
  free(d->tok[1]);
  free(d);
}

int64_t data_n_windows(const data_set *d, int split) {
  return d && (split == DATA_TRAIN || split == DATA_VAL) ? d->nwin[split] : 0;
}
int64_t data_n_bases(const data_set *d, int split) {
  return d && (split == DATA_TRAIN || split == DATA_VAL) ? d->nbases[split] : 0;
}
int64_t data_n_records(const data_set *d) { return d ? d->nrec : 0; }
int64_t data_n_acgt(const data_set *d) { return d ? d->acgt : 0; }

const uint8_t *data_stream(const data_set *d, int split, int64_t *n) {
  if (!d || (split != DATA_TRAIN && split != DATA_VAL)) {
    if (n) *n = 0;
    return NULL;
  }
  if (n) *n = d->ntok[split];
  return d->tok[split];
}

/* ---- windows and batches ---- */

void data_window(const data_set *d, int split, int64_t w, int rc, int32_t *tokens,
                 int32_t *labels) {
  int64_t T = d->seq;
  if ((split != DATA_TRAIN && split != DATA_VAL) || w < 0 || w >= d->nwin[split]) {
    for (int64_t i = 0; i < T; i++) tokens[i] = DATA_PAD, labels[i] = DATA_IGNORE;
    return;
  }
  const uint8_t *s = d->tok[split] + w * d->stride; /* s[0..T] are in the stream */
  if (!rc) {
    for (int64_t i = 0; i < T; i++) {
      uint8_t next = s[i + 1];
      tokens[i] = s[i];
      labels[i] = is_acgt_tab[next] ? next : DATA_IGNORE;
    }
  } else {
    /* reversed-complemented segment r[j] = comp(s[T - j]), j = 0..T */
    for (int64_t i = 0; i < T; i++) {
      uint8_t next = comp_tab[s[T - i - 1]];
      tokens[i] = comp_tab[s[T - i]];
      labels[i] = is_acgt_tab[next] ? next : DATA_IGNORE;
    }
  }
}

static const uint64_t PERM_SALT = 0x5045524D5045524Dull; /* "PERMPERM" */
static const uint64_t RC_SALT = 0x5245564352455643ull;   /* "REVCREVC" */

int64_t data_train_window_id(const data_set *d, int64_t step, int64_t batch, int64_t row,
                             int *rc) {
  int64_t n = d->nwin[DATA_TRAIN];
  int64_t g = step * batch + row;
  uint64_t epoch = (uint64_t)(g / n);
  uint64_t key = hash_mix64(hash_mix64(d->seed ^ PERM_SALT) ^ hash_mix64(epoch));
  if (rc) *rc = d->rc_augment ? (int)(hash_mix64(hash_mix64(d->seed ^ RC_SALT) ^ (uint64_t)g) >> 63) : 0;
  return permute(n, key, g % n);
}

void data_train_rows(const data_set *d, int64_t step, int64_t batch, int64_t row0,
                     int64_t nrows, int32_t *tokens, int32_t *labels) {
  if (!d || step < 0 || batch < 1 || row0 < 0 || nrows < 1) return;
  for (int64_t r = 0; r < nrows; r++) {
    int rc;
    int64_t w = data_train_window_id(d, step, batch, row0 + r, &rc);
    data_window(d, DATA_TRAIN, w, rc, tokens + r * d->seq, labels + r * d->seq);
  }
}

void data_train_batch(const data_set *d, int64_t step, int64_t batch, int32_t *tokens,
                      int32_t *labels) {
  data_train_rows(d, step, batch, 0, batch, tokens, labels);
}

void data_val_batch(const data_set *d, int64_t i, int64_t batch, int32_t *tokens,
                    int32_t *labels) {
  if (!d || batch < 1) return;
  int64_t n = d->nwin[DATA_VAL];
  for (int64_t r = 0; r < batch; r++) {
    int64_t w = n ? ((i + r) % n + n) % n : -1;
    data_window(d, DATA_VAL, w, 0, tokens + r * d->seq, labels + r * d->seq);
  }
}
