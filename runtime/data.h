/* data.h -- genomic FASTA into token windows for training and validation.
 *
 * Input: FASTA, gzip-compressed FASTA or BGZF, read through htslib: multi-record, wrapped
 * lines of any width, CRLF line ends, lowercase soft-masking (kept unless o->uppercase),
 * N and the other IUPAC nucleotide codes (ACGTU RYSWKMBDHVN, either case). Spaces and tabs
 * inside sequence lines are skipped, blank lines are ignored.
 *
 * Tokens are bytes: token id = the ASCII byte of the base (A = 65, c = 99, N = 78, ...), plus
 * three special ids taken from BioNeMo's nucleotide tokenizer (see DATA_EOS below). The
 * vocabulary therefore fits in DATA_VOCAB = 256.
 *
 * Layout. Each record r of L bases is split by region: its first c = L - floor(L*val_fraction)
 * bases go to training, the last L - c to validation. Each record is wrapped as
 * BOS + bases + EOS, and the cut falls between bases, so the training piece is BOS + head
 * (+ EOS when the whole record is training) and the validation piece is tail + EOS. The
 * pieces of one split are concatenated in file order into that split's token stream:
 * records shorter than a window are PACKED with the next record (no padding). Train and
 * validation are separate streams, so no window ever crosses the train/validation boundary.
 *
 * Windows. Window w of a split covers stream tokens [w*stride, w*stride + seq); its labels
 * are the next tokens, [w*stride + 1, w*stride + seq], so a window needs seq + 1 tokens and
 * a split of n tokens has (n - seq - 1) / stride + 1 windows (0 if n <= seq). Overlap is
 * seq - stride; the last < stride tokens of a stream that do not fill a window are not used.
 * A label is DATA_IGNORE (-1, masked from the loss) wherever the target token is not one of
 * A/C/G/T/a/c/g/t: N, the other IUPAC codes, BOS, EOS and PAD.
 *
 * Determinism. The training batch of step s is a pure function of (seed, s): global sample
 * g = s*batch + row belongs to epoch g / n_train_windows and takes window
 * perm_epoch(g % n_train_windows), where perm_epoch is a seeded bijection of the window ids
 * (a Feistel network keyed by splitmix64(seed, epoch), cycle-walked onto [0, n)). With
 * rc_augment, sample g is reverse-complemented when a splitmix64 hash of (seed, g) says so
 * (half of the samples). No global or hidden state: resuming at step s is bit-exact, and
 * batches may be computed from several threads at once. Validation windows are the fixed
 * sequential list 0..n_val-1, never augmented.
 *
 * Reverse complement of a window: the seq + 1 tokens [w*stride, w*stride + seq] are
 * reversed and each base complemented (A<->T, C<->G, R<->Y, K<->M, B<->V, D<->H; S, W, N
 * map to themselves; U -> A; case is preserved); BOS and EOS swap (the reversed record reads
 * BOS + revcomp + EOS); tokens and labels are then taken as for a forward window.
 *
 * Memory: the two streams hold one byte per token (about the genome size). Loading human
 * chr20 (63 Mb, BGZF) takes about a second; the caller shows progress through
 * data_open_cb's callback.
 */
#ifndef MOEC_DATA_H
#define MOEC_DATA_H

#include <stddef.h>
#include <stdint.h>

/* Special token ids, as in BioNeMo's nucleotide tokenizer (bionemo-framework,
 * bionemo-recipes/models/llama3/create_tokenizer.py and tests/test_tokenizer.py:
 * "NeMo convention (EOS=0, PAD=1, BOS=2, UNK=3)", every other character -> ord(c)), which
 * follows NeMo's ByteLevelTokenizer defaults (_eos_id = 0, _pad_id = 1). All are below 32,
 * so they collide with no nucleotide letter. UNK (3) is never produced here: an unknown
 * character is an error. */
#define DATA_EOS 0
#define DATA_PAD 1
#define DATA_BOS 2
#define DATA_VOCAB 256   /* token ids are < 256 */
#define DATA_IGNORE (-1) /* label value masked from the loss */

enum { DATA_TRAIN = 0, DATA_VAL = 1 };

typedef struct data_set data_set;

typedef struct {
  int64_t seq;         /* window length in tokens, >= 1 */
  int64_t stride;      /* window start step, 1..seq; 0 means seq (no overlap) */
  double val_fraction; /* share of each record (its end) held out for validation, in [0, 1) */
  int uppercase;       /* 1: fold soft-masked lowercase bases to uppercase */
  int rc_augment;      /* 1: reverse-complement half of the training samples */
  uint64_t seed;
} data_opts;

/* Progress while loading: done and total are bytes of the file as stored (compressed
 * bytes for .gz); total is 0 when unknown. Called about every 4 MB of sequence. */
typedef void (*data_progress_fn)(void *ctx, int64_t done, int64_t total);

/* Loads path. On error returns NULL and writes into err a message "PATH: error: ..." (or
 * "PATH:LINE: error: ..." / "PATH:LINE:COL: error: ..." where a place helps) that says what
 * is wrong and how to fix it. err may be NULL. Never aborts on bad input. While reading,
 * htslib's own log is silenced (its level is restored afterwards): the message here says it
 * all. */
data_set *data_open(const char *path, const data_opts *o, char *err, size_t errlen);
data_set *data_open_cb(const char *path, const data_opts *o, data_progress_fn progress,
                       void *ctx, char *err, size_t errlen);
void data_close(data_set *d);

int64_t data_n_windows(const data_set *d, int split); /* split: DATA_TRAIN or DATA_VAL */
int64_t data_n_bases(const data_set *d, int split);   /* bases (no BOS/EOS) in the split */
int64_t data_n_records(const data_set *d);
int64_t data_n_acgt(const data_set *d);               /* A/C/G/T/a/c/g/t bases, both splits */

/* Training batch of step s (s >= 0): tokens and labels (batch, seq) int32. */
void data_train_batch(const data_set *d, int64_t step, int64_t batch, int32_t *tokens,
                      int32_t *labels);
/* Rows [row0, row0 + nrows) of the same batch, (nrows, seq) each: for data parallelism, where
 * each rank takes its share of one global batch. data_train_batch(d,s,b,..) ==
 * data_train_rows(d,s,b,0,b,..). */
void data_train_rows(const data_set *d, int64_t step, int64_t batch, int64_t row0,
                     int64_t nrows, int32_t *tokens, int32_t *labels);
/* Validation window i (0 <= i < n_windows(VAL)), batch rows starting at i, wrapping. When the
 * split has no windows (val_fraction = 0), rows are PAD with labels DATA_IGNORE. */
void data_val_batch(const data_set *d, int64_t i, int64_t batch, int32_t *tokens,
                    int32_t *labels);

/* Lower-level access (tests, tools). The window id and rc flag that training sample
 * (step, row) uses; one window (seq) of a split, forward or reverse-complemented; the raw
 * token stream of a split (n tokens, one byte each). */
int64_t data_train_window_id(const data_set *d, int64_t step, int64_t batch, int64_t row,
                             int *rc);
void data_window(const data_set *d, int split, int64_t w, int rc, int32_t *tokens,
                 int32_t *labels);
const uint8_t *data_stream(const data_set *d, int split, int64_t *n);

/* Complement of one token (IUPAC-aware, case-preserving; BOS <-> EOS; others unchanged). */
int data_complement(int token);

#endif
