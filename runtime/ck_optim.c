/* ck_optim.c -- CPU reference of the optimizer: AdamW on fp32 master weights, the learning-
 * rate schedule, and global gradient-norm clipping.
 *
 * ck_adamw_step mirrors torch.optim.AdamW's single-tensor path operation by operation
 * (scalars formed in double as Python does, then applied in fp32):
 *   p.mul_(1 - lr*wd); m.lerp_(g, 1 - b1); v.mul_(b2).addcmul_(g, g, value=1 - b2);
 *   denom = (v.sqrt() / sqrt(1 - b2^t)).add_(eps); p.addcdiv_(m, denom, value=-lr/(1 - b1^t)).
 * torch's vectorized CPU kernels fuse two of these into multiply-adds, and so do we (fmaf):
 * lerp is fma(w, g - m, m) (fma(w - 1, g - m, g) when w >= 0.5) and addcmul is
 * fma(value * g, g, v). With that, weights and both moments come out bit-identical to torch
 * 2.11 on CPU (test_ck_parity checks it).
 */
#include <math.h>

#include "cpu_kernels.h"

void ck_adamw_step(float *p, const float *g, float *m, float *v, int64_t n, int64_t step,
                   float grad_scale, double lr, double beta1, double beta2, double eps,
                   double wd) {
  const float decay = (float)(1.0 - lr * wd);
  const float w1 = (float)(1.0 - beta1), b2 = (float)beta2, c2 = (float)(1.0 - beta2);
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const float neg_step = (float)(-(lr / bc1)), bc2_sqrt = (float)sqrt(bc2), epsf = (float)eps;
  const int small = fabsf(w1) < 0.5f; /* torch's lerp picks its formula by the weight */
  for (int64_t i = 0; i < n; i++) {
    float gi = g[i] * grad_scale;
    float pi = wd != 0.0 ? p[i] * decay : p[i];
    float mi = small ? fmaf(w1, gi - m[i], m[i]) : fmaf(w1 - 1.0f, gi - m[i], gi);
    float vi = fmaf(c2 * gi, gi, v[i] * b2);
    float denom = sqrtf(vi) / bc2_sqrt + epsf;
    p[i] = pi + neg_step * mi / denom;
    m[i] = mi;
    v[i] = vi;
  }
}

double ck_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                moec_schedule schedule) {
  if (warmup > 0 && step <= warmup) return lr * (double)step / (double)warmup;
  if (schedule == SCHED_CONSTANT) return lr;
  double progress = steps > warmup ? (double)(step - warmup) / (double)(steps - warmup) : 1.0;
  if (progress > 1.0) progress = 1.0;
  if (progress < 0.0) progress = 0.0;
  if (schedule == SCHED_LINEAR) return lr - (lr - min_lr) * progress;
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * progress)); /* SCHED_COSINE */
}

double ck_grad_norm(const float *const *bufs, const int64_t *sizes, int n_bufs) {
  double ss = 0.0;
  for (int b = 0; b < n_bufs; b++)
    for (int64_t i = 0; i < sizes[b]; i++) ss += (double)bufs[b][i] * bufs[b][i];
  return sqrt(ss);
}

/* torch: clip_coef = max_norm / (total_norm + 1e-6) with total_norm an fp32 tensor, then
 * clamp(max=1); a NaN norm gives a NaN factor, as there. */
float ck_clip_coef(double norm, double clip) {
  float c = (float)clip / ((float)norm + 1e-6f);
  return isnan(c) || c < 1.0f ? c : 1.0f;
}
