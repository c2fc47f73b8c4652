/* test_ck_parity.c -- the CPU reference kernels against PyTorch and Hugging Face transformers
 * (MixtralForCausalLM's own modules and functions), from results stored in
 * tests/unit/ck_parity.bin by tests/unit/ck_parity_gen.py (see there for the file format):
 * AdamW with clipping, RMSNorm, RoPE, GQA attention, routing weights, HF's aux loss,
 * cross-entropy, SiLU, bf16 and E4M3 casts, and a whole MixtralSparseMoeBlock built from
 * our kernels. A section missing from the file is reported as skipped. */
#include "ck_test.h"

#define PARITY_FILE "tests/unit/ck_parity.bin"

typedef struct {
  char name[49];
  uint32_t dtype;
  int64_t n;
  void *data;
} entry;
static entry *entries;
static int n_entries;

static int load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  char magic[8];
  uint32_t hdr[2];
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "MOECKPAR", 8) != 0 || fread(hdr, 4, 2, f) != 2 ||
      hdr[0] != 1) {
    fclose(f);
    return 0;
  }
  n_entries = (int)hdr[1];
  entries = calloc((size_t)n_entries, sizeof(entry));
  static const size_t size[6] = {4, 4, 1, 2, 4, 1};
  for (int i = 0; i < n_entries; i++) {
    uint32_t meta[2];
    int ok = fread(entries[i].name, 1, 48, f) == 48 && fread(meta, 4, 2, f) == 2 &&
             fread(&entries[i].n, 8, 1, f) == 1 && meta[0] < 6 && entries[i].n >= 0;
    if (ok) {
      entries[i].dtype = meta[0];
      entries[i].data = malloc((size_t)entries[i].n * size[meta[0]] + 1);
      ok = fread(entries[i].data, size[meta[0]], (size_t)entries[i].n, f) == (size_t)entries[i].n;
      if (meta[0] == 5) ((char *)entries[i].data)[entries[i].n] = 0;
    }
    if (!ok) {
      n_entries = i;
      fclose(f);
      return 0;
    }
  }
  fclose(f);
  return 1;
}

/* The entry's data, or NULL (and a note) when the file lacks it or its size is not n. */
static void *get(const char *name, int64_t n) {
  for (int i = 0; i < n_entries; i++)
    if (strcmp(entries[i].name, name) == 0) {
      if (n >= 0 && entries[i].n != n) {
        printf("  entry %s has %lld values, expected %lld\n", name, (long long)entries[i].n,
               (long long)n);
        return NULL;
      }
      return entries[i].data;
    }
  return NULL;
}
static int have(const char *section, const char *name) {
  if (get(name, -1)) return 1;
  printf("%s: SKIPPED, %s has no %s (regenerate it with tests/unit/ck_parity_gen.py)\n", section,
         PARITY_FILE, name);
  return 0;
}

/* float buffer -> double copy for check_close */
static void close_to(const char *what, const float *got, const float *want, int64_t n, double rtol,
                     double atol) {
  int64_t nonzero = 0;
  for (int64_t i = 0; i < n; i++) nonzero += want[i] != 0.0f;
  CHECK(nonzero > 0, "%s: the stored reference is all zeros (a broken generator?)", what);
  double *w = to_double(want, n);
  check_close(what, got, w, n, rtol, atol);
  free(w);
}

static void parity_adamw(void) {
  if (!have("adamw", "adamw.p")) return;
  enum { N = 256, S = 5 };
  printf("AdamW vs torch.optim.AdamW (foreach=False), %d steps of %d weights:\n", S, N);
  const float *p0 = get("adamw.p0", N), *g = get("adamw.g", S * N);
  float p[N], m[N] = {0}, v[N] = {0};
  memcpy(p, p0, sizeof p);
  for (int s = 1; s <= S; s++)
    ck_adamw_step(p, g + (s - 1) * N, m, v, N, s, 1.0f, 3e-4, 0.9, 0.95, 1e-8, 0.1);
  close_to("adamw p (lr 3e-4, betas .9/.95, wd .1)", p, get("adamw.p", N), N, 1e-6, 1e-7);
  close_to("adamw exp_avg", m, get("adamw.m", N), N, 1e-6, 1e-12);
  close_to("adamw exp_avg_sq", v, get("adamw.v", N), N, 1e-6, 1e-14);
  /* same operations in the same order (see ck_optim.c): expect the very same bits */
  int differ = 0;
  for (int i = 0; i < N; i++)
    differ += memcmp(&p[i], (const float *)get("adamw.p", N) + i, 4) != 0 ||
              memcmp(&m[i], (const float *)get("adamw.m", N) + i, 4) != 0 ||
              memcmp(&v[i], (const float *)get("adamw.v", N) + i, 4) != 0;
  CHECK(differ == 0, "adamw: %d weights differ from torch in some bit of p, m or v", differ);
  printf("  weights whose p, exp_avg or exp_avg_sq differ from torch in any bit: %d of %d\n",
         differ, N);

  enum { NB = 12 };
  const float *ga = get("adamw_clip.ga", S * N), *gb = get("adamw_clip.gb", S * NB);
  const float *norms = get("adamw_clip.norm", S);
  float pa[N], pb[NB], ma[N] = {0}, va[N] = {0}, mb[NB] = {0}, vb[NB] = {0}, nrm[S];
  memcpy(pa, p0, sizeof pa), memcpy(pb, get("adamw_clip.pb0", NB), sizeof pb);
  for (int s = 1; s <= S; s++) {
    const float *bufs[2] = {ga + (s - 1) * N, gb + (s - 1) * NB};
    const int64_t sizes[2] = {N, NB};
    double norm = ck_grad_norm(bufs, sizes, 2);
    float coef = ck_clip_coef(norm, 1.0);
    nrm[s - 1] = (float)norm;
    ck_adamw_step(pa, bufs[0], ma, va, N, s, coef, 1e-2, 0.8, 0.999, 1e-6, 0.1);
    ck_adamw_step(pb, bufs[1], mb, vb, NB, s, coef, 1e-2, 0.8, 0.999, 1e-6, 0.0);
  }
  close_to("clip_grad_norm_ total norm, 5 steps", nrm, norms, S, 1e-6, 0);
  close_to("adamw + clip, weight decay .1", pa, get("adamw_clip.pa", N), N, 1e-6, 1e-7);
  close_to("adamw + clip, no decay (norm weights)", pb, get("adamw_clip.pb", NB), NB, 1e-6, 1e-7);
}

static void parity_rmsnorm(void) {
  if (!have("rmsnorm", "rmsnorm.y")) return;
  enum { T = 6, H = 12 };
  printf("RMSNorm vs MixtralRMSNorm (T=%d H=%d eps=1e-5):\n", T, H);
  float y[T * H], dx[T * H], dw[H] = {0};
  const float *x = get("rmsnorm.x", T * H), *w = get("rmsnorm.w", H),
              *dy = get("rmsnorm.dy", T * H);
  ck_rmsnorm_fwd(x, w, y, T, H, 1e-5f);
  ck_rmsnorm_bwd(x, w, dy, dx, dw, T, H, 1e-5f);
  close_to("rmsnorm y", y, get("rmsnorm.y", T * H), T * H, 1e-6, 1e-6);
  close_to("rmsnorm dx", dx, get("rmsnorm.dx", T * H), T * H, 1e-5, 1e-6);
  close_to("rmsnorm dw", dw, get("rmsnorm.dw", H), H, 1e-5, 1e-6);
}

static void parity_rope(void) {
  if (!have("rope", "rope.y")) return;
  enum { B = 2, S = 5, NH = 3, HD = 8, T = B * S, N = T * NH * HD };
  printf("RoPE vs MixtralRotaryEmbedding + apply_rotary_pos_emb (B=%d seq=%d nh=%d hd=%d "
         "theta=5e5):\n",
         B, S, NH, HD);
  float y[N], dx[N];
  ck_rope_fwd(get("rope.x", N), y, T, NH, HD, S, 5e5);
  ck_rope_bwd(get("rope.dy", N), dx, T, NH, HD, S, 5e5);
  close_to("rope y", y, get("rope.y", N), N, 1e-6, 1e-6);
  close_to("rope dx", dx, get("rope.dx", N), N, 1e-6, 1e-6);
  if (!have("rope", "rope_long.pos")) return;
  enum { SL = 8192, NP = 64 };
  const int32_t *pos = get("rope_long.pos", NP);
  const float *xl = get("rope_long.x", NP * HD), *yl = get("rope_long.y", NP * HD);
  float *x2 = falloc(SL * HD), *y2 = falloc(SL * HD);
  for (int i = 0; i < NP; i++) memcpy(x2 + pos[i] * HD, xl + i * HD, HD * sizeof(float));
  ck_rope_fwd(x2, y2, SL, 1, HD, SL, 5e7);
  double worst = 0.0;
  for (int i = 0; i < NP; i++)
    for (int c = 0; c < HD; c++)
      worst = fmax(worst, fabs((double)y2[pos[i] * HD + c] - yl[i * HD + c]));
  /* HF computes inv_freq and p * inv_freq in fp32: at p ~ 8191 the angle is off by up to about
   * half an fp32 ulp of 8191 (2.4e-4) plus the inv_freq rounding; we use exact angles */
  CHECK(worst < 1e-2, "rope at long positions differs from HF by %g", worst);
  printf("  %d positions in 0..8191 (theta 5e7): largest |ours - HF| = %.2e, from HF's fp32\n"
         "  angles (ours are exact; a documented difference, bound 1e-2)\n",
         NP, worst);
  free(x2), free(y2);
}

static void parity_attention(void) {
  if (!have("attention", "att.out")) return;
  enum { B = 2, S = 70, NH = 4, NKV = 2, HD = 8, T = B * S, NQ = T * NH * HD, NK = T * NKV * HD };
  printf("attention vs transformers (%s), B=%d seq=%d nh=%d nkv=%d hd=%d causal:\n",
         (const char *)get("att.impl", -1) ? (const char *)get("att.impl", -1) : "?", B, S, NH, NKV,
         HD);
  const float *q = get("att.q", NQ), *k = get("att.k", NK), *v = get("att.v", NK);
  float *out = falloc(NQ), *lse = falloc(B * NH * S), *dq = falloc(NQ), *dk = falloc(NK),
        *dv = falloc(NK);
  ck_attention_fwd(q, k, v, out, lse, B, S, NH, NKV, HD, 1);
  ck_attention_bwd(q, k, v, out, lse, get("att.dout", NQ), dq, dk, dv, B, S, NH, NKV, HD, 1);
  close_to("attention out", out, get("att.out", NQ), NQ, 1e-5, 1e-6);
  close_to("attention dq", dq, get("att.dq", NQ), NQ, 1e-4, 1e-5);
  close_to("attention dk", dk, get("att.dk", NK), NK, 1e-4, 1e-5);
  close_to("attention dv", dv, get("att.dv", NK), NK, 1e-4, 1e-5);
  free(out), free(lse), free(dq), free(dk), free(dv);
}

static void parity_router(void) {
  if (!have("router", "route.w")) return;
  enum { T = 64, E = 8, K = 2 };
  printf("router vs MixtralSparseMoeBlock's routing (softmax, topk, renormalise), T=%d E=%d "
         "k=%d:\n",
         T, E, K);
  const float *logits = get("route.logits", T * E);
  int32_t idx[T * K];
  float w[T * K], dl[T * E];
  ck_topk(logits, idx, T, E, K);
  CHECK(memcmp(idx, get("route.idx", T * K), sizeof idx) == 0, "topk ids differ from torch.topk");
  printf("  topk ids identical to torch.topk of the softmax: %s\n",
         memcmp(idx, get("route.idx", T * K), sizeof idx) == 0 ? "yes" : "NO");
  ck_route_weights_fwd(logits, idx, w, T, E, K);
  ck_route_weights_bwd(logits, idx, get("route.dw", T * K), dl, T, E, K);
  close_to("routing weights", w, get("route.w", T * K), T * K, 1e-6, 1e-7);
  close_to("routing weights bwd dlogits", dl, get("route.dlogits", T * E), T * E, 1e-5, 1e-7);

  if (!have("aux", "aux.loss")) return;
  printf("aux loss vs transformers load_balancing_loss_func over 2 layers (logits stacked):\n");
  const float *al = get("aux.logits", 2 * T * E);
  int32_t aidx[2 * T * K];
  float loss, adl[2 * T * E] = {0};
  ck_topk(al, aidx, 2 * T, E, K);
  ck_aux_loss_fwd(al, aidx, &loss, 2 * T, E, K, 1.0f);
  ck_aux_loss_bwd(al, aidx, 1.0f, adl, 2 * T, E, K, 1.0f);
  close_to("aux loss", &loss, get("aux.loss", 1), 1, 1e-6, 0);
  close_to("aux loss bwd dlogits", adl, get("aux.dlogits", 2 * T * E), 2 * T * E, 1e-5, 1e-9);
}

static void parity_ce_silu(void) {
  if (have("cross_entropy", "ce.loss")) {
    enum { T = 32, V = 256 };
    printf("cross-entropy vs F.cross_entropy(ignore_index) with every 7th label masked:\n");
    float loss, *dl = falloc(T * V);
    const float *lg = get("ce.logits", T * V);
    const int32_t *lab = get("ce.labels", T);
    CHECK(ck_cross_entropy_fwd(lg, lab, &loss, T, V) == CK_OK, "ce rc");
    ck_cross_entropy_bwd(lg, lab, 1.0f, dl, T, V);
    close_to("cross-entropy loss", &loss, get("ce.loss", 1), 1, 1e-6, 0);
    close_to("cross-entropy dlogits", dl, get("ce.dlogits", T * V), T * V, 1e-5, 1e-9);
    free(dl);
  }
  if (have("silu", "silu.y")) {
    enum { N = 1000 };
    printf("SiLU vs F.silu on [-8, 8]:\n");
    float y[N], dx[N];
    ck_silu_fwd(get("silu.x", N), y, N);
    ck_silu_bwd(get("silu.x", N), get("silu.dy", N), dx, N);
    close_to("silu y", y, get("silu.y", N), N, 1e-6, 1e-7);
    close_to("silu dx", dx, get("silu.dx", N), N, 1e-6, 1e-7);
  }
}

static void parity_formats(void) {
  if (!have("formats", "bf16.out")) return;
  printf("number formats vs torch casts:\n");
  int64_t n = 0, m = 0;
  for (int i = 0; i < n_entries; i++) {
    if (strcmp(entries[i].name, "bf16.in") == 0) n = entries[i].n;
    if (strcmp(entries[i].name, "e4m3.in") == 0) m = entries[i].n;
  }
  const uint32_t *in = get("bf16.in", n);
  const uint16_t *out = get("bf16.out", n);
  int bad = 0;
  for (int64_t i = 0; i < n; i++) {
    float x;
    memcpy(&x, &in[i], 4);
    bad += ck_float_to_bf16(x) != out[i];
  }
  CHECK(bad == 0, "bf16: %d of %lld differ from torch .to(bfloat16)", bad, (long long)n);
  printf("  bf16: %lld fp32 bit patterns (random, ties, max, inf, denormals), %d differ from "
         "torch\n",
         (long long)n, bad);
  const float *ein = get("e4m3.in", m);
  const uint8_t *eout = get("e4m3.out", m);
  bad = 0;
  for (int64_t i = 0; i < m; i++) bad += ck_float_to_e4m3(ein[i]) != eout[i];
  CHECK(bad == 0, "e4m3: %d of %lld differ from torch float8_e4m3fn", bad, (long long)m);
  printf("  e4m3: %lld values in [-448, 448] (random, ties, subnormals), %d differ from torch "
         "float8_e4m3fn\n",
         (long long)m, bad);
}

/* A MixtralSparseMoeBlock from our kernels: router linear, topk, routing weights, then per
 * expert dispatch, gate/up linears, silu * up, down linear, and combine; and its backward. */
static void parity_moe_block(void) {
  if (!have("moe_block", "moe.out")) return;
  enum { T = 10, H = 12, FF = 8, E = 4, K = 2 };
  printf("MixtralSparseMoeBlock (T=%d H=%d ffn=%d E=%d k=%d) composed of ck_ kernels:\n", T, H, FF,
         E, K);
  const float *x = get("moe.x", T * H), *wg = get("moe.wg", H * E), *w1 = get("moe.w1", E * H * FF);
  const float *w3 = get("moe.w3", E * H * FF), *w2 = get("moe.w2", E * FF * H);
  const float *dout = get("moe.dout", T * H);
  float logits[T * E], w[T * K], out[T * H], dw[T * K], dlog[T * E], dx[T * H] = {0};
  int32_t idx[T * K], rows[E][T * K];
  int64_t n[E];
  float *xe[E], *g[E], *u[E], *a[E], *y[E], *dy[E];
  ck_linear_fwd(x, wg, NULL, logits, T, H, E);
  ck_topk(logits, idx, T, E, K);
  ck_route_weights_fwd(logits, idx, w, T, E, K);
  for (int e = 0; e < E; e++) {
    n[e] = ck_route_rows(idx, T, K, e, rows[e], NULL);
    xe[e] = falloc(n[e] * H), g[e] = falloc(n[e] * FF), u[e] = falloc(n[e] * FF);
    a[e] = falloc(n[e] * FF), y[e] = falloc(n[e] * H), dy[e] = falloc(n[e] * H);
    ck_dispatch_fwd(x, rows[e], xe[e], T, n[e], H);
    ck_linear_fwd(xe[e], w1 + e * H * FF, NULL, g[e], n[e], H, FF);
    ck_linear_fwd(xe[e], w3 + e * H * FF, NULL, u[e], n[e], H, FF);
    ck_silu_fwd(g[e], a[e], n[e] * FF);
    ck_mul_fwd(a[e], u[e], a[e], n[e] * FF);
    ck_linear_fwd(a[e], w2 + e * FF * H, NULL, y[e], n[e], FF, H);
  }
  ck_combine_fwd(idx, w, (const float *const *)y, out, T, K, E, H);
  close_to("moe block out", out, get("moe.out", T * H), T * H, 1e-5, 1e-6);

  ck_combine_bwd(idx, w, (const float *const *)y, dout, dy, dw, T, K, E, H);
  for (int e = 0; e < E; e++) {
    float *da = falloc(n[e] * FF), *dg = falloc(n[e] * FF), *du = falloc(n[e] * FF);
    float *sg = falloc(n[e] * FF), *dxe = falloc(n[e] * H), *dxe2 = falloc(n[e] * H);
    ck_linear_bwd(NULL, w2 + e * FF * H, dy[e], da, NULL, NULL, n[e], FF, H);
    ck_silu_fwd(g[e], sg, n[e] * FF);
    ck_mul_bwd(sg, u[e], da, dg, du, n[e] * FF); /* d(silu(g)) and du */
    ck_silu_bwd(g[e], dg, dg, n[e] * FF);
    ck_linear_bwd(NULL, w1 + e * H * FF, dg, dxe, NULL, NULL, n[e], H, FF);
    ck_linear_bwd(NULL, w3 + e * H * FF, du, dxe2, NULL, NULL, n[e], H, FF);
    ck_add_fwd(dxe, dxe2, dxe, n[e] * H);
    ck_dispatch_bwd(dxe, rows[e], dx, T, n[e], H);
    free(da), free(dg), free(du), free(sg), free(dxe), free(dxe2);
    free(xe[e]), free(g[e]), free(u[e]), free(a[e]), free(y[e]), free(dy[e]);
  }
  ck_route_weights_bwd(logits, idx, dw, dlog, T, E, K);
  float dxr[T * H];
  ck_linear_bwd(NULL, wg, dlog, dxr, NULL, NULL, T, H, E);
  ck_add_fwd(dx, dxr, dx, T * H);
  close_to("moe block dx (experts + router paths)", dx, get("moe.dx", T * H), T * H, 1e-5, 1e-6);
}

int main(void) {
  double t0 = ck_now();
  printf("test_ck_parity: CPU reference kernels against PyTorch / transformers results stored in "
         "%s\n",
         PARITY_FILE);
  CHECK(load(PARITY_FILE), "cannot read %s", PARITY_FILE);
  if (n_entries) printf("generated with %s\n", (const char *)get("versions", -1));
  parity_adamw();
  parity_rmsnorm();
  parity_rope();
  parity_attention();
  parity_router();
  parity_ce_silu();
  parity_formats();
  parity_moe_block();
  for (int i = 0; i < n_entries; i++) free(entries[i].data);
  free(entries);
  return ck_finish("test_ck_parity", t0);
}
