/* fa_emu_main.cpp -- the flash-attention kernels (forward, backward) run under fa_emu.h
 * against a naive double-precision attention on the same bf16 inputs. Built and run by
 * tests/unit/test_gpu_flash_emu.c:
 *   c++ -std=c++17 -O2 -I tests/emu -I DIR fa_emu_main.cpp   (DIR/fa_body.cuh: the kernel body)
 *   ./a.out DELAY SEED   (DELAY 1: cp.async lands only at wait_group)
 * Prints one line per case; exits 1 when an error is over its bound. Every kernel variant of
 * runtime/gpu_flash.h runs in some case, launched as gpu_flash.c launches it. */
#include "fa_emu.h"
#include "fa_body.cuh"
#include "runtime/gpu_flash.h"

typedef void (*fwd_fn)(const bf16 *, const bf16 *, const bf16 *, bf16 *, float *, int, int, int, int, int, float);
typedef void (*bwd_fn)(const bf16 *, const bf16 *, const bf16 *, const bf16 *, const float *, const float *, float *,
                       bf16 *, int, int, int, int, int, float, float);
struct FwdVariant {
  int hd, warps, bn, minb;
  fwd_fn fn;
  const char *name;
};
struct BwdVariant {
  int hd, warps, bq, minb;
  bwd_fn fn;
  const char *name;
};
#define FWD_V(hd, w, bn, mb) {hd, w, bn, mb, fa_fwd_d##hd##_w##w##_n##bn##_m##mb, "fa_fwd_d" #hd "_w" #w "_n" #bn "_m" #mb},
#define BWD_V(hd, w, bq, mb) {hd, w, bq, mb, fa_bwd_d##hd##_w##w##_q##bq##_m##mb, "fa_bwd_d" #hd "_w" #w "_q" #bq "_m" #mb},
static const FwdVariant fwd_variants[] = {GPU_FLASH_FWD_VARIANTS(FWD_V)};
static const BwdVariant bwd_variants[] = {GPU_FLASH_BWD_VARIANTS(BWD_V)};

/* the i-th variant (cyclically) of head dim hd */
template <typename V, size_t N> static const V *nth(const V (&vs)[N], int hd, int i) {
  int n = 0;
  for (const V &v : vs) n += v.hd == hd;
  if (n == 0) return nullptr;
  i %= n;
  for (const V &v : vs)
    if (v.hd == hd && i-- == 0) return &v;
  return nullptr;
}

static std::mt19937_64 rng64;
static float urand() { return (float)((rng64() >> 11) * 0x1.0p-53); }
static u16 f2bf(float v) { return emu_f2bf(v); }
static float bf2f(u16 b) { return fa_bf2f(b); }

struct Case {
  int B, S, nh, nkv, D, causal;
};

static double rel_err(const std::vector<double> &ref, const float *got, size_t n, double *maxref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; i++) {
    double d = std::fabs(got[i] - ref[i]);
    if (!(d <= md)) md = d; /* NaN wins */
    mr = std::max(mr, std::fabs(ref[i]));
  }
  *maxref = mr;
  return md / (mr + 1e-30);
}

static int run_case(const Case &c, int index, unsigned seed) {
  const int B = c.B, S = c.S, nh = c.nh, nkv = c.nkv, D = c.D, group = nh / nkv;
  const i64 T = (i64)B * S, cq = (i64)nh * D, ck = (i64)nkv * D, W = cq + 2 * ck;
  const FwdVariant *fv = nth(fwd_variants, D, index);
  const BwdVariant *bv = nth(bwd_variants, D, index);
  if (!fv || !bv) {
    printf("FAIL no kernel for hd %d\n", D);
    return 1;
  }
  const gpu_flash_fwd_geom fg = gpu_flash_fwd_geometry(fv->hd, fv->warps, fv->bn, fv->minb);
  const gpu_flash_bwd_geom bg = gpu_flash_bwd_geometry(bv->hd, bv->warps, bv->bq, bv->minb);
  const int Sp = (S + GPU_FLASH_PAD - 1) / GPU_FLASH_PAD * GPU_FLASH_PAD;
  std::vector<u16> q(T * cq), k(T * ck), v(T * ck), dout(T * cq);
  auto fill = [](std::vector<u16> &x, float amp) {
    for (auto &e : x) e = f2bf(amp * (urand() + urand() + urand() - 1.5f));
  };
  fill(q, 2.0f);
  fill(k, 2.0f);
  fill(v, 1.0f);
  fill(dout, 1.0f);
  /* reference */
  const double scale = 1.0 / std::sqrt((double)D);
  std::vector<double> rout(T * cq), rlse((size_t)B * nh * S), rdq(T * cq, 0.0), rdk(T * ck, 0.0), rdv(T * ck, 0.0);
  std::vector<double> P(S);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++) {
      const int j = h / group;
      for (int i = 0; i < S; i++) {
        const i64 qi = ((i64)b * S + i) * cq + (i64)h * D;
        const int L = c.causal ? i + 1 : S;
        double mx = -1e300;
        for (int t = 0; t < L; t++) {
          const i64 kt = ((i64)b * S + t) * ck + (i64)j * D;
          double s = 0;
          for (int d = 0; d < D; d++) s += (double)bf2f(q[qi + d]) * bf2f(k[kt + d]);
          P[t] = s * scale;
          mx = std::max(mx, P[t]);
        }
        double sum = 0;
        for (int t = 0; t < L; t++) sum += (P[t] = std::exp(P[t] - mx));
        for (int t = 0; t < L; t++) P[t] /= sum;
        rlse[((size_t)b * nh + h) * S + i] = mx + std::log(sum);
        for (int d = 0; d < D; d++) {
          double o = 0;
          for (int t = 0; t < L; t++) o += P[t] * bf2f(v[((i64)b * S + t) * ck + (i64)j * D + d]);
          rout[qi + d] = o;
        }
        double Dd = 0;
        for (int d = 0; d < D; d++) Dd += (double)bf2f(dout[qi + d]) * rout[qi + d];
        for (int t = 0; t < L; t++) {
          const i64 kt = ((i64)b * S + t) * ck + (i64)j * D;
          double dp = 0;
          for (int d = 0; d < D; d++) dp += (double)bf2f(dout[qi + d]) * bf2f(v[kt + d]);
          const double ds = P[t] * (dp - Dd);
          for (int d = 0; d < D; d++) {
            rdq[qi + d] += scale * ds * bf2f(k[kt + d]);
            rdk[kt + d] += scale * ds * bf2f(q[qi + d]);
            rdv[((i64)b * S + t) * ck + (i64)j * D + d] += P[t] * bf2f(dout[qi + d]);
          }
        }
      }
    }
  /* forward */
  std::vector<u16> out(T * cq, 0x7fc0);
  std::vector<float> lse((size_t)B * nh * Sp, NAN);
  const float sl2 = (float)(scale / std::log(2.0));
  const unsigned nqt = (unsigned)((S + fg.bq - 1) / fg.bq), nkt = (unsigned)((S + bg.bn - 1) / bg.bn);
  const bf16 *pq = (const bf16 *)q.data(), *pk = (const bf16 *)k.data(), *pv = (const bf16 *)v.data();
  const bf16 *pd = (const bf16 *)dout.data();
  bf16 *po = (bf16 *)out.data();
  emu_launch({(unsigned)(nh * B), nqt, 1}, 32 * fg.warps, fg.smem,
             [&] { fv->fn(pq, pk, pv, po, lse.data(), S, Sp, nh, nkv, c.causal, sl2); }, seed);
  /* backward */
  std::vector<float> Dd((size_t)B * nh * Sp, NAN), dqa(T * cq, 0.0f);
  std::vector<u16> packed(T * W, 0x7fc0);
  const i64 rows = (i64)B * nh * Sp;
  emu_launch({(unsigned)((rows + 7) / 8), 1, 1}, 256, 0, [&] {
    if (D == 64) fa_bwd_pre_d64(po, pd, Dd.data(), lse.data(), S, Sp, nh, rows);
    else fa_bwd_pre_d128(po, pd, Dd.data(), lse.data(), S, Sp, nh, rows);
  }, seed + 1);
  bf16 *pp = (bf16 *)packed.data();
  emu_launch({(unsigned)(nkv * B), nkt, 1}, 32 * bg.warps, bg.smem, [&] {
    bv->fn(pq, pk, pv, pd, lse.data(), Dd.data(), dqa.data(), pp, S, Sp, nh, nkv, c.causal, (float)scale, sl2);
  }, seed + 2);
  emu_launch({(unsigned)((T * cq / 2 + 255) / 256), 1, 1}, 256, 0,
             [&] { fa_dq_out(dqa.data(), pp, T, (int)cq, W, (float)scale); }, seed + 3);
  /* compare */
  std::vector<float> gout(T * cq), glse((size_t)B * nh * S), gdq(T * cq), gdk(T * ck), gdv(T * ck);
  for (i64 i = 0; i < T * cq; i++) gout[i] = bf2f(out[i]);
  for (int bh = 0; bh < B * nh; bh++)
    for (int i = 0; i < S; i++) glse[(size_t)bh * S + i] = lse[(size_t)bh * Sp + i] * (float)std::log(2.0); /* kept in base 2 */
  for (i64 r = 0; r < T; r++) {
    for (i64 cc = 0; cc < cq; cc++) gdq[r * cq + cc] = bf2f(packed[r * W + cc]);
    for (i64 cc = 0; cc < ck; cc++) {
      gdk[r * ck + cc] = bf2f(packed[r * W + cq + cc]);
      gdv[r * ck + cc] = bf2f(packed[r * W + cq + ck + cc]);
    }
  }
  double m0, m2, m3, m4;
  const double eo = rel_err(rout, gout.data(), gout.size(), &m0);
  double el = 0;
  for (size_t i = 0; i < glse.size(); i++) {
    double d = std::fabs(glse[i] - rlse[i]);
    if (!(d <= el)) el = d;
  }
  const double eq = rel_err(rdq, gdq.data(), gdq.size(), &m2), ek = rel_err(rdk, gdk.data(), gdk.size(), &m3),
               ev = rel_err(rdv, gdv.data(), gdv.size(), &m4);
  const bool ok = eo <= 1e-2 && el <= 1e-3 && eq <= 2e-2 && ek <= 2e-2 && ev <= 2e-2;
  printf("%s B=%d S=%d nh=%d nkv=%d hd=%d causal=%d %s %s: out %.1e lse %.1e dq %.1e dk %.1e dv %.1e\n",
         ok ? "ok  " : "FAIL", B, S, nh, nkv, D, c.causal, fv->name, bv->name, eo, el, eq, ek, ev);
  return ok ? 0 : 1;
}

int main(int argc, char **argv) {
  emu_delay = argc > 1 ? atoi(argv[1]) : 0;
  unsigned seed = argc > 2 ? (unsigned)atoi(argv[2]) : 1;
  rng64.seed(seed);
  /* Each head dim's cases, in order, take its variants in turn (the k-th run the k-th
   * forward and the k-th backward kernel); there are at least as many runs as variants. */
  static const Case cases[] = {
      {2, 200, 4, 2, 64, 1}, {1, 77, 3, 3, 64, 0},   {1, 300, 2, 1, 64, 1},
      {1, 130, 2, 1, 128, 1}, {1, 64, 2, 2, 128, 0}, {1, 100, 2, 2, 128, 1},
  };
  const int n_cases = (int)(sizeof cases / sizeof cases[0]);
  int fails = 0, only = argc > 3 ? atoi(argv[3]) : -1;
  for (int hd = 64; hd <= 128; hd += 64) {
    int nf = 0, nb = 0, nc = 0;
    for (const FwdVariant &v : fwd_variants) nf += v.hd == hd;
    for (const BwdVariant &v : bwd_variants) nb += v.hd == hd;
    for (const Case &c : cases) nc += c.D == hd;
    const int runs = std::max(nc, std::max(nf, nb));
    for (int k = 0, i = 0; k < runs; i = (i + 1) % n_cases) {
      if (cases[i].D != hd) continue;
      if (only < 0 || only == i) fails += run_case(cases[i], k, seed + 17 * k + hd);
      k++;
    }
  }
  printf("fa_emu (cp.async %s): %d failures\n", emu_delay ? "delayed to wait_group" : "immediate", fails);
  return fails ? 1 : 0;
}
