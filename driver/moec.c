/* moec.c -- the command-line driver: reads flags, then hands over to the front end, the
 * pass pipeline and the runtime. Kept small on purpose. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend.h"
#include "pipeline.h"
#include "bundle.h"
#include "gpu_kernels.h"
#include "gpu_loader.h"
#include "launch.h"
#include "memplan.h"
#include "comm.h"
#include "train.h"

#include <unistd.h>

#define MAX_SETS 256

typedef struct {
  const char *file;
  moec_set sets[MAX_SETS];
  int n_sets;
  pipeline_opts pipe;
  const char *dot;
  const char *out; /* compile -o */
  train_opts train;
  const char *device;
} cli;

static const char *usage_main =
    "moec " MOEC_VERSION " -- compile and train Mixture-of-Experts DNA language models\n"
    "\n"
    "usage: moec COMMAND FILE.moe [options]\n"
    "\n"
    "commands:\n"
    "  check   parse, lower and verify a model; print a one-line summary\n"
    "  dump    print the IR (after lowering, or after any pass)\n"
    "  train   train a model on a genome (FASTA), on the CPU\n"
    "  compile write a standalone training executable for a model\n"
    "  launch  run N processes of a command as the ranks of one world (moec launch -n 2 moec train ...)\n"
    "\n"
    "Run 'moec COMMAND --help' for a command's options; docs/language.md describes .moe files.\n";

static const char *usage_check =
    "usage: moec check FILE.moe [--set NAME=VALUE]...\n"
    "\n"
    "Parses, lowers and verifies FILE.moe and prints its parameter counts.\n"
    "  --set NAME=VALUE   override a size or training value (see docs/language.md)\n";

static const char *usage_dump =
    "usage: moec dump FILE.moe [options]\n"
    "\n"
    "Prints the IR after lowering and the passes. Each section starts with\n"
    "'// ----- IR after NAME ----- //'.\n"
    "  --set NAME=VALUE        override a size or training value\n"
    "  --passes=LIST           run only these passes (comma-separated), in pipeline order\n"
    "  --disable-pass=LIST     skip these passes\n"
    "  --print-after=all|LIST  print the IR after these passes (default: the final IR)\n"
    "  --print-after-change    print only after passes that changed the IR (alone: after each of them)\n"
    "  --dump-dir=DIR          also write DIR/NN-after-PASS.mir after lower and each pass run\n"
    "                          (NN: the pass's place in the pipeline)\n"
    "  --pass-timing           print each pass's time and op counts (stderr)\n"
    "  --train                 build the whole training step: forward, loss, backward, AdamW\n"
    "  --dot=OUT.dot           also write the final IR as a Graphviz graph\n";

static const char *usage_train =
    "usage: moec train FILE.moe [options]\n"
    "\n"
    "Trains the model on the data its train section names (or --data), printing progress,\n"
    "validation loss in nats and bits per base, and writing checkpoints.\n"
    "  --data PATH            FASTA, FASTA.gz or BGZF genome (overrides the file's data)\n"
    "  --steps N              run length and learning-rate schedule horizon\n"
    "  --stop-at STEP         end after STEP, as if interrupted (checkpoint with --ckpt-dir);\n"
    "                         0 writes the untrained weights\n"
    "  --device cpu|cuda      where to train (default: cuda when a GPU is present)\n"
    "  --dump-dir DIR         write the generated CUDA sources and NVRTC logs into DIR\n"
    "  --log FILE.jsonl       one JSON line per step and per validation\n"
    "  --ckpt-dir DIR         write checkpoints (safetensors, Hugging Face layout) into DIR\n"
    "  --ckpt-every N         checkpoint every N steps (and always at the end)\n"
    "  --resume               continue from DIR/latest, bit-exactly\n"
    "  --seed N               initialisation and data order seed\n"
    "  --val-batches N        batches per validation (default 8)\n"
    "  --set NAME=VALUE       override a size or training value (see docs/language.md)\n"
    "  --passes/--disable-pass/--print-after/--print-after-change/--dump-dir/--pass-timing\n"
    "                         as for 'moec dump' (they apply to the training step)\n";

static const char *usage_compile =
    "usage: moec compile FILE.moe -o NAME [--set NAME=VALUE]...\n"
    "\n"
    "Checks the model, then writes the executable NAME: moec with the model's source files\n"
    "(and includes), the --set values and the data path built in. './NAME [train options]'\n"
    "trains without the .moe file; './NAME --help' lists the options.\n"
    "  --passes/--disable-pass/--print-after/--print-after-change/--dump-dir/--pass-timing\n"
    "                     as for 'moec dump', for the training step checked here (the executable\n"
    "                     takes them too, when it trains)\n";

/* Set when this binary is a compiled model (moec compile): the model's files. */
static moec_bundle embedded;
static int is_embedded;

/* With split: the model as one rank sees it: with ep x dp = W > 1 ranks, each takes batch / W sequences of
 * the global batch, so the graph is lowered again at that batch (docs/parallel.md). */
static ir_graph *load_model_ex(const cli *c, moec_sources *record, int split) {
  const moec_sources *from = is_embedded ? &embedded.sources : NULL;
  ir_graph *g = moec_frontend_load_ex(c->file, c->sets, c->n_sets, stderr, from, record);
  if (!g || record || !split) return g;
  int64_t world = g->cfg.ep * g->cfg.dp, batch = g->cfg.batch;
  if (world <= 1) return g;
  ir_graph_free(g);
  if (batch % world) {
    fprintf(stderr, "moec: error: batch = %" PRId64 " is not a multiple of ep x dp = %" PRId64
                    " (each rank takes batch / (ep x dp) sequences of the global batch)\n", batch, world);
    return NULL;
  }
  moec_set sets[MAX_SETS + 1];
  int n = 0;
  for (int i = 0; i < c->n_sets; i++)
    if (strcmp(c->sets[i].name, "batch") != 0) sets[n++] = c->sets[i];
  char v[32];
  snprintf(v, sizeof v, "%" PRId64, batch / world);
  sets[n++] = (moec_set){"batch", v};
  return moec_frontend_load_ex(c->file, sets, n, stderr, from, NULL);
}
static ir_graph *load_model(const cli *c, moec_sources *record) { return load_model_ex(c, record, 0); }
static ir_graph *load_rank_model(const cli *c) { return load_model_ex(c, NULL, 1); }

static void print_passes(FILE *out) {
  int n;
  const pass_info *t = pass_table(&n);
  fputs("\npasses (in pipeline order):\n  lower              the front end's AST -> IR lowering (always first)\n", out);
  for (int i = 0; i < n; i++) fprintf(out, "  %-18s %s\n", t[i].name, t[i].summary);
}

/* Matches "--name=value" or "--name value"; advances *i past a separate value. */
static int take_flag(int argc, char **argv, int *i, const char *name, const char **value) {
  size_t n = strlen(name);
  if (strncmp(argv[*i], name, n) != 0) return 0;
  if (argv[*i][n] == '=') {
    *value = argv[*i] + n + 1;
    return 1;
  }
  if (argv[*i][n] != 0) return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "moec: error: %s needs a value\n", name);
    exit(1);
  }
  *value = argv[++*i];
  return 1;
}

static int add_set(cli *c, const char *name, const char *value) {
  if (c->n_sets == MAX_SETS) {
    fprintf(stderr, "moec: error: more than %d --set options\n", MAX_SETS);
    return -1;
  }
  c->sets[c->n_sets++] = (moec_set){name, value};
  return 0;
}

/* A non-negative integer flag value. */
static int parse_count(const char *flag, const char *v, int64_t *out) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || end == v || *end || n < 0) {
    fprintf(stderr, "moec: error: %s %s: expected a non-negative integer\n", flag, v);
    return -1;
  }
  *out = n;
  return 0;
}

static int parse_args(int argc, char **argv, cli *c, const char *usage) {
  memset(c, 0, sizeof *c);
  c->pipe.dump = stdout;
  c->train.stop_at = -1;
  for (int i = 2; i < argc; i++) {
    const char *v;
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage, stdout);
      if (usage == usage_dump) print_passes(stdout);
      exit(0);
    } else if (take_flag(argc, argv, &i, "--set", &v)) {
      const char *eq = strchr(v, '=');
      if (!eq || eq == v) {
        fprintf(stderr, "moec: error: --set %s: expected NAME=VALUE, e.g. --set top_k=1\n", v);
        return -1;
      }
      /* argv strings are ours to split */
      ((char *)eq)[0] = 0;
      if (add_set(c, v, eq + 1)) return -1;
    } else if (take_flag(argc, argv, &i, "--passes", &v)) {
      c->pipe.passes = v;
    } else if (take_flag(argc, argv, &i, "--disable-pass", &v)) {
      c->pipe.disable = v;
    } else if (strcmp(argv[i], "--print-after-change") == 0) {
      c->pipe.print_after_change = 1;
    } else if (take_flag(argc, argv, &i, "--print-after", &v)) {
      c->pipe.print_after = v;
    } else if (take_flag(argc, argv, &i, "--dump-dir", &v)) {
      c->pipe.dump_dir = v;
    } else if (strcmp(argv[i], "--pass-timing") == 0) {
      c->pipe.pass_timing = 1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--data", &v)) {
      c->train.data = v;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--steps", &v)) {
      if (add_set(c, "steps", v)) return -1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--seed", &v)) {
      if (add_set(c, "seed", v)) return -1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--stop-at", &v)) {
      if (parse_count("--stop-at", v, &c->train.stop_at)) return -1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--ckpt-every", &v)) {
      if (parse_count("--ckpt-every", v, &c->train.ckpt_every)) return -1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--val-batches", &v)) {
      if (parse_count("--val-batches", v, &c->train.val_batches)) return -1;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--log", &v)) {
      c->train.log_path = v;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--ckpt-dir", &v)) {
      c->train.ckpt_dir = v;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--dump-dir", &v)) {
      c->train.dump_dir = v;
    } else if (usage == usage_train && take_flag(argc, argv, &i, "--device", &v)) {
      c->device = v;
    } else if (usage == usage_train && strcmp(argv[i], "--resume") == 0) {
      c->train.resume = 1;
    } else if (usage == usage_compile && (take_flag(argc, argv, &i, "-o", &v) || take_flag(argc, argv, &i, "--output", &v))) {
      c->out = v;
    } else if (strcmp(argv[i], "--train") == 0) {
      c->pipe.train = 1;
    } else if (take_flag(argc, argv, &i, "--dot", &v)) {
      c->dot = v;
    } else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "moec: error: unknown option '%s' (see 'moec %s --help')\n", argv[i], argv[1]);
      return -1;
    } else if (!c->file) {
      c->file = argv[i];
    } else {
      fprintf(stderr, "moec: error: more than one input file ('%s' and '%s')\n", c->file, argv[i]);
      return -1;
    }
  }
  if (!c->file) {
    fprintf(stderr, "moec: error: no input file\n%s", usage);
    return -1;
  }
  return pipeline_check_opts(&c->pipe, stderr);
}

static void count_params(const ir_graph *g, double *total, double *active) {
  double dense = 0, expert = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = &g->nodes[i];
    if (n->op != OP_PARAM) continue;
    double numel = (double)ir_type_numel_bound(g, &n->type);
    if (ir_get_int(n, "expert", -1) >= 0) expert += numel;
    else dense += numel;
  }
  *total = dense + expert;
  *active = dense + (g->cfg.experts > 0 ? expert * (double)g->cfg.top_k / (double)g->cfg.experts : expert);
}

static const char *human(double x, char *buf, size_t n) {
  if (x >= 1e9) snprintf(buf, n, "%.2fB", x / 1e9);
  else if (x >= 1e6) snprintf(buf, n, "%.2fM", x / 1e6);
  else if (x >= 1e3) snprintf(buf, n, "%.1fK", x / 1e3);
  else snprintf(buf, n, "%.0f", x);
  return buf;
}

static int cmd_check(int argc, char **argv) {
  cli c;
  if (parse_args(argc, argv, &c, usage_check)) return 1;
  ir_graph *g = load_model(&c, NULL);
  if (!g) return 1;
  double total, active;
  char a[32], b[32];
  count_params(g, &total, &active);
  printf("%s: ok: %s parameters (%.0f), %s active per token (%.0f); %" PRId64 " layers, %" PRId64
         " experts, top-%" PRId64 "; %d IR ops\n",
         g->model_name, human(total, a, sizeof a), total, human(active, b, sizeof b), active,
         g->cfg.layers, g->cfg.experts, g->cfg.top_k, g->n_nodes);
  ir_graph_free(g);
  return 0;
}

static int cmd_dump(int argc, char **argv) {
  cli c;
  if (parse_args(argc, argv, &c, usage_dump)) return 1;
  ir_graph *g = load_rank_model(&c);
  if (!g) return 1;
  int rc = pipeline_run(&g, &c.pipe, stderr);
  if (rc == 0 && !c.pipe.print_after && !c.pipe.print_after_change) {
    pipeline_print_header("pipeline", stdout);
    ir_print(g, stdout);
  }
  if (rc == 0 && c.dot) {
    FILE *f = fopen(c.dot, "w");
    if (!f) {
      fprintf(stderr, "moec: error: --dot=%s: cannot write: %s\n", c.dot, strerror(errno));
      rc = -1;
    } else {
      ir_print_dot(g, f);
      if (fclose(f) != 0) {
        fprintf(stderr, "moec: error: --dot=%s: write failed: %s\n", c.dot, strerror(errno));
        rc = -1;
      }
    }
  }
  ir_graph_free(g);
  return rc == 0 ? 0 : 1;
}

static int cmd_train(int argc, char **argv) {
  cli c;
  if (parse_args(argc, argv, &c, usage_train)) return 1;
  if (c.device && strcmp(c.device, "cpu") != 0 && strcmp(c.device, "cuda") != 0) {
    fprintf(stderr, "moec: error: --device %s: expected cpu or cuda\n", c.device);
    return 1;
  }
  /* WORLD_SIZE > 1: this process is one rank of a world of processes (driver/launch.c) */
  int multi = launch_train_check();
  if (multi < 0) return 1;
  /* the GPU when one is present, unless asked otherwise */
  char derr[256];
  int n_gpus = 0;
  c.train.cuda = c.device ? strcmp(c.device, "cuda") == 0
                          : gpu_driver_load(derr, sizeof derr) == 0 && gpu_device_count(&n_gpus, derr, sizeof derr) == 0 && n_gpus > 0;
  if (multi) launch_local(&c.train.local_rank, &c.train.local_world);
  /* a rank that cannot train on a GPU says so before the others wait for it at the bootstrap */
  char pinfo[256], perr[1024];
  if (multi && c.train.cuda && rt_cuda_probe(pinfo, sizeof pinfo, perr, sizeof perr) != 0) {
    fprintf(stderr, "moec: error: --device cuda: %s\n", perr);
    return 1;
  }
  /* one graph pair per EP rank (each keeps its own experts); DP ranks share them */
  ir_graph *probe = load_rank_model(&c);
  if (!probe) return 1;
  int ep = probe->cfg.ep > 1 ? (int)probe->cfg.ep : 1;
  int64_t dp = probe->cfg.dp > 1 ? probe->cfg.dp : 1;
  ir_graph_free(probe);
  /* on the GPU the fused experts (group-linear, grouped-mlp) are the default: faster and smaller
   * than the naive ones on the H200 (genos_1b bf16 1.40x the peer vs 1.34x, og2_8x1b 1.29x vs
   * 1.24x; bench/RESULTS.md), and expert parallelism exchanges their rows. mxfp8 stays off unless
   * --passes names it: with cuBLASLt's FP8 its quantize kernels cost more than the FP8 GEMMs save
   * (issue 6's wgmma kernel changes that) */
  char gpu_disable[1024];
  if (c.train.cuda && !c.pipe.passes) {
    snprintf(gpu_disable, sizeof gpu_disable, "%s%smxfp8-projections,mxfp8", c.pipe.disable ? c.pipe.disable : "",
             c.pipe.disable ? "," : "");
    c.pipe.disable = gpu_disable;
    fprintf(stderr, "moec: note: --device cuda: mxfp8 is off by default (--passes=lower,group-linear,grouped-mlp,%s"
                    "autodiff,%sfold-grad-cast,mxfp8,fuse-residual,fuse-gemm-add,dce turns it on for the expert GEMMs; "
                    "the fastest line adds --set precision='mxfp8(block=128,weight_tile=128)' --set moments=bf16; "
                    "mxfp8-projections after grouped-mlp puts the attention projections in FP8 too)\n",
            ep * dp > 1 ? "parallelize," : "", ep * dp > 1 ? "sync," : "");
  }
  if (multi && !(c.train.world = launch_train_join(ep, dp, &c.train.rank))) return 1;
  ir_graph **fwd = calloc((size_t)ep, sizeof *fwd), **step = calloc((size_t)ep, sizeof *step);
  /* the forward graph (validation) takes the same passes, without autodiff, and is not dumped */
  char fwd_disable[1024];
  snprintf(fwd_disable, sizeof fwd_disable, "%s%sautodiff", c.pipe.disable ? c.pipe.disable : "", c.pipe.disable ? "," : "");
  pipeline_opts fwd_opts = {.passes = c.pipe.passes, .disable = fwd_disable, .dump = stdout};
  c.pipe.train = 1;
  pipeline_opts quiet = {.passes = c.pipe.passes, .disable = c.pipe.disable, .dump = stdout, .train = 1};
  int rc = 1, ok = fwd && step;
  for (int e = 0; ok && e < ep; e++) {
    fwd[e] = load_rank_model(&c);
    step[e] = load_rank_model(&c);
    ok = fwd[e] && step[e];
    if (!ok) break;
    fwd[e]->cfg.ep_rank = step[e]->cfg.ep_rank = e;
    ok = pipeline_run(&fwd[e], &fwd_opts, stderr) == 0 && pipeline_run(&step[e], e ? &quiet : &c.pipe, stderr) == 0;
  }
  if (ok) {
    c.train.moe_path = c.file;
    c.train.progress = isatty(STDERR_FILENO) && c.train.rank == 0;
    rc = moec_train((const ir_graph *const *)fwd, (const ir_graph *const *)step, &c.train);
  }
  for (int e = 0; fwd && step && e < ep; e++) {
    ir_graph_free(fwd[e]);
    ir_graph_free(step[e]);
  }
  free(fwd);
  free(step);
  comm_world_free(c.train.world);
  return rc;
}

static int cmd_compile(int argc, char **argv) {
  cli c;
  if (parse_args(argc, argv, &c, usage_compile)) return 1;
  if (!c.out) {
    fprintf(stderr, "moec: error: compile needs -o NAME (the executable to write)\n");
    return 1;
  }
  moec_bundle b;
  memset(&b, 0, sizeof b);
  ir_graph *g = load_model(&c, &b.sources);
  c.pipe.train = 1;
  int rc = 1;
  if (g && pipeline_run(&g, &c.pipe, stderr) == 0) {
    /* bake in the --set values, then the data path as resolved here (absolute) */
    b.sets = calloc((size_t)c.n_sets + 1, sizeof *b.sets);
    if (!b.sets) {
      fprintf(stderr, "moec: error: out of memory\n");
      goto done;
    }
    for (int i = 0; i < c.n_sets; i++) b.sets[b.n_sets++] = (moec_set){strdup(c.sets[i].name), strdup(c.sets[i].value)};
    b.sets[b.n_sets++] = (moec_set){strdup("data"), strdup(g->cfg.data)};
    char err[1024];
    if (bundle_write(c.out, &b, err, sizeof err) != 0) {
      fprintf(stderr, "moec: error: -o %s: %s\n", c.out, err);
      goto done;
    }
    printf("wrote %s: trains %s (%d source file%s, data %s); run './%s --help'\n", c.out, g->model_name, b.sources.n,
           b.sources.n == 1 ? "" : "s", g->cfg.data, c.out);
    memplan mp;
    memplan_estimate(g, &mp);
    char t[32], p[32], o[32], c[32], a[32];
    printf("predicted peak GPU memory: %s (weights %s, AdamW moments %s, bf16 weight copies %s, activations %s at "
           "most)\n",
           gpu_fmt_bytes((size_t)mp.total, t, sizeof t), gpu_fmt_bytes((size_t)mp.params, p, sizeof p),
           gpu_fmt_bytes((size_t)mp.optimizer, o, sizeof o), gpu_fmt_bytes((size_t)mp.copies, c, sizeof c),
           gpu_fmt_bytes((size_t)mp.activations, a, sizeof a));
    rc = 0;
  }
done:
  ir_graph_free(g);
  bundle_free(&b);
  return rc;
}

/* A compiled model: behave as `moec train <embedded file> --set <baked>... ARGS`. */
static int run_embedded(int argc, char **argv) {
  int n = 0;
  char **args = calloc((size_t)(argc + 2 * embedded.n_sets + 4), sizeof *args);
  if (!args) return 1;
  args[n++] = argv[0];
  args[n++] = "train";
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: %s [options]\n\na moec training executable for %s (moec compile).\n%s", argv[0],
             embedded.sources.v[0].path, strstr(usage_train, "\n") + 1);
      free(args);
      return 0;
    }
  args[n++] = embedded.sources.v[0].path;
  char **kv = calloc((size_t)embedded.n_sets + 1, sizeof *kv);
  int rc = kv ? 0 : 1;
  for (int i = 0; rc == 0 && i < embedded.n_sets; i++) {
    size_t len = strlen(embedded.sets[i].name) + strlen(embedded.sets[i].value) + 2;
    if (!(kv[i] = malloc(len))) {
      rc = 1;
      break;
    }
    snprintf(kv[i], len, "%s=%s", embedded.sets[i].name, embedded.sets[i].value);
    args[n++] = "--set";
    args[n++] = kv[i];
  }
  for (int i = 1; i < argc; i++) args[n++] = argv[i];
  if (rc == 0) rc = cmd_train(n, args);
  for (int i = 0; kv && i < embedded.n_sets; i++) free(kv[i]);
  free(kv);
  free(args);
  return rc;
}

int main(int argc, char **argv) {
  char err[256];
  int found = bundle_read_self(&embedded, err, sizeof err);
  if (found < 0) {
    fprintf(stderr, "%s: error: %s\n", argv[0], err);
    return 1;
  }
  if (found > 0) {
    is_embedded = 1;
    int rc = run_embedded(argc, argv);
    bundle_free(&embedded);
    return rc;
  }
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    fputs(usage_main, argc < 2 ? stderr : stdout);
    return argc < 2 ? 1 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("moec %s\n", MOEC_VERSION);
    return 0;
  }
  if (strcmp(argv[1], "check") == 0) return cmd_check(argc, argv);
  if (strcmp(argv[1], "dump") == 0) return cmd_dump(argc, argv);
  if (strcmp(argv[1], "train") == 0) return cmd_train(argc, argv);
  if (strcmp(argv[1], "compile") == 0) return cmd_compile(argc, argv);
  if (strcmp(argv[1], "launch") == 0) return cmd_launch(argc, argv);
  fprintf(stderr, "moec: error: unknown command '%s'; the commands are check, dump, train, compile, launch (see 'moec --help')\n", argv[1]);
  return 1;
}
