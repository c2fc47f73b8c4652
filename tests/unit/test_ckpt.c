/* test_ckpt.c -- checkpoint directories: config.json content, save/load round trip, keep-K,
 * validation errors, read-only and full-disk failures, stale temporaries, and the crash-safety
 * property (SIGKILL a saving child at random moments; latest must always load and match). */
#include "runtime/ckpt.h"
#include "runtime/ckpt_int.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failures;
#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                     \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)
#define CHECK_ERR(err, sub)                                                                        \
  do {                                                                                             \
    if (!strstr((err), (sub))) {                                                                   \
      fprintf(stderr, "%s:%d: error message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (err),   \
              (sub));                                                                              \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

static char root[256];

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 12345;
static uint64_t rng(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static moec_config tiny_config(void) {
  moec_config c;
  memset(&c, 0, sizeof c);
  c.vocab = 256, c.hidden = 128, c.layers = 2, c.seq = 256, c.heads = 4, c.kv_heads = 4;
  c.experts = 4, c.top_k = 2, c.ffn = 256;
  c.norm_eps = 1e-5, c.rope_theta = 5e5, c.aux_loss = 1e-3, c.z_loss = 1e-3;
  c.seed = 1234;
  return c;
}

/* ---------------------------------------------------------------- a model's parameters */

typedef struct {
  ckpt_param p[8];
  size_t n;
  float *mem;
} model;

static int64_t numel(const ckpt_param *p) {
  int64_t n = 1;
  for (int i = 0; i < p->ndim; i++) n *= p->shape[i];
  return n;
}

/* scale 1 gives ~64k floats per tensor; the crash test uses a larger scale */
static void model_init(model *m, int scale) {
  static const char *names[] = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.block_sparse_moe.gate.weight",
      "model.layers.0.block_sparse_moe.experts.0.w1.weight",
      "model.layers.0.block_sparse_moe.experts.0.w2.weight",
      "model.norm.weight",
      "lm_head.weight",
      "frozen.scalar",
  };
  int64_t shapes[8][2] = {{256, 128 * scale}, {128 * scale, 128 * scale}, {4, 128 * scale},
                          {256, 128 * scale}, {128 * scale, 256},         {128 * scale, 0},
                          {256, 128 * scale}, {0, 0}};
  int ndims[8] = {2, 2, 2, 2, 2, 1, 2, 0};
  size_t total = 0;
  memset(m, 0, sizeof *m);
  m->n = 8;
  for (size_t i = 0; i < m->n; i++) {
    m->p[i].name = names[i];
    m->p[i].ndim = ndims[i];
    m->p[i].shape[0] = shapes[i][0];
    m->p[i].shape[1] = shapes[i][1];
    total += (size_t)numel(&m->p[i]) * (i == 7 ? 1 : 3);
  }
  m->mem = malloc(total * sizeof(float));
  float *at = m->mem;
  for (size_t i = 0; i < m->n; i++) {
    size_t k = (size_t)numel(&m->p[i]);
    m->p[i].w = at, at += k;
    if (i != 7) { /* the last one has no optimizer state */
      m->p[i].m = at, at += k;
      m->p[i].v = at, at += k;
    }
  }
}

static float val(int64_t step, size_t param, int which, size_t i) {
  return (float)(step * 7 + (int64_t)param * 3 + which) + (float)(i % 1021) * 0.25f;
}

static void model_fill(model *m, int64_t step) {
  for (size_t p = 0; p < m->n; p++)
    for (size_t i = 0; i < (size_t)numel(&m->p[p]); i++) {
      m->p[p].w[i] = val(step, p, 0, i);
      if (m->p[p].m) m->p[p].m[i] = val(step, p, 1, i), m->p[p].v[i] = val(step, p, 2, i);
    }
}

/* number of mismatching elements against model_fill(step) */
static long model_diff(const model *m, int64_t step) {
  long bad = 0;
  for (size_t p = 0; p < m->n; p++)
    for (size_t i = 0; i < (size_t)numel(&m->p[p]); i++) {
      bad += m->p[p].w[i] != val(step, p, 0, i);
      if (m->p[p].m) bad += m->p[p].m[i] != val(step, p, 1, i) || m->p[p].v[i] != val(step, p, 2, i);
    }
  return bad;
}

static ckpt_contents contents(const model *m, const moec_config *cfg, const ckpt_kv *kv, size_t nkv) {
  ckpt_contents c = {.config = cfg, .bos_id = 2, .eos_id = 3, .pad_id = 1, .params = m->p,
                     .n_params = m->n, .state = kv, .n_state = nkv};
  return c;
}

static int count_prefix(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d)))
    if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
  if (d) closedir(d);
  return n;
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  static char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  buf[n] = 0;
  fclose(fp);
  return buf;
}

/* ---------------------------------------------------------------- config.json */

static void test_config_json(void) {
  moec_config c = tiny_config();
  char *js = NULL, err[512];
  CHECK(ckpt_hf_config_json(&c, 2, 3, 1, &js, err, sizeof err) == 0);
  static const char want[] =
      "{\n"
      "  \"architectures\": [\"MixtralForCausalLM\"],\n"
      "  \"attention_dropout\": 0.0,\n"
      "  \"bos_token_id\": 2,\n"
      "  \"eos_token_id\": 3,\n"
      "  \"head_dim\": 32,\n"
      "  \"hidden_act\": \"silu\",\n"
      "  \"hidden_size\": 128,\n"
      "  \"initializer_range\": 0.02,\n"
      "  \"intermediate_size\": 256,\n"
      "  \"max_position_embeddings\": 256,\n"
      "  \"model_type\": \"mixtral\",\n"
      "  \"num_attention_heads\": 4,\n"
      "  \"num_experts_per_tok\": 2,\n"
      "  \"num_hidden_layers\": 2,\n"
      "  \"num_key_value_heads\": 4,\n"
      "  \"num_local_experts\": 4,\n"
      "  \"output_router_logits\": false,\n"
      "  \"pad_token_id\": 1,\n"
      "  \"rms_norm_eps\": 1.0000000000000001e-05,\n"
      "  \"rope_theta\": 500000.0,\n"
      "  \"router_aux_loss_coef\": 0.001,\n"
      "  \"router_jitter_noise\": 0.0,\n"
      "  \"sliding_window\": null,\n"
      "  \"tie_word_embeddings\": false,\n"
      "  \"torch_dtype\": \"float32\",\n"
      "  \"use_cache\": true,\n"
      "  \"vocab_size\": 256\n"
      "}\n";
  CHECK(js && !strcmp(js, want));
  if (js && strcmp(js, want)) fprintf(stderr, "config.json was:\n%s", js);
  /* it parses, and the floats come back bit for bit */
  st_json *j = js ? st_json_parse(js, strlen(js), err, sizeof err) : NULL;
  CHECK(j != NULL);
  if (j) {
    CHECK(st_json_get(j, "rms_norm_eps")->d == 1e-5);
    CHECK(st_json_get(j, "rope_theta")->d == 5e5);
    CHECK(st_json_get(j, "router_aux_loss_coef")->d == 1e-3);
    st_json_free(j);
  }
  free(js);
  /* genos-like: GQA, explicit head_dim, odd floats; token ids may be null */
  c.hidden = 1024, c.heads = 16, c.kv_heads = 8, c.head_dim = 64, c.rope_theta = 5e7;
  c.norm_eps = 1.0 / 3.0, c.aux_loss = 0.0;
  CHECK(ckpt_hf_config_json(&c, -1, 0, -1, &js, err, sizeof err) == 0);
  CHECK(js && strstr(js, "\"bos_token_id\": null,") && strstr(js, "\"eos_token_id\": 0,"));
  CHECK(js && strstr(js, "\"num_key_value_heads\": 8,") && strstr(js, "\"head_dim\": 64,"));
  CHECK(js && strstr(js, "\"rms_norm_eps\": 0.33333333333333331,"));
  CHECK(js && strstr(js, "\"rope_theta\": 50000000.0,") && strstr(js, "\"router_aux_loss_coef\": 0.0,"));
  j = js ? st_json_parse(js, strlen(js), err, sizeof err) : NULL;
  CHECK(j && st_json_get(j, "rms_norm_eps")->d == 1.0 / 3.0);
  st_json_free(j);
  free(js);
  /* errors */
  c = tiny_config();
  c.hidden = 0;
  CHECK(ckpt_hf_config_json(&c, 1, 2, 3, &js, err, sizeof err) == -1 && js == NULL);
  CHECK_ERR(err, "model size 'hidden' is 0");
  c = tiny_config();
  c.kv_heads = 3;
  CHECK(ckpt_hf_config_json(&c, 1, 2, 3, &js, err, sizeof err) == -1);
  CHECK_ERR(err, "inconsistent sizes");
  c = tiny_config();
  c.norm_eps = NAN;
  CHECK(ckpt_hf_config_json(&c, 1, 2, 3, &js, err, sizeof err) == -1);
  CHECK_ERR(err, "must be finite");
}

/* ---------------------------------------------------------------- round trip, layout, keep */

static void test_roundtrip(void) {
  char dir[512], err[1024], path[600];
  snprintf(dir, sizeof dir, "%s/run1/ckpt", root); /* parents created */
  moec_config cfg = tiny_config();
  model m, back;
  model_init(&m, 1);
  model_init(&back, 1);
  ckpt_kv kv[] = {{.key = "data_pos", .kind = CKPT_INT, .i = 0},
                  {.key = "loss", .kind = CKPT_F64, .d = 1.25},
                  {.key = "data", .kind = CKPT_STR, .s = "chr20.fa.gz \"x\""}};
  ckpt_contents c = contents(&m, &cfg, kv, 3);
  int64_t s;
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 0);
  CHECK(ckpt_latest_err(dir, path, sizeof path, &s, err, sizeof err) == 0);
  CHECK_ERR(err, "no such checkpoint directory");
  for (int64_t step = 1; step <= 5; step++) {
    model_fill(&m, step);
    kv[0].i = step * 100;
    CHECK(ckpt_save(dir, step, &c, err, sizeof err) == 0);
    if (err[0]) fprintf(stderr, "save: %s\n", err);
  }
  /* layout */
  char f[700];
  snprintf(f, sizeof f, "%s/latest", dir);
  CHECK(!strcmp(slurp(f) ? slurp(f) : "", "step-00000005\n"));
  CHECK(count_prefix(dir, "step-") == 2 && count_prefix(dir, ".") == 2); /* . and .. only */
  static const char *files[] = {"model.safetensors", "optimizer.safetensors", "config.json",
                                "state.json"};
  for (int i = 0; i < 4; i++) {
    snprintf(f, sizeof f, "%s/step-00000005/%s", dir, files[i]);
    CHECK(access(f, R_OK) == 0);
  }
  snprintf(f, sizeof f, "%s/step-00000004", dir);
  CHECK(access(f, F_OK) == 0);
  snprintf(f, sizeof f, "%s/step-00000003", dir);
  CHECK(access(f, F_OK) != 0);
  /* model.safetensors: HF names, f32, format pt; optimizer names */
  snprintf(f, sizeof f, "%s/step-00000005/model.safetensors", dir);
  st_file *sf = st_open(f, err, sizeof err);
  CHECK(sf && st_count(sf) == 8 && !strcmp(st_meta(sf, "format"), "pt"));
  const st_view *v = sf ? st_find(sf, "lm_head.weight") : NULL;
  CHECK(v && v->dtype == ST_F32 && v->shape[0] == 256 && v->shape[1] == 128);
  st_close(sf);
  snprintf(f, sizeof f, "%s/step-00000005/optimizer.safetensors", dir);
  sf = st_open(f, err, sizeof err);
  CHECK(sf && st_count(sf) == 14 && st_find(sf, "model.norm.weight.exp_avg_sq") &&
        st_find(sf, "model.norm.weight.exp_avg") && !st_find(sf, "frozen.scalar.exp_avg"));
  st_close(sf);
  snprintf(f, sizeof f, "%s/step-00000005/state.json", dir);
  char *stj = slurp(f);
  CHECK(stj && strstr(stj, "\"step\": 5,") && strstr(stj, "\"seed\": 1234,") &&
        strstr(stj, "\"moec_version\": \"") && strstr(stj, "\"data_pos\": 500"));

  /* load */
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 1 && s == 5);
  CHECK(strstr(path, "/run1/ckpt/step-00000005") != NULL);
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);
  ckpt_state st;
  CHECK(ckpt_load(path, &lc, &st, err, sizeof err) == 0);
  if (err[0] && failures) fprintf(stderr, "load: %s\n", err);
  CHECK(model_diff(&back, 5) == 0);
  int64_t dp;
  double loss;
  CHECK(st.step == 5 && st.seed == 1234 && !strcmp(st.moec_version, MOEC_VERSION));
  CHECK(ckpt_state_i64(&st, "data_pos", &dp) == 0 && dp == 500);
  CHECK(ckpt_state_f64(&st, "loss", &loss) == 0 && loss == 1.25);
  CHECK(ckpt_state_str(&st, "data") && !strcmp(ckpt_state_str(&st, "data"), "chr20.fa.gz \"x\""));
  CHECK(ckpt_state_i64(&st, "loss", &dp) == -1 && ckpt_state_str(&st, "nope") == NULL);
  ckpt_state_free(&st);
  /* the older one loads too */
  snprintf(f, sizeof f, "%s/step-00000004", dir);
  CHECK(ckpt_load(f, &lc, NULL, err, sizeof err) == 0 && model_diff(&back, 4) == 0);

  /* re-saving an existing step replaces it atomically */
  model_fill(&m, 77);
  CHECK(ckpt_save(dir, 5, &c, err, sizeof err) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0 && model_diff(&back, 77) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 0 && count_prefix(dir, "step-") == 2);

  /* keep = 3 */
  c.keep = 3;
  for (int64_t step = 6; step <= 9; step++) {
    model_fill(&m, step);
    CHECK(ckpt_save(dir, step, &c, err, sizeof err) == 0);
  }
  CHECK(count_prefix(dir, "step-0000000") == 3);
  snprintf(f, sizeof f, "%s/step-00000007", dir);
  CHECK(access(f, F_OK) == 0);
  /* steps >= 1e8 keep working (more digits) */
  c.keep = 1;
  CHECK(ckpt_save(dir, 123456789012LL, &c, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 1 && s == 123456789012LL);
  CHECK(count_prefix(dir, "step-") == 1);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0 && model_diff(&back, 9) == 0);
  free(m.mem);
  free(back.mem);
}

/* ---------------------------------------------------------------- load validation */

static void test_load_errors(void) {
  char dir[512], err[1024], path[600], f[700], cmd[4096];
  snprintf(dir, sizeof dir, "%s/val", root);
  moec_config cfg = tiny_config();
  model m, back;
  model_init(&m, 1);
  model_init(&back, 1);
  model_fill(&m, 3);
  ckpt_contents c = contents(&m, &cfg, NULL, 0);
  CHECK(ckpt_save(dir, 3, &c, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1);
  model_fill(&back, 999); /* sentinel: must survive every failed load */

  /* wrong shape */
  back.p[1].shape[0] = 64;
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' has shape "
                 "[128, 128] but the model expects [64, 128]");
  back.p[1].shape[0] = 128;
  /* a parameter the checkpoint lacks; one it has that the model lacks */
  back.p[5].name = "model.norm.bias";
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "model.safetensors: no tensor 'model.norm.bias'");
  CHECK_ERR(err, "different model");
  back.p[5].name = "model.norm.weight";
  lc.n_params = 7; /* drop frozen.scalar */
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "model.safetensors: unexpected tensor 'frozen.scalar'");
  lc.n_params = 8;
  /* optimizer state expected where the checkpoint has none */
  float mm, vv;
  back.p[7].m = &mm, back.p[7].v = &vv;
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "optimizer.safetensors: no tensor 'frozen.scalar.exp_avg'");
  back.p[7].m = back.p[7].v = NULL;
  /* the optimizer has moments the model does not optimise */
  float *m0 = back.p[0].m, *v0 = back.p[0].v;
  back.p[0].m = back.p[0].v = NULL;
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "optimizer.safetensors: unexpected tensor 'model.embed_tokens.weight.exp_avg");
  back.p[0].m = m0, back.p[0].v = v0;
  /* config.json disagrees with the model */
  moec_config other = cfg;
  other.experts = 8;
  lc.config = &other;
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "config.json: num_local_experts is 4 but the model has experts = 8");
  lc.config = &cfg;
  CHECK(model_diff(&back, 999) == 0); /* nothing was written */
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0 && model_diff(&back, 3) == 0);

  /* a copy under another step name: files from different checkpoints */
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/step-00000009'", path, dir);
  CHECK(system(cmd) == 0);
  snprintf(f, sizeof f, "%s/step-00000009", dir);
  CHECK(ckpt_load(f, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "state.json: step is 3 but the directory is step-00000009");
  /* a missing file */
  snprintf(f, sizeof f, "%s/step-00000009/state.json", dir);
  unlink(f);
  snprintf(f, sizeof f, "%s/step-00000009", dir);
  CHECK(ckpt_load(f, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "step-00000009: missing state.json");
  /* a truncated model file */
  snprintf(f, sizeof f, "%s/step-00000009/model.safetensors", dir);
  CHECK(truncate(f, 5000) == 0);
  snprintf(cmd, sizeof cmd, "cp '%s/state.json' '%s/step-00000009/'", path, dir);
  CHECK(system(cmd) == 0);
  snprintf(f, sizeof f, "%s/step-00000009", dir);
  CHECK(ckpt_load(f, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "step-00000009/model.safetensors: tensor '");
  CHECK_ERR(err, "run past the end of the data");
  /* corrupt state.json */
  snprintf(f, sizeof f, "%s/state.json", path);
  snprintf(cmd, sizeof cmd, "cp '%s' '%s.bak' && printf '{\"step\": 3,' > '%s'", f, f, f);
  CHECK(system(cmd) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "state.json: corrupt JSON: byte 11: unexpected end of JSON");
  snprintf(cmd, sizeof cmd, "mv '%s.bak' '%s'", f, f);
  CHECK(system(cmd) == 0);
  /* not a directory */
  CHECK(ckpt_load("/nonexistent/step-1", &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "/nonexistent/step-1: no such directory");

  /* malformed / dangling latest */
  snprintf(f, sizeof f, "%s/latest", dir);
  snprintf(cmd, sizeof cmd, "printf 'step-000' > '%s.x' && printf 'step-00000042\\n' > '%s.y'", f, f);
  CHECK(system(cmd) == 0);
  snprintf(cmd, sizeof cmd, "%s.x", f);
  CHECK(rename(cmd, f) == 0);
  int64_t s = -5;
  CHECK(ckpt_latest_err(dir, path, sizeof path, &s, err, sizeof err) == -1 && s == -5);
  CHECK_ERR(err, "latest: malformed (expected one line 'step-NNNNNNNN')");
  snprintf(cmd, sizeof cmd, "%s.y", f);
  CHECK(rename(cmd, f) == 0);
  CHECK(ckpt_latest_err(dir, path, sizeof path, &s, err, sizeof err) == -1);
  CHECK_ERR(err, "latest names");
  CHECK_ERR(err, "step-00000042, which does not exist");
  FILE *fp = fopen(f, "w");
  fputs("step-12 junk\n", fp);
  fclose(fp);
  CHECK(ckpt_latest_err(dir, path, sizeof path, &s, err, sizeof err) == -1);
  CHECK_ERR(err, "latest: malformed");
  /* a later save repairs it */
  CHECK(ckpt_save(dir, 4, &c, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 1 && s == 4);
  free(m.mem);
  free(back.mem);
}

/* ---------------------------------------------------------------- save failures */

static void test_save_errors(void) {
  char dir[512], err[1024], path[600], f[700];
  moec_config cfg = tiny_config();
  model m, back;
  model_init(&m, 1);
  model_init(&back, 1);
  ckpt_contents c = contents(&m, &cfg, NULL, 0);

  /* a path under a regular file */
  snprintf(f, sizeof f, "%s/afile", root);
  FILE *fp = fopen(f, "w");
  fclose(fp);
  snprintf(dir, sizeof dir, "%s/afile/ckpt", root);
  CHECK(ckpt_save(dir, 1, &c, err, sizeof err) == -1);
  CHECK_ERR(err, "cannot create checkpoint directory");
  CHECK_ERR(err, "afile/ckpt: ");
  CHECK_ERR(err, "afile exists and is not a directory");
  CHECK(ckpt_save(f, 1, &c, err, sizeof err) == -1);
  CHECK_ERR(err, "exists and is not a directory");

  /* bad contents */
  snprintf(dir, sizeof dir, "%s/errs", root);
  ckpt_kv kv = {.key = "step", .kind = CKPT_INT};
  ckpt_contents bc = contents(&m, &cfg, &kv, 1);
  CHECK(ckpt_save(dir, 1, &bc, err, sizeof err) == -1);
  CHECK_ERR(err, "reserved");
  model dup;
  model_init(&dup, 1);
  dup.p[1].name = dup.p[0].name;
  bc = contents(&dup, &cfg, NULL, 0);
  CHECK(ckpt_save(dir, 1, &bc, err, sizeof err) == -1);
  CHECK_ERR(err, "appears twice");
  free(dup.mem);
  moec_config bad = cfg;
  bad.heads = 0;
  bc = contents(&m, &bad, NULL, 0);
  CHECK(ckpt_save(dir, 1, &bc, err, sizeof err) == -1);
  CHECK_ERR(err, "checkpoint step 1 not saved (writing config.json)");
  CHECK(count_prefix(dir, ".tmp-") == 0 && count_prefix(dir, "step-") == 0);

  /* a good checkpoint, then failures that must leave it in place */
  model_fill(&m, 1);
  CHECK(ckpt_save(dir, 1, &c, err, sizeof err) == 0);

  /* full disk, simulated with RLIMIT_FSIZE (writes past the limit fail with EFBIG) */
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit rl = {100000, 100000};
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &rl);
    model_fill(&m, 2);
    int rc = ckpt_save(dir, 2, &c, err, sizeof err);
    int ok = rc == -1 && strstr(err, "checkpoint step 2 not saved (writing model.safetensors)") &&
             strstr(err, "write failed: File too large") &&
             strstr(err, "the previous checkpoint") && strstr(err, "step-00000001 is intact");
    if (!ok) fprintf(stderr, "full disk: rc %d, %s\n", rc, err);
    _exit(ok ? 0 : 1);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  int64_t s;
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 1 && s == 1);
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0 && model_diff(&back, 1) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 0 && count_prefix(dir, "step-") == 1);

  /* read-only directory (as root, permissions only bind after dropping to nobody) */
  CHECK(chmod(root, 0755) == 0 && chmod(dir, 0555) == 0);
  fflush(NULL);
  pid = fork();
  if (pid == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(2);
    model_fill(&m, 2);
    int rc = ckpt_save(dir, 2, &c, err, sizeof err);
    int ok = rc == -1 && strstr(err, "checkpoint step 2 not saved: cannot create") &&
             strstr(err, "Permission denied") && strstr(err, "make the checkpoint directory "
                                                            "writable") &&
             strstr(err, "is intact");
    if (!ok) fprintf(stderr, "read-only: rc %d, %s\n", rc, err);
    /* and reading still works */
    int64_t s2;
    char p2[600];
    ok = ok && ckpt_latest(dir, p2, sizeof p2, &s2) == 1 && s2 == 1;
    _exit(ok ? 0 : 1);
  }
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(chmod(dir, 0755) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, &s) == 1 && s == 1);
  free(m.mem);
  free(back.mem);
}

/* ---------------------------------------------------------------- stale temporaries */

static void test_stale(void) {
  char dir[512], err[1024], f[700];
  snprintf(dir, sizeof dir, "%s/stale", root);
  moec_config cfg = tiny_config();
  model m;
  model_init(&m, 1);
  model_fill(&m, 1);
  ckpt_contents c = contents(&m, &cfg, NULL, 0);
  CHECK(ckpt_save(dir, 1, &c, err, sizeof err) == 0);
  /* a dead writer's leftovers: reap a child to get a pid that is gone */
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  snprintf(f, sizeof f, "%s/.tmp-step-00000002-%ld", dir, (long)dead);
  CHECK(mkdir(f, 0777) == 0);
  snprintf(f, sizeof f, "%s/.tmp-step-00000002-%ld/model.safetensors", dir, (long)dead);
  FILE *fp = fopen(f, "w");
  fputs("partial", fp);
  fclose(fp);
  snprintf(f, sizeof f, "%s/.latest.tmp-%ld-0", dir, (long)dead);
  fp = fopen(f, "w");
  fclose(fp);
  /* a live writer's (pid 1 exists) stays */
  snprintf(f, sizeof f, "%s/.tmp-step-00000003-1", dir);
  CHECK(mkdir(f, 0777) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 2 && count_prefix(dir, ".latest.tmp-") == 1);
  CHECK(ckpt_save(dir, 2, &c, err, sizeof err) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 1 && count_prefix(dir, ".latest.tmp-") == 0);
  CHECK(access(f, F_OK) == 0);
  rmdir(f);
  free(m.mem);
}

/* ---------------------------------------------------------------- crash safety */

static void crash_child(const char *dir, int scale) {
  moec_config cfg = tiny_config();
  model m;
  model_init(&m, scale);
  char path[600], err[1024];
  int64_t s;
  int r = ckpt_latest(dir, path, sizeof path, &s);
  if (r < 0) _exit(4);
  ckpt_kv kv = {.key = "data_pos", .kind = CKPT_INT};
  ckpt_contents c = contents(&m, &cfg, &kv, 1);
  for (int64_t step = r == 1 ? s + 1 : 1;; step++) {
    model_fill(&m, step);
    kv.i = step * 100;
    if (ckpt_save(dir, step, &c, err, sizeof err) != 0) {
      fprintf(stderr, "child: %s\n", err);
      _exit(3);
    }
  }
}

static void test_crash(void) {
  char dir[512], err[1024], path[600];
  snprintf(dir, sizeof dir, "%s/crash", root);
  const int scale = 4; /* ~1.1M parameters: 4.5 MB of weights + 8.5 MB of moments per save */
  moec_config cfg = tiny_config();
  model back;
  model_init(&back, scale);
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);

  /* how long a child takes from fork to its first complete save, to spread the kills */
  char probe[600];
  snprintf(probe, sizeof probe, "%s/probe", root);
  fflush(NULL);
  double t0 = now_s();
  pid_t pp = fork();
  if (pp == 0) {
    model pm;
    model_init(&pm, scale);
    model_fill(&pm, 1);
    ckpt_contents pc = contents(&pm, &cfg, NULL, 0);
    _exit(ckpt_save(probe, 1, &pc, err, sizeof err) == 0 ? 0 : 1);
  }
  int pst;
  CHECK(waitpid(pp, &pst, 0) == pp && WIFEXITED(pst) && WEXITSTATUS(pst) == 0);
  double t_save = now_s() - t0;
  if (t_save < 1e-3) t_save = 1e-3;
  if (t_save > 0.3) t_save = 0.3;
  int phases[5] = {0}; /* what the killed writer left behind */

  int kills = 0, found = 0, progressed = 0;
  int64_t last = 0;
  double t_start = now_s();
  for (int round = 0; round < 40 && (kills < 24 || now_s() - t_start < 2.0); round++) {
    if (now_s() - t_start > 10.0 && kills >= 20) break;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) crash_child(dir, scale);
    /* delay: mostly within a few saves; some very early (startup, first files); every
     * fifth long enough that the run surely advances */
    double d = round % 5 == 4 ? 4.0 * t_save
               : rng() % 4 == 0 ? (double)(rng() % 2000) * 1e-6
                                : (double)(rng() % 1000) / 1000.0 * 3.0 * t_save;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) {
      fprintf(stderr, "crash child ended otherwise: status 0x%x\n", status);
      failures++;
      break;
    }
    kills++;
    phases[count_prefix(dir, ".tmp-step-")   ? 0
           : count_prefix(dir, ".latest.tmp-") ? 1
           : count_prefix(dir, ".tmp-del-")    ? 2
           : count_prefix(dir, "step-") > 2    ? 3
                                               : 4]++;
    int64_t s = -1;
    int r = ckpt_latest_err(dir, path, sizeof path, &s, err, sizeof err);
    if (r < 0 || (r == 0 && found)) {
      fprintf(stderr, "after kill %d: latest: %d %s\n", kills, r, err);
      failures++;
      break;
    }
    if (r == 0) continue;
    found = 1;
    if (s < last) {
      fprintf(stderr, "latest went back from %lld to %lld\n", (long long)last, (long long)s);
      failures++;
    }
    progressed += s > last;
    last = s;
    model_fill(&back, -1);
    ckpt_state st;
    if (ckpt_load(path, &lc, &st, err, sizeof err) != 0) {
      fprintf(stderr, "after kill %d: %s\n", kills, err);
      failures++;
      break;
    }
    int64_t dp = -1;
    CHECK(st.step == s && ckpt_state_i64(&st, "data_pos", &dp) == 0 && dp == s * 100);
    ckpt_state_free(&st);
    long bad = model_diff(&back, s);
    if (bad) {
      fprintf(stderr, "after kill %d: step %lld loaded with %ld wrong values\n", kills,
              (long long)s, bad);
      failures++;
    }
  }
  CHECK(kills >= 20);
  CHECK(found && progressed >= 3);
  printf("crash test: %d kills, latest reached step %lld (%d advances), fork-to-first-save "
         "%.1f ms; killed while writing files %d, writing latest %d, deleting old %d, before "
         "pruning %d, elsewhere %d\n", kills, (long long)last, progressed, t_save * 1e3,
         phases[0], phases[1], phases[2], phases[3], phases[4]);
  /* one clean save clears every leftover of the killed writers */
  model_fill(&back, last + 1);
  CHECK(ckpt_save(dir, last + 1, &lc, err, sizeof err) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 0 && count_prefix(dir, ".latest.tmp-") == 0);
  CHECK(count_prefix(dir, "step-") == 2);
  free(back.mem);
}

/* ---------------------------------------------------------------- fetched tensors */

/* ckpt_param.fetch over a model's own arrays; fails for `fail_on` (a name) when set. */
static const char *fail_on;
static int fetch_from(void *ctx, int which, float *dst, char *err, size_t errlen) {
  const ckpt_param *p = ctx;
  if (fail_on && !strcmp(p->name, fail_on)) {
    snprintf(err, errlen, "the device said no");
    return -1;
  }
  memcpy(dst, which == 0 ? p->w : which == 1 ? p->m : p->v, (size_t)numel(p) * sizeof *dst);
  return 0;
}

/* A save whose tensors are fetched one at a time writes the same bytes as one from pointers; a
 * fetch that fails fails the save, leaving the last checkpoint named. */
static void test_fetch(void) {
  char a[300], b[300], err[1024], cmd[4096];
  snprintf(a, sizeof a, "%s/ptr", root);
  snprintf(b, sizeof b, "%s/fetch", root);
  moec_config cfg = tiny_config();
  model m;
  model_init(&m, 1);
  model_fill(&m, 6);
  ckpt_contents c = contents(&m, &cfg, NULL, 0);
  CHECK(ckpt_save(a, 6, &c, err, sizeof err) == 0);
  ckpt_param f[8];
  for (size_t i = 0; i < m.n; i++) {
    f[i] = m.p[i];
    f[i].fetch = fetch_from, f[i].fetch_ctx = &m.p[i], f[i].has_moments = m.p[i].m != NULL;
    f[i].w = f[i].m = f[i].v = NULL;
  }
  ckpt_contents fc = c;
  fc.params = f;
  CHECK(ckpt_save(b, 6, &fc, err, sizeof err) == 0);
  snprintf(cmd, sizeof cmd, "cmp -s %s/step-00000006/model.safetensors %s/step-00000006/model.safetensors && "
           "cmp -s %s/step-00000006/optimizer.safetensors %s/step-00000006/optimizer.safetensors", a, b, a, b);
  CHECK(system(cmd) == 0);
  fail_on = "model.layers.0.block_sparse_moe.experts.0.w2.weight";
  CHECK(ckpt_save(b, 7, &fc, err, sizeof err) == -1);
  CHECK_ERR(err, "tensor 'model.layers.0.block_sparse_moe.experts.0.w2.weight': the device said no");
  fail_on = NULL;
  CHECK(ckpt_latest(b, cmd, sizeof cmd, NULL) == 1 && strstr(cmd, "step-00000006"));
  CHECK(count_prefix(b, ".tmp-") == 0);
  free(m.mem);
}

/* ---------------------------------------------------------------- sharded (EP) saves */

/* Params idx[0..n) of m as a contents of their own (copied descriptors). */
static ckpt_contents part_of(const model *m, ckpt_param *buf, const int *idx, size_t n, const moec_config *cfg) {
  for (size_t i = 0; i < n; i++) buf[i] = m->p[idx[i]];
  ckpt_contents c = {.config = cfg, .bos_id = 2, .eos_id = 3, .pad_id = 1, .params = buf, .n_params = n};
  return c;
}

/* Writes step into dir as two parts: 0 the dense parameters (and the frozen scalar), 1 the experts. */
static int save_two_parts(const char *dir, int64_t step, const model *m, const moec_config *cfg, char *err, size_t errlen) {
  static const int dense[] = {0, 1, 2, 5, 6, 7}, experts[] = {3, 4};
  ckpt_param a[6], b[2];
  ckpt_contents ca = part_of(m, a, dense, 6, cfg), cb = part_of(m, b, experts, 2, cfg);
  char tmp[4096];
  if (ckpt_parts_begin(dir, step, tmp, sizeof tmp, err, errlen)) return -1;
  for (int which = 0; which < 2; which++) {
    const char *kind = which ? "optimizer" : "model";
    if (ckpt_parts_write(tmp, kind, 0, 2, &ca, err, errlen) || ckpt_parts_write(tmp, kind, 1, 2, &cb, err, errlen)) {
      ckpt_parts_abandon(tmp);
      return -1;
    }
  }
  return ckpt_parts_finish(dir, step, tmp, 2, 2, &ca, err, errlen);
}

/* The checkpoint at path holds the n files named and not `absent`. */
static void check_files(const char *path, const char *const *files, int n, const char *absent) {
  char f[1024];
  for (int i = 0; i < n; i++) {
    snprintf(f, sizeof f, "%s/%s", path, files[i]);
    CHECK(access(f, R_OK) == 0);
  }
  snprintf(f, sizeof f, "%s/%s", path, absent);
  CHECK(access(f, F_OK) != 0);
}

/* ---------------------------------------------------------------- ZeRO moment shards */

/* m's moments in n_parts ZeRO parts (ckpt.h) of step, the model whole in one file: parameter 0's
 * moments whole in part 0, every other's cut in n_parts shards of ceil(numel / n_parts), part
 * k holding the k-th; the 2-D ones (but the embedding) in their transpose's order, as moec
 * holds linear weights. skip_shard >= 0 leaves that parameter's shard 1 out (a gap), and
 * whole_too writes parameter 1's moments whole in part 1, instead of its shard 1. */
static int save_zero_parts(const char *dir, int64_t step, const model *m, const moec_config *cfg, int n_parts,
                           int skip_shard, int whole_too, char *err, size_t errlen) {
  char tmp[4096];
  ckpt_contents whole = {.config = cfg, .bos_id = 2, .eos_id = 3, .pad_id = 1, .params = m->p, .n_params = m->n};
  if (ckpt_parts_begin(dir, step, tmp, sizeof tmp, err, errlen)) return -1;
  int rc = ckpt_parts_write(tmp, "model", 0, 1, &whole, err, errlen);
  float *tm[8] = {0}, *tv[8] = {0}; /* the transposed orders */
  for (size_t i = 0; i < m->n && rc == 0; i++) {
    const ckpt_param *q = &m->p[i];
    if (!q->m || q->ndim != 2 || i == 0) continue;
    const int64_t r = q->shape[0], c = q->shape[1];
    tm[i] = malloc((size_t)(r * c) * sizeof(float)), tv[i] = malloc((size_t)(r * c) * sizeof(float));
    for (int64_t a = 0; a < r; a++)
      for (int64_t b = 0; b < c; b++) tm[i][b * r + a] = q->m[a * c + b], tv[i][b * r + a] = q->v[a * c + b];
  }
  for (int k = 0; k < n_parts && rc == 0; k++) {
    ckpt_param ps[10];
    size_t n = 0;
    for (size_t i = 0; i < m->n; i++) {
      const ckpt_param *q = &m->p[i];
      if (!q->m) continue;
      if (i == 0 || (whole_too && i == 1 && k == 1)) { /* whole (and so not also a shard in the same part) */
        if (k == (int)i) ps[n++] = *q;
        if (i == 0 || k == 1) continue;
      }
      const int64_t chunk = (numel(q) + n_parts - 1) / n_parts, lo = k * chunk;
      const int64_t len = lo >= numel(q) ? 0 : numel(q) - lo < chunk ? numel(q) - lo : chunk;
      if (len == 0 || ((int)i == skip_shard && k == 1)) continue;
      ckpt_param s = *q;
      s.shard_lo = lo, s.shard_n = len, s.shard_t = tm[i] != NULL;
      s.m = (tm[i] ? tm[i] : q->m) + lo, s.v = (tv[i] ? tv[i] : q->v) + lo;
      ps[n++] = s;
    }
    ckpt_contents c = whole;
    c.params = ps, c.n_params = n;
    rc = ckpt_parts_write(tmp, "optimizer", k, n_parts, &c, err, errlen);
  }
  for (int i = 0; i < 8; i++) free(tm[i]), free(tv[i]);
  if (rc == 0) return ckpt_parts_finish(dir, step, tmp, 1, n_parts, &whole, err, errlen);
  ckpt_parts_abandon(tmp);
  return -1;
}

/* ckpt_param.store into model `into` (its fetch_ctx): each tensor arrives whole, once. */
typedef struct {
  ckpt_param *p;
  int seen[3];
} store_into;

static int store_tensor(void *ctx, int which, const float *src, char *err, size_t errlen) {
  store_into *s = ctx;
  float *dst = which == 0 ? s->p->w : which == 1 ? s->p->m : s->p->v;
  if (s->seen[which]++) return snprintf(err, errlen, "%s: tensor %d stored twice", s->p->name, which), -1;
  memcpy(dst, src, (size_t)numel(s->p) * sizeof *dst);
  return 0;
}

static void test_zero_shards(void) {
  char dir[512], err[1024], path[600], f[700];
  snprintf(dir, sizeof dir, "%s/zero", root);
  moec_config cfg = tiny_config();
  model m, back;
  model_init(&m, 1);
  model_init(&back, 1);
  model_fill(&m, 8);
  CHECK(save_zero_parts(dir, 8, &m, &cfg, 3, -1, 0, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1 && strstr(path, "step-00000008"));
  static const char *files[] = {"model.safetensors", "optimizer.safetensors.index.json",
                                "optimizer-00001-of-00003.safetensors", "optimizer-00003-of-00003.safetensors"};
  check_files(path, files, 4, "model.safetensors.index.json");
  /* the shards' names: where they start, and in which order */
  snprintf(f, sizeof f, "%s/optimizer.safetensors.index.json", path);
  const char *idx = slurp(f);
  const int64_t q_chunk = (numel(&m.p[1]) + 2) / 3;
  char want[256];
  snprintf(want, sizeof want, "\"model.layers.0.self_attn.q_proj.weight.exp_avg_sq.shard_t.%lld\": "
           "\"optimizer-00002-of-00003.safetensors\"", (long long)q_chunk);
  CHECK(idx && strstr(idx, want));
  CHECK(idx && strstr(idx, "\"model.norm.weight.exp_avg.shard.0\": \"optimizer-00001-of-00003.safetensors\""));
  CHECK(idx && strstr(idx, "\"model.embed_tokens.weight.exp_avg\": \"optimizer-00001-of-00003.safetensors\""));

  /* loaded whole, the transposed shards turned back */
  for (size_t i = 1; i < back.n; i++) back.p[i].shard_t = back.p[i].ndim == 2;
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);
  model_fill(&back, 999);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0);
  CHECK(model_diff(&back, 8) == 0);
  /* through store (a tensor at a time, as a GPU resume reads), and check_only reading nothing */
  ckpt_param sp[8];
  store_into si[8];
  for (size_t i = 0; i < back.n; i++) {
    sp[i] = back.p[i];
    si[i] = (store_into){&back.p[i], {0, 0, 0}};
    sp[i].w = sp[i].m = sp[i].v = NULL;
    sp[i].store = store_tensor, sp[i].fetch_ctx = &si[i], sp[i].has_moments = back.p[i].m != NULL;
  }
  ckpt_contents stc = lc;
  stc.params = sp;
  model_fill(&back, 999);
  stc.check_only = 1;
  CHECK(ckpt_load(path, &stc, NULL, err, sizeof err) == 0);
  CHECK(back.p[3].w[0] == val(999, 3, 0, 0) && si[3].seen[0] == 0);
  stc.check_only = 0;
  CHECK(ckpt_load(path, &stc, NULL, err, sizeof err) == 0);
  CHECK(model_diff(&back, 8) == 0);
  CHECK(si[1].seen[0] == 1 && si[1].seen[1] == 1 && si[1].seen[2] == 1 && si[7].seen[1] == 0);
  /* the reader a test or a tool uses: the same moment, whole */
  ckpt_tset t;
  CHECK(ckpt_tset_open(&t, path, "optimizer", err, sizeof err) == 0);
  float *buf = malloc((size_t)numel(&m.p[3]) * sizeof *buf);
  CHECK(ckpt_tset_read(&t, "model.layers.0.block_sparse_moe.experts.0.w1.weight.exp_avg", 2, m.p[3].shape, buf,
                              err, sizeof err) == 0);
  CHECK(memcmp(buf, m.p[3].m, (size_t)numel(&m.p[3]) * sizeof *buf) == 0);
  free(buf);
  ckpt_tset_close(&t);

  /* the order must be the one this model holds the parameter in */
  back.p[1].shard_t = 0;
  model_fill(&back, 999);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "ZeRO shards of 'model.layers.0.self_attn.q_proj.weight.exp_avg' are in its transpose's order, but this "
                 "model holds it in its shape's");
  CHECK(back.p[0].w[0] == val(999, 0, 0, 0)); /* nothing written */
  back.p[1].shard_t = 1;

  /* a gap, and a moment both whole and in shards, refused with the tensors named */
  CHECK(save_zero_parts(dir, 9, &m, &cfg, 3, 4, 0, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "the shards of 'model.layers.0.block_sparse_moe.experts.0.w2.weight.exp_avg' leave a gap at value");
  CHECK(save_zero_parts(dir, 10, &m, &cfg, 2, -1, 1, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "'model.layers.0.self_attn.q_proj.weight.exp_avg' is there both whole and in ZeRO shards");
  CHECK(back.p[0].w[0] == val(999, 0, 0, 0));
  /* the shards of two writers (2 parts) load too, as a one-rank run would after zero */
  CHECK(save_zero_parts(dir, 11, &m, &cfg, 2, -1, 0, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0);
  CHECK(model_diff(&back, 8) == 0);
  free(m.mem);
  free(back.mem);
}

static void test_parts(void) {
  char dir[512], err[1024], path[600], f[700], cmd[4096];
  snprintf(dir, sizeof dir, "%s/parts", root);
  moec_config cfg = tiny_config();
  model m, back;
  model_init(&m, 1);
  model_init(&back, 1);
  model_fill(&m, 4);
  CHECK(save_two_parts(dir, 4, &m, &cfg, err, sizeof err) == 0);
  CHECK(ckpt_latest(dir, path, sizeof path, NULL) == 1 && strstr(path, "step-00000004"));
  static const char *files[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors", "optimizer.safetensors.index.json",
                                "optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors",
                                "config.json", "state.json"};
  check_files(path, files, 8, "model.safetensors");
  CHECK(count_prefix(dir, ".tmp-") == 0);
  /* the index maps every tensor to its part, and sums the data bytes */
  snprintf(f, sizeof f, "%s/model.safetensors.index.json", path);
  const char *idx = slurp(f);
  CHECK(idx && strstr(idx, "\"model.layers.0.block_sparse_moe.experts.0.w1.weight\": \"model-00002-of-00002.safetensors\""));
  CHECK(idx && strstr(idx, "\"lm_head.weight\": \"model-00001-of-00002.safetensors\""));
  char total[64];
  int64_t bytes = 0;
  for (size_t i = 0; i < m.n; i++) bytes += numel(&m.p[i]) * 4;
  snprintf(total, sizeof total, "\"total_size\": %lld", (long long)bytes);
  CHECK(idx && strstr(idx, total));

  /* the whole model loads from the parts; an EP rank's subset (the experts) too */
  ckpt_contents lc = contents(&back, &cfg, NULL, 0);
  model_fill(&back, 999);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == 0);
  CHECK(model_diff(&back, 4) == 0);
  static const int experts[] = {3, 4};
  ckpt_param eb[2];
  model_fill(&back, 999);
  ckpt_contents sc = part_of(&back, eb, experts, 2, &cfg);
  CHECK(ckpt_load(path, &sc, NULL, err, sizeof err) == -1); /* not subset: the dense ones are unexpected */
  CHECK_ERR(err, "unexpected tensor");
  sc.subset = ".norm."; /* the others may be there only if so named: lm_head.weight is not */
  CHECK(ckpt_load(path, &sc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "unexpected tensor");
  sc.subset = "."; /* every other name has a dot */
  CHECK(ckpt_load(path, &sc, NULL, err, sizeof err) == 0);
  CHECK(back.p[3].w[5] == val(4, 3, 0, 5) && back.p[4].v[7] == val(4, 4, 2, 7) && back.p[0].w[0] == val(999, 0, 0, 0));
  /* and a one-file checkpoint loads as a subset */
  char one[512];
  snprintf(one, sizeof one, "%s/parts-one", root);
  ckpt_contents wc = contents(&m, &cfg, NULL, 0);
  CHECK(ckpt_save(one, 4, &wc, err, sizeof err) == 0);
  snprintf(f, sizeof f, "%s/step-00000004", one);
  model_fill(&back, 999);
  CHECK(ckpt_load(f, &sc, NULL, err, sizeof err) == 0 && back.p[4].m[3] == val(4, 4, 1, 3));

  /* an abandoned sharded save leaves the last checkpoint named and no temporary behind */
  char tmp[4096];
  CHECK(ckpt_parts_begin(dir, 5, tmp, sizeof tmp, err, sizeof err) == 0);
  CHECK(count_prefix(dir, ".tmp-") == 1);
  ckpt_parts_abandon(tmp);
  CHECK(count_prefix(dir, ".tmp-") == 0);
  CHECK(ckpt_latest(dir, f, sizeof f, NULL) == 1 && !strcmp(f, path));

  /* a damaged index or a missing part fails the load with a message, and writes nothing */
  model_fill(&back, 999);
  snprintf(cmd, sizeof cmd, "cd %s && cp model.safetensors.index.json i.bak && "
           "sed -i 's/\"lm_head.weight\": \"model-00001/\"lm_head.weight\": \"model-00002/' model.safetensors.index.json",
           path);
  CHECK(system(cmd) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "names 'lm_head.weight' in model-00002-of-00002.safetensors, which does not hold it");
  snprintf(cmd, sizeof cmd, "cd %s && cp i.bak model.safetensors.index.json && "
           "sed -i 's/: \"model-00002-of-00002.safetensors\"/: \"..\\/x.safetensors\"/' model.safetensors.index.json", path);
  CHECK(system(cmd) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "not a .safetensors file of this directory");
  snprintf(cmd, sizeof cmd, "cd %s && cp i.bak model.safetensors.index.json && sed -i '/lm_head.weight/d' "
           "model.safetensors.index.json", path);
  CHECK(system(cmd) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "its parts hold 8 tensors but it maps 7");
  snprintf(cmd, sizeof cmd, "cd %s && mv i.bak model.safetensors.index.json && rm optimizer-00002-of-00002.safetensors", path);
  CHECK(system(cmd) == 0);
  CHECK(ckpt_load(path, &lc, NULL, err, sizeof err) == -1);
  CHECK_ERR(err, "optimizer-00002-of-00002.safetensors");
  CHECK(model_diff(&back, 999) == 0);
  free(m.mem);
  free(back.mem);
}

int main(void) {
  snprintf(root, sizeof root, "%s/moec_ckpt_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (getenv("MOEC_TEST_SEED")) rng_state = strtoull(getenv("MOEC_TEST_SEED"), NULL, 0);
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  test_config_json();
  test_roundtrip();
  test_load_errors();
  test_save_errors();
  test_stale();
  test_fetch();
  test_parts();
  test_zero_shards();
  test_crash();
  ckpt_rmtree(root);
  if (failures) {
    fprintf(stderr, "test_ckpt: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_ckpt: ok\n");
  return 0;
}
