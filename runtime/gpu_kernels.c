/* gpu_kernels.c -- rt_cuda's core: module compile-and-load on first use, the kernel lookup
 * table, launches, scratch, the device error flag and the list of kernels the launchers use.
 * The launch functions themselves are in gpu_kernels_ops.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "gpu_kernels_int.h"
#include "gpu_nvrtc.h"

int rtk_fail(rt_cuda *k, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(k->err, sizeof k->err, fmt, ap);
  va_end(ap);
  return -1;
}

static char *dup_or_null(const char *s) {
  if (!s) return NULL;
  char *d = malloc(strlen(s) + 1);
  if (d) strcpy(d, s);
  return d;
}

int rt_cuda_probe(char *info, size_t info_len, char *err, size_t errlen) {
  int n = 0;
  if (gpu_device_count(&n, err, errlen) != 0) return -1;
  if (n == 0) {
    snprintf(err, errlen, "the NVIDIA driver sees no GPU; use --device cpu");
    return -1;
  }
  char nerr[1024];
  if (gpu_nvrtc_load(nerr, sizeof nerr) != 0) {
    snprintf(err, errlen, "%s (moec compiles its GPU kernels with NVRTC at run time); use --device cpu", nerr);
    return -1;
  }
  int ma, mi;
  gpu_nvrtc_version(&ma, &mi);
  if (info) snprintf(info, info_len, "%d GPU%s, NVRTC %d.%d", n, n == 1 ? "" : "s", ma, mi);
  return 0;
}

rt_cuda *rt_cuda_new(gpu_ctx *g, const rt_cuda_opts *o, char *err, size_t errlen) {
  if (gpu_nvrtc_load(err, errlen) != 0) return NULL;
  const gpu_device_info *d = gpu_info(g);
  rt_cuda *k = calloc(1, sizeof *k);
  if (!k) {
    snprintf(err, errlen, "out of host memory");
    return NULL;
  }
  k->g = g;
  if (o && o->arch) snprintf(k->arch, sizeof k->arch, "%s", o->arch);
  else gpu_nvrtc_pick_arch(d->cc_major, d->cc_minor, k->arch, sizeof k->arch);
  if (!k->arch[0]) {
    int ma, mi;
    gpu_nvrtc_version(&ma, &mi);
    snprintf(err, errlen, "NVRTC %d.%d cannot compile for %s (compute capability %d.%d)", ma, mi, d->name, d->cc_major,
             d->cc_minor);
    free(k);
    return NULL;
  }
  k->dump_dir = dup_or_null(o ? o->dump_dir : NULL);
  k->cache_dir = dup_or_null(o ? o->cache_dir : NULL);
  if (gpu_alloc(g, &k->err_flag, sizeof(int), "the kernel error flag") != 0 || gpu_memset32(g, k->err_flag, 0, 1) != 0) {
    snprintf(err, errlen, "%s", gpu_error(g));
    rt_cuda_free(k);
    return NULL;
  }
  return k;
}

void rt_cuda_free(rt_cuda *k) {
  if (!k) return;
  gpu_sync(k->g);
  for (int i = 0; i < k->n_mods; i++) gpu_module_unload(k->g, k->mods[i].mod);
  gpu_free(k->g, k->err_flag);
  gpu_free(k->g, k->ws);
  gpu_free(k->g, k->rope.cs);
  free(k->dump_dir);
  free(k->cache_dir);
  free(k);
}

const char *rt_cuda_error(const rt_cuda *k) { return k->err; }
gpu_ctx *rt_cuda_gpu(const rt_cuda *k) { return k->g; }
const char *rt_cuda_arch(const rt_cuda *k) { return k->arch; }

int rt_cuda_check(rt_cuda *k, int *ck) {
  *ck = CK_OK;
  int v = 0;
  if (gpu_download(k->g, &v, k->err_flag, sizeof v) != 0) return rtk_fail(k, "%s", gpu_error(k->g));
  if (v != 0 && gpu_upload(k->g, k->err_flag, &(int){0}, sizeof(int)) != 0) return rtk_fail(k, "%s", gpu_error(k->g));
  *ck = v;
  return 0;
}

int rtk_scratch(rt_cuda *k, size_t bytes, gpu_ptr *p) {
  if (bytes > k->ws_cap) {
    size_t cap = k->ws_cap ? k->ws_cap : (size_t)1 << 20;
    while (cap < bytes) cap *= 2;
    if (gpu_sync(k->g) != 0) return rtk_fail(k, "%s", gpu_error(k->g)); /* queued kernels may use the old one */
    gpu_free(k->g, k->ws);
    k->ws = 0;
    k->ws_cap = 0;
    if (gpu_alloc(k->g, &k->ws, cap, "kernel scratch") != 0) return rtk_fail(k, "%s", gpu_error(k->g));
    k->ws_cap = cap;
  }
  *p = k->ws;
  return 0;
}

/* ---- the kernels the launchers use (checked by test_gpu_nvrtc_compile) ---- */
static const struct {
  cg_family f;
  const char *op;
  int n_dt; /* dtype suffixes: every combination is instantiated */
} uses[] = {
    {CG_FAM_ELEMENTWISE, "cast", 2},          {CG_FAM_ELEMENTWISE, "silu_fwd", 1},
    {CG_FAM_ELEMENTWISE, "silu_bwd", 1},      {CG_FAM_ELEMENTWISE, "mul_fwd", 1},
    {CG_FAM_ELEMENTWISE, "mul_bwd", 1},       {CG_FAM_ELEMENTWISE, "add_fwd", 1},
    {CG_FAM_ELEMENTWISE, "add_bwd", 1},       {CG_FAM_ELEMENTWISE, "fill", 1},
    {CG_FAM_ELEMENTWISE, "slice_cols", 1},    {CG_FAM_ELEMENTWISE, "colsum_partial", 1},
    {CG_FAM_ELEMENTWISE, "colsum_final", 0},  {CG_FAM_EMBEDDING, "embedding_fwd", 1},
    {CG_FAM_EMBEDDING, "embedding_bwd", 1},   {CG_FAM_RMSNORM, "rmsnorm_fwd", 2},
    {CG_FAM_RMSNORM, "rmsnorm_bwd_x", 2},     {CG_FAM_RMSNORM, "rmsnorm_rstd", 1},
    {CG_FAM_RMSNORM, "rmsnorm_bwd_w_partial", 1}, {CG_FAM_ROPE, "rope", 1},
    {CG_FAM_ROUTER, "topk", 0},
    {CG_FAM_ROUTER, "softmax_rows", 0},       {CG_FAM_ROUTER, "logsumexp_rows", 0},
    {CG_FAM_ROUTER, "route_weights_fwd", 0},  {CG_FAM_ROUTER, "route_weights_bwd", 0},
    {CG_FAM_ROUTER, "aux_partial", 0},        {CG_FAM_ROUTER, "aux_final", 0},
    {CG_FAM_ROUTER, "aux_bwd", 0},            {CG_FAM_ROUTER, "aux_final_share", 0},
    {CG_FAM_ROUTER, "aux_bwd_share", 0},      {CG_FAM_ROUTER, "z_partial", 0},
    {CG_FAM_ROUTER, "z_final", 0},            {CG_FAM_ROUTER, "z_bwd", 0},
    {CG_FAM_ROUTE, "route_count", 0},         {CG_FAM_ROUTE, "route_scan", 0},
    {CG_FAM_ROUTE, "route_fill", 0},          {CG_FAM_ROUTE, "dispatch_fwd", 1},
    {CG_FAM_ROUTE, "dispatch_bwd", 1},        {CG_FAM_ROUTE, "dispatch_bwd_gather", 1},
    {CG_FAM_ROUTE, "combine_fwd", 2},         {CG_FAM_ROUTE, "combine_bwd", 2},
    {CG_FAM_LOSS, "ce_partial", 1},           {CG_FAM_LOSS, "ce_final", 0},
    {CG_FAM_LOSS, "ce_count", 0},             {CG_FAM_LOSS, "ce_bwd", 1},
    {CG_FAM_LOSS, "label_count", 0},          {CG_FAM_LOSS, "ce_share", 0},
    {CG_FAM_OPTIM, "adamw", 2},               {CG_FAM_OPTIM, "adamw_table", 2}, /* gradient, moments */
    {CG_FAM_OPTIM, "sumsq_partial", 1},       {CG_FAM_OPTIM, "sumsq_table", 1},
    {CG_FAM_OPTIM, "grad_norm_final", 0},     {CG_FAM_MXFP8, "mxfp8_quantize", 1},
    {CG_FAM_MXFP8, "mxfp8_quantize_cols", 1}, {CG_FAM_MXFP8, "mxfp8_quantize_act", 1}, {CG_FAM_MXFP8, "mxfp8_quantize_act_store", 1},
    {CG_FAM_MXFP8, "mxfp8_dequantize", 1}, {CG_FAM_MXFP8, "mxfp8_qdq", 2},
    {CG_FAM_MXFP8, "mxfp8_qdq_last", 2},       {CG_FAM_MXFP8, "mxfp8_quantize_cols_experts", 1},
    {CG_FAM_MXFP8, "mxfp8_scales_vec128", 0}, {CG_FAM_MXFP8, "mxfp8_quantize_tiles", 1},
    {CG_FAM_MXFP8, "adamw_squares", 2},       /* gradient, moments */
    {CG_FAM_GROUPED, "perm_from_pos", 0},     {CG_FAM_GROUPED, "perm_invert", 0},
    {CG_FAM_GROUPED, "expert_probs", 0},      {CG_FAM_GROUPED, "grouped_colsum", 1},
    {CG_FAM_GROUPED, "mlp_act", 1},           {CG_FAM_GROUPED, "expert_permute", 2},
    {CG_FAM_GROUPED, "expert_unpermute", 2},  {CG_FAM_GROUPED, "expert_weight_grad", 2},
    {CG_FAM_GROUPED, "copy_cols", 2},         {CG_FAM_GROUPED, "mlp_bwd_rows", 2},
    {CG_FAM_GROUPED, "mlp_bwd_split", 1},     {CG_FAM_GROUPED, "mlp_bwd_split_q", 1},
    {CG_FAM_GROUPED, "mlp_bwd_split_fp8", 1}, {CG_FAM_GROUPED, "mlp_dp_sum", 0},
    {CG_FAM_GROUPED, "ggemm_rows", 3},        {CG_FAM_GROUPED, "ggemm_wgrad", 3},
    {CG_FAM_NARROW, "narrow_n_8", 0},         {CG_FAM_NARROW, "narrow_n_16", 0},
    {CG_FAM_NARROW, "narrow_tn_partial_8", 0}, {CG_FAM_NARROW, "narrow_tn_partial_16", 0},
    {CG_FAM_NARROW, "narrow_tn_final", 0},
};

static rt_cuda_kernel_ref refs[512];
static int n_refs = -1;

const rt_cuda_kernel_ref *rt_cuda_kernel_refs(int *n) {
  if (n_refs < 0) { /* not thread-safe on first call: tests and the executor's setup call it */
    int m = 0;
    for (size_t u = 0; u < sizeof uses / sizeof uses[0]; u++) {
      cg_variant vs[8];
      int nv = cg_family_variants(uses[u].f, vs, 8);
      int combos = uses[u].n_dt == 0 ? 1 : uses[u].n_dt == 1 ? CG_DT_COUNT : uses[u].n_dt == 2 ? CG_DT_COUNT * CG_DT_COUNT : CG_DT_COUNT * CG_DT_COUNT * CG_DT_COUNT;
      for (int v = 0; v < nv; v++)
        for (int c = 0; c < combos && m < (int)(sizeof refs / sizeof refs[0]); c++) {
          rt_cuda_kernel_ref *r = &refs[m++];
          r->family = uses[u].f;
          r->variant = vs[v];
          if (uses[u].n_dt == 0) cg_kname(r->name, sizeof r->name, uses[u].op, 0);
          else if (uses[u].n_dt == 1) cg_kname(r->name, sizeof r->name, uses[u].op, 1, c);
          else if (uses[u].n_dt == 2) cg_kname(r->name, sizeof r->name, uses[u].op, 2, c / CG_DT_COUNT, c % CG_DT_COUNT);
          else cg_kname(r->name, sizeof r->name, uses[u].op, 3, c / (CG_DT_COUNT * CG_DT_COUNT), (c / CG_DT_COUNT) % CG_DT_COUNT, c % CG_DT_COUNT);
        }
    }
    n_refs = m;
  }
  *n = n_refs;
  return refs;
}

/* ---- modules and functions ---- */
static int module_index(rt_cuda *k, cg_family f, const cg_variant *v) {
  char name[64];
  cg_module_name(f, v, name, sizeof name);
  for (int i = 0; i < k->n_mods; i++)
    if (strcmp(k->mods[i].name, name) == 0) return i;
  if (k->n_mods == RTK_MAX_MODS) return rtk_fail(k, "too many kernel modules (%d)", RTK_MAX_MODS);
  char *src = cg_emit(f, v, 0);
  if (!src) return rtk_fail(k, "could not generate kernel module %s", name);
  gpu_nvrtc_opts o = {.arch = k->arch, .dump_dir = k->dump_dir, .cache_dir = k->cache_dir};
  gpu_nvrtc_out out;
  char err[sizeof k->err - 128];
  int rc = gpu_nvrtc_compile(name, src, &o, &out, err, sizeof err);
  free(src);
  if (rc != 0) return rtk_fail(k, "%s", err);
  void *mod = NULL;
  rc = gpu_module_load(k->g, out.image, &mod, name);
  gpu_nvrtc_out_free(&out);
  if (rc != 0) return rtk_fail(k, "%s", gpu_error(k->g));
  snprintf(k->mods[k->n_mods].name, sizeof k->mods[0].name, "%s", name);
  k->mods[k->n_mods].mod = mod;
  return k->n_mods++;
}

static uint32_t fnv1a(const char *s) {
  uint32_t h = 2166136261u;
  while (*s) h = (h ^ (uint8_t)*s++) * 16777619u;
  return h;
}

/* The slot of kernel `name` in k->fns (compiled and loaded on first use), -1 on failure. */
static int function_slot(rt_cuda *k, cg_family f, const cg_variant *v, const char *name) {
  char mod[64], key[128];
  cg_module_name(f, v, mod, sizeof mod);
  snprintf(key, sizeof key, "%s/%s", mod, name);
  uint32_t h = fnv1a(key) % RTK_FN_SLOTS;
  for (uint32_t probe = 0; probe < RTK_FN_SLOTS; probe++, h = (h + 1) % RTK_FN_SLOTS) {
    if (strcmp(k->fns[h].key, key) == 0) return (int)h;
    if (k->fns[h].key[0]) continue;
    int m = module_index(k, f, v);
    if (m < 0) return -1;
    void *fn;
    if (gpu_function(k->g, k->mods[m].mod, name, &fn) != 0) {
      rtk_fail(k, "%s", gpu_error(k->g));
      return -1;
    }
    snprintf(k->fns[h].key, sizeof k->fns[h].key, "%s", key);
    k->fns[h].fn = fn;
    k->fns[h].smem_max = 0;
    return (int)h;
  }
  rtk_fail(k, "kernel table full");
  return -1;
}

static void *function(rt_cuda *k, cg_family f, const cg_variant *v, const char *name) {
  const int h = function_slot(k, f, v, name);
  return h < 0 ? NULL : k->fns[h].fn;
}

int rtk_launch(rt_cuda *k, cg_family f, const cg_variant *v, const char *name, uint64_t gx, uint64_t gy,
               unsigned threads, void **args) {
  return rtk_launch_smem(k, f, v, name, gx, gy, threads, 0, args);
}

int rtk_launch_smem(rt_cuda *k, cg_family f, const cg_variant *v, const char *name, uint64_t gx, uint64_t gy,
                    unsigned threads, unsigned smem, void **args) {
  static const cg_variant none = {0, 0};
  if (!v) v = &none;
  if (gx == 0 || gy == 0) return 0;
  if (gx > 0x7fffffffu || gy > 65535) return rtk_fail(k, "%s: grid %llu x %llu is too large", name, (unsigned long long)gx, (unsigned long long)gy);
  const int h = function_slot(k, f, v, name);
  if (h < 0) return -1;
  void *fn = k->fns[h].fn;
  /* over 48 KiB a block must be allowed first, once a kernel (a host call, no stream work) */
  if (smem > 48 * 1024 && smem > k->fns[h].smem_max) {
    if (gpu_set_max_smem(k->g, fn, (int)smem) != 0)
      return rtk_fail(k, "%s: %u bytes of shared memory a block, more than this GPU allows: %s", name, smem,
                      gpu_error(k->g));
    k->fns[h].smem_max = smem;
  }
  const unsigned grid[3] = {(unsigned)gx, (unsigned)gy, 1}, block[3] = {threads, 1, 1};
  if (gpu_launch(k->g, fn, name, grid, block, smem, args) != 0) return rtk_fail(k, "%s", gpu_error(k->g));
  return 0;
}

int rtk_launch3(rt_cuda *k, cg_family f, const char *name, uint64_t gx, uint64_t gy, uint64_t gz, unsigned threads,
                void **args) {
  static const cg_variant none = {0, 0};
  if (gx == 0 || gy == 0 || gz == 0) return 0;
  if (gx > 0x7fffffffu || gy > 65535 || gz > 65535)
    return rtk_fail(k, "%s: grid %llu x %llu x %llu is too large", name, (unsigned long long)gx, (unsigned long long)gy,
                    (unsigned long long)gz);
  void *fn = function(k, f, &none, name);
  if (!fn) return -1;
  const unsigned grid[3] = {(unsigned)gx, (unsigned)gy, (unsigned)gz}, block[3] = {threads, 1, 1};
  if (gpu_launch(k->g, fn, name, grid, block, 0, args) != 0) return rtk_fail(k, "%s", gpu_error(k->g));
  return 0;
}

int rt_cuda_load_all(rt_cuda *k) {
  for (int f = 0; f < CG_FAM_COUNT; f++) {
    cg_variant vs[8];
    int nv = cg_family_variants((cg_family)f, vs, 8);
    for (int i = 0; i < nv; i++)
      if (module_index(k, (cg_family)f, &vs[i]) < 0) return -1;
  }
  return 0;
}
