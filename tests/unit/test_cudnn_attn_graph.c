/* test_cudnn_attn_graph.c -- the CPU side of runtime/gpu_cudnn_attn.c, with no cuDNN or GPU:
 *   - the 4-d views cuDNN is given address exactly the elements gpu_attention.h's row-major
 *     layouts put there (q, k, v, out, dout, stats, and dq | dk | dv inside packed);
 *   - the forward and backward operation graphs are consistent (unique UIDs, virtual tensors
 *     produced before use, matmul/broadcast/reduction shapes, every buffer bound) for MHA and
 *     GQA, causal and not, hd 64 and 128, and have the operation count of cudnn-frontend's
 *     composite SDPA nodes;
 *   - a bad shape is refused. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "gpu_cudnn_attn.h"

static int64_t at(const gpu_cudnn_view *v, int64_t b, int64_t h, int64_t s, int64_t d) {
  return v->offset + b * v->stride[0] + h * v->stride[1] + s * v->stride[2] + d * v->stride[3];
}

static void check_views(const gpu_cudnn_shape *sh) {
  gpu_cudnn_view v[GPU_CUDNN_NVIEWS];
  gpu_cudnn_attn_views(sh, v);
  const int64_t B = sh->B, S = sh->seq, nh = sh->nh, nkv = sh->nkv, hd = sh->hd, W = (nh + 2 * nkv) * hd;
  int bad = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s += S > 7 ? S / 7 : 1)
      for (int64_t h = 0; h < nh; h++)
        for (int64_t d = 0; d < hd; d += 5) {
          const int64_t row = b * S + s, kh = h % nkv;
          /* q, out, dout: (B*seq, nh*hd); k, v: (B*seq, nkv*hd); packed row dq | dk | dv */
          bad += at(&v[GPU_CUDNN_Q], b, h, s, d) != row * nh * hd + h * hd + d;
          bad += at(&v[GPU_CUDNN_O], b, h, s, d) != row * nh * hd + h * hd + d;
          bad += at(&v[GPU_CUDNN_DO], b, h, s, d) != row * nh * hd + h * hd + d;
          bad += at(&v[GPU_CUDNN_K], b, kh, s, d) != row * nkv * hd + kh * hd + d;
          bad += at(&v[GPU_CUDNN_V], b, kh, s, d) != row * nkv * hd + kh * hd + d;
          bad += at(&v[GPU_CUDNN_DQ], b, h, s, d) != row * W + h * hd + d;
          bad += at(&v[GPU_CUDNN_DK], b, kh, s, d) != row * W + nh * hd + kh * hd + d;
          bad += at(&v[GPU_CUDNN_DV], b, kh, s, d) != row * W + (nh + nkv) * hd + kh * hd + d;
          bad += at(&v[GPU_CUDNN_STATS], b, h, s, 0) != (b * nh + h) * S + s;
        }
  CHECK(bad == 0, "views B=%lld S=%lld nh=%lld nkv=%lld hd=%lld: %d elements misplaced", (long long)B, (long long)S,
        (long long)nh, (long long)nkv, (long long)hd, bad);
  /* dims: q-like (B, nh, S, hd), kv-like (B, nkv, S, hd), stats (B, nh, S, 1) */
  CHECK(v[GPU_CUDNN_Q].dim[1] == nh && v[GPU_CUDNN_K].dim[1] == nkv && v[GPU_CUDNN_DK].dim[1] == nkv &&
            v[GPU_CUDNN_STATS].dim[3] == 1 && v[GPU_CUDNN_DQ].dim[2] == S,
        "view dims");
  /* every byte offset of dk and dv is 16-byte aligned when packed is (bf16) */
  CHECK(v[GPU_CUDNN_DK].offset * 2 % 16 == 0 && v[GPU_CUDNN_DV].offset * 2 % 16 == 0, "packed views misaligned");
}

static void check_graphs(const gpu_cudnn_shape *sh) {
  char err[1024], dump[16384];
  for (int bwd = 0; bwd < 2; bwd++) {
    err[0] = 0;
    const int rc = gpu_cudnn_attn_graph_check(bwd, sh, 91400, err, sizeof err);
    CHECK(rc == 0, "%s graph B=%lld S=%lld nh=%lld nkv=%lld hd=%lld %s: %s", bwd ? "backward" : "forward",
          (long long)sh->B, (long long)sh->seq, (long long)sh->nh, (long long)sh->nkv, (long long)sh->hd,
          sh->causal ? "causal" : "full", err);
    const int nop = gpu_cudnn_attn_graph_dump(bwd, sh, 91400, dump, sizeof dump);
    /* forward: bmm1, scale, [4 mask ops], max, sub, exp, sum, log, add, div, bmm2
     * backward: 3 (softmax_sum) + 3 (S, scale, -stats) + [4 mask] + exp + reshape + matmul (+ group sum)
     *           + matmul + 3 (dS) + reshape + matmul (+ group sum) + reshape + matmul + identity */
    const int mask = sh->causal ? 4 : 0, gqa = sh->nh != sh->nkv;
    const int want = bwd ? 18 + mask + 2 * gqa : 10 + mask;
    CHECK(nop == want, "%s graph: %d operations, expected %d", bwd ? "backward" : "forward", nop, want);
    CHECK(strstr(dump, "Stats") && strstr(dump, "<- stats"), "stats not bound in the dump");
    if (bwd) CHECK(strstr(dump, "<- dq_accum") && strstr(dump, "<- softmax_sum"), "backward scratch not bound");
    if (sh->causal) CHECK(strstr(dump, "CMP_GE") && strstr(dump, "BINARY_SELECT"), "causal mask missing");
  }
}

int main(void) {
  static const gpu_cudnn_shape shapes[] = {
      {2, 200, 16, 8, 64, 1}, {2, 200, 6, 2, 128, 1}, {1, 8192, 16, 8, 64, 1}, {2, 64, 4, 4, 64, 1},
      {2, 100, 4, 4, 128, 0}, {1, 17, 8, 1, 64, 1},
  };
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    check_views(&shapes[i]);
    check_graphs(&shapes[i]);
  }
  char dump[16384];
  gpu_cudnn_attn_graph_dump(1, &shapes[0], 91400, dump, sizeof dump);
  printf("backward graph at B=2 seq 200 heads 16/8 hd 64 causal:\n%s", dump);
  /* heads not a multiple of kv_heads, and a head dim not a multiple of 8 */
  char err[512] = "";
  const gpu_cudnn_shape bad1 = {1, 64, 6, 4, 64, 1}, bad2 = {1, 64, 4, 4, 60, 1};
  CHECK(gpu_cudnn_attn_graph_check(0, &bad1, 91400, err, sizeof err) != 0 && strstr(err, "kv_heads"),
        "6 heads over 4 kv heads accepted: '%s'", err);
  CHECK(gpu_cudnn_attn_graph_check(1, &bad2, 91400, err, sizeof err) != 0, "head dim 60 accepted");
  printf("test_cudnn_attn_graph: %d failures\n", failures);
  return failures ? 1 : 0;
}
