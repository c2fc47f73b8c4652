/* cg_kernels.h -- CUDA C generators for the ops that no library provides: one generator per
 * kernel family (one NVRTC module each), mirroring runtime/cpu_kernels.h function for
 * function. A family's source is a shared prelude (bf16 storage, reductions, the error flag)
 * plus templated device functions, instantiated as extern "C" kernels for each storage
 * dtype combination the IR can ask for:
 *     moec_<op>[_<dtype>...]      e.g. moec_rmsnorm_fwd_bf16_f32 (x bf16, weight f32)
 * The launcher (runtime/gpu_kernels.c) builds the same names with cg_kname.
 *
 * Kernels take device pointers and int64 sizes; every kernel that reads ids (tokens, labels,
 * expert ids, row ids) never reads out of bounds and reports a bad id by setting a device
 * int flag to CK_EINDEX (the first failure wins), leaving that row unwritten.
 *
 * Generated sources include no header, so NVRTC needs no include path on the target.
 */
#ifndef MOEC_CG_KERNELS_H
#define MOEC_CG_KERNELS_H

#include <stddef.h>

typedef enum { CG_DT_F32, CG_DT_BF16, CG_DT_COUNT } cg_dtype;

typedef enum {
  CG_FAM_ELEMENTWISE, /* cast, silu, mul, add, fill, slice_cols, colsum */
  CG_FAM_EMBEDDING,
  CG_FAM_RMSNORM,
  CG_FAM_ROPE,
  CG_FAM_ROUTER,      /* topk, route weights, softmax/logsumexp rows, aux and z losses */
  CG_FAM_ROUTE,       /* the expert permutation, dispatch, combine */
  CG_FAM_LOSS,        /* cross-entropy */
  CG_FAM_OPTIM,       /* AdamW, gradient norm */
  CG_FAM_MXFP8,       /* quantize (rows, columns), dequantize; per (block, share128) */
  CG_FAM_GROUPED,     /* expert-sorted ops: permute, unpermute, grouped GEMMs, GroupedMLP halves */
  CG_FAM_NARROW,      /* f32 GEMMs of at most CG_NARROW columns: the router's */
  CG_FAM_COUNT
} cg_family;

/* Compile-time parameters of a family's module. Only MXFP8 has any today. */
typedef struct {
  int mx_block;    /* elements per E8M0 scale: a power of two in [1, 128] (32 = OCP MX) */
  int mx_share128; /* the blocks of each 128-element group share one scale */
} cg_variant;

/* Launch shapes: the generators bake them into the sources (shared arrays, chunking), the
 * launcher uses the same numbers. */
enum {
  CG_NT_EW = 256,         /* threads per block, elementwise and grid-stride kernels */
  CG_NT_ROW = 256,        /* one block per row: embedding, rmsnorm, dispatch, combine */
  CG_NT_RED = 256,        /* partial-sum and thread-per-row kernels */
  CG_NT_ROUTE = 256,      /* route count / fill */
  CG_NT_CE = 256,         /* cross-entropy: 8 warps, a warp per row */
  CG_NT_MX = 256,         /* MXFP8 */
  CG_NT_SPLIT_FP8 = 512,  /* mlp_bwd_split_fp8: a block a 128 x 128 tile (SF_NT) */
  CG_SPLIT_FP8_MINB = 2,  /* mlp_bwd_split_fp8: blocks an SM (its launch bounds) */
  CG_SPLIT_FP8_SMEM = 3 * 128 * 128 * 2, /* mlp_bwd_split_fp8: its three bf16 tiles (dynamic) */
  CG_ACT_STORE_CHUNKS = 2, /* 8-element chunks a thread in mxfp8_quantize_act_store (AS_U) */
  CG_COLSUM_ROWS = 64,    /* rows per partial column sum */
  CG_ROUTE_CHUNK = 1024,  /* (t, j) pairs per block of the permutation */
  CG_MAX_E = 256,         /* most experts the router and route kernels take */
  CG_CE_ROWS = 64,        /* rows per block in the cross-entropy partial sums */
  CG_GN_PARTS = 256,      /* partial sums (blocks) per tensor in the gradient norm */
  CG_GN_TABLE = 32,       /* gradient tensors per sum-of-squares launch */
  CG_AW_TABLE = 24,       /* parameters per AdamW launch (their table fits the 4 KB of launch parameters) */
  CG_GT = 16,             /* grouped GEMM tile (GT x GT outputs, GT*GT threads) */
  CG_NARROW = 16,         /* the narrow GEMMs' columns (n) at most */
};

const char *cg_family_name(cg_family f);
const char *cg_dtype_name(cg_dtype t);  /* "f32", "bf16" */
const char *cg_dtype_ctype(cg_dtype t); /* "float", "bf16" (the prelude's storage struct) */

/* The variants moec compiles for a family (the NVRTC test compiles each); returns how many
 * were written (at most max). */
int cg_family_variants(cg_family f, cg_variant *v, int max);
/* 0 when v is a variant the family's generator accepts. */
int cg_variant_ok(cg_family f, const cg_variant *v);
/* Module name, the dump and cache file stem: "rmsnorm", "mxfp8_b32", "mxfp8_b32_s128". */
void cg_module_name(cg_family f, const cg_variant *v, char *buf, size_t len);

/* The family's CUDA C source (caller frees), or NULL on a bad variant or out of memory.
 * emu = 1 adds host trampolines (emu_<kernel>(void **args)) for the CPU emulator in
 * scripts/cuda_emu; NVRTC sources are emitted with emu = 0. */
char *cg_emit(cg_family f, const cg_variant *v, int emu);

/* Kernel symbol: "moec_" op, then "_" and the name of each of the n dtypes given. */
const char *cg_kname(char *buf, size_t len, const char *op, int n, ...);

#endif
