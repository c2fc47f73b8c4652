/* launch.c -- moec train as one rank of a world of processes (the torchrun variables:
 * RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), and `moec launch`, which starts
 * the N processes of such a world on this machine. docs/parallel.md has the details. */
#include "launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"

static boot_env env;

int launch_train_check(void) {
  char err[1024];
  int r = boot_env_read(&env, err, sizeof err);
  if (r < 0) {
    fprintf(stderr, "moec: error: %s\n", err);
    return -1;
  }
  return r != 0;
}

void launch_local(int *local_rank, int *local_world) {
  const char *lw = getenv("LOCAL_WORLD_SIZE");
  *local_rank = env.local_rank;
  *local_world = lw && atoi(lw) > 0 ? atoi(lw) : 0; /* 0: unknown (torchrun sets it; mpirun may not) */
}

struct comm_world *launch_train_join(int64_t ep, int64_t dp, int *rank) {
  if ((int64_t)env.world != ep * dp) {
    fprintf(stderr, "moec: error: WORLD_SIZE=%d processes, but the model asks for ep x dp = %lld x %lld = %lld ranks "
                    "(set --set ep=N --set dp=M so that ep x dp = WORLD_SIZE, or start that many processes)\n",
            env.world, (long long)ep, (long long)dp, (long long)(ep * dp));
    return NULL;
  }
  char err[1024], blob[BOOT_BLOB_MAX];
  size_t blen = 0;
  int *fds = calloc((size_t)env.world, sizeof *fds);
  if (!fds) {
    fprintf(stderr, "moec: error: out of host memory\n");
    return NULL;
  }
  if (boot_mesh(&env, NULL, 0, blob, &blen, fds, err, sizeof err)) {
    fprintf(stderr, "moec: error: %s\n", err);
    free(fds);
    return NULL;
  }
  struct comm_world *w = comm_tcp_new((int)ep, (int)dp, env.rank, fds, comm_timeout_from_env(), err, sizeof err);
  free(fds);
  if (!w) fprintf(stderr, "moec: error: rank %d: %s\n", env.rank, err);
  *rank = env.rank;
  return w;
}

/* ---- moec launch ---- */

static const char *usage_launch =
    "usage: moec launch -n N [--master-port P] [--] COMMAND [ARGS...]\n"
    "\n"
    "Starts N processes of COMMAND on this machine as the ranks of one world: each gets RANK\n"
    "and LOCAL_RANK (0..N-1), WORLD_SIZE=N, MASTER_ADDR=127.0.0.1 and MASTER_PORT (the variables\n"
    "torchrun sets), and its output lines are prefixed with [rank i]. When a rank fails, the\n"
    "others are stopped and moec launch exits non-zero, naming it. For example:\n"
    "  moec launch -n 2 moec train models/tiny.moe --device cpu --set dp=2\n"
    "  -n N               the number of ranks\n"
    "  --master-port P    the port rank 0 listens on (default: a free one)\n";

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) { got_signal = sig; }

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  int port = bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0
                 ? ntohs(a.sin_port) : -1;
  close(fd);
  return port;
}

/* A child's output stream, forwarded line by line with its rank in front. */
typedef struct {
  int fd, rank;
  FILE *to;
  char buf[8192];
  size_t len;
} stream;

static void flush_lines(stream *s, int all) {
  size_t start = 0;
  for (size_t i = 0; i < s->len; i++)
    if (s->buf[i] == '\n' || s->buf[i] == '\r') {
      fprintf(s->to, "[rank %d] %.*s\n", s->rank, (int)(i - start), s->buf + start);
      start = i + 1;
    }
  if (all || (start == 0 && s->len == sizeof s->buf)) { /* the end, or a line longer than the buffer */
    if (start < s->len) fprintf(s->to, "[rank %d] %.*s\n", s->rank, (int)(s->len - start), s->buf + start);
    start = s->len;
  }
  memmove(s->buf, s->buf + start, s->len - start);
  s->len -= start;
  fflush(s->to);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void describe(int st, char *buf, size_t n) {
  if (WIFEXITED(st)) snprintf(buf, n, "exit status %d", WEXITSTATUS(st));
  else if (WIFSIGNALED(st)) snprintf(buf, n, "signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(buf, n, "status %d", st);
}

int cmd_launch(int argc, char **argv) {
  int n = 0, port = 0, i = 2;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage_launch, stdout);
      return 0;
    } else if (!strcmp(a, "--")) {
      i++;
      break;
    } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc") || !strcmp(a, "--master-port")) {
      char *end;
      long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
      int is_n = strcmp(a, "--master-port") != 0;
      if (i + 1 >= argc || *end || end == argv[i + 1] || v < 1 || v > (is_n ? 4096 : 65535)) {
        fprintf(stderr, "moec: error: %s %s: expected %s\n", a, i + 1 < argc ? argv[i + 1] : "(nothing)",
                is_n ? "a number of ranks from 1 to 4096" : "a port from 1 to 65535");
        return 1;
      }
      if (is_n) n = (int)v;
      else port = (int)v;
      i++;
    } else if (a[0] == '-') {
      fprintf(stderr, "moec: error: launch: unknown option '%s' (see 'moec launch --help'; put '--' before the command)\n", a);
      return 1;
    } else {
      break;
    }
  }
  if (n < 1) {
    fprintf(stderr, "moec: error: launch needs -n N (the number of ranks)\n%s", usage_launch);
    return 1;
  }
  if (i >= argc) {
    fprintf(stderr, "moec: error: launch needs a command to run\n%s", usage_launch);
    return 1;
  }
  if (!port && (port = free_port()) < 0) {
    fprintf(stderr, "moec: error: launch: no free port for MASTER_PORT: %s\n", strerror(errno));
    return 1;
  }
  char **cmd = argv + i;
  pid_t *pid = calloc((size_t)n, sizeof *pid);
  int *status = calloc((size_t)n, sizeof *status), *done = calloc((size_t)n, sizeof *done);
  stream *st = calloc((size_t)n * 2, sizeof *st);
  struct pollfd *pf = calloc((size_t)n * 2, sizeof *pf);
  if (!pid || !status || !done || !st || !pf) {
    fprintf(stderr, "moec: error: out of host memory\n");
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  fflush(stdout), fflush(stderr);
  int started = 0, rc = 0;
  for (; started < n; started++) {
    int out[2], err[2];
    if (pipe(out) || pipe(err)) {
      fprintf(stderr, "moec: error: launch: pipe: %s\n", strerror(errno));
      rc = 1;
      break;
    }
    const pid_t launcher = getpid();
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "moec: error: launch: cannot start rank %d: %s\n", started, strerror(errno));
      close(out[0]), close(out[1]), close(err[0]), close(err[1]);
      rc = 1;
      break;
    }
    if (p == 0) {
      setpgid(0, 0); /* its own process group: stopping a rank stops what it started */
      signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
      /* a launcher killed outright (SIGKILL: no handler runs) must not leave ranks training and
         writing checkpoints behind it: they get SIGTERM when it dies (or already did; after the
         default handlers are back, so that SIGTERM is not the launcher's handler's) */
      if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != launcher) _exit(1);
      dup2(out[1], STDOUT_FILENO), dup2(err[1], STDERR_FILENO);
      close(out[0]), close(out[1]), close(err[0]), close(err[1]);
      for (int k = 0; k < 2 * started; k++) close(st[k].fd);
      char v[32];
      snprintf(v, sizeof v, "%d", started);
      setenv("RANK", v, 1);
      setenv("LOCAL_RANK", v, 1);
      snprintf(v, sizeof v, "%d", n);
      setenv("WORLD_SIZE", v, 1);
      setenv("LOCAL_WORLD_SIZE", v, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(v, sizeof v, "%d", port);
      setenv("MASTER_PORT", v, 1);
      execvp(cmd[0], cmd);
      fprintf(stderr, "moec: error: launch: cannot run '%s': %s\n", cmd[0], strerror(errno));
      _exit(127);
    }
    setpgid(p, p);
    close(out[1]), close(err[1]);
    pid[started] = p;
    st[2 * started] = (stream){.fd = out[0], .rank = started, .to = stdout};
    st[2 * started + 1] = (stream){.fd = err[0], .rank = started, .to = stderr};
  }
  int live = started, open_streams = 2 * started, failed_rank = -1, killed = 0;
  double kill_at = 0;
  if (rc) { /* could not start them all: stop the ones that run */
    for (int k = 0; k < started; k++) kill(-pid[k], SIGTERM);
    killed = 1, kill_at = now_s() + 5;
  }
  while (live > 0 || open_streams > 0) {
    int k = 0;
    for (int s = 0; s < 2 * started; s++)
      if (st[s].fd >= 0) pf[k++] = (struct pollfd){st[s].fd, POLLIN, 0};
    if (k > 0 && poll(pf, (nfds_t)k, 100) > 0) {
      for (int s = 0, j = 0; s < 2 * started; s++) {
        if (st[s].fd < 0) continue;
        if (pf[j++].revents) {
          ssize_t got = read(st[s].fd, st[s].buf + st[s].len, sizeof st[s].buf - st[s].len);
          if (got > 0) {
            st[s].len += (size_t)got;
            flush_lines(&st[s], 0);
          } else if (got == 0 || errno != EINTR) {
            flush_lines(&st[s], 1);
            close(st[s].fd);
            st[s].fd = -1;
            open_streams--;
          }
        }
      }
    } else if (k == 0) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    int wst;
    pid_t p;
    while (live > 0 && (p = waitpid(-1, &wst, WNOHANG)) > 0) {
      for (int r = 0; r < started; r++)
        if (pid[r] == p && !done[r]) {
          done[r] = 1, status[r] = wst, live--;
          if (!(WIFEXITED(wst) && WEXITSTATUS(wst) == 0) && failed_rank < 0 && !killed) {
            char d[96];
            describe(wst, d, sizeof d);
            failed_rank = r;
            fprintf(stderr, "moec launch: rank %d (pid %d) failed with %s; stopping the other %d rank(s)\n", r, (int)p, d, live);
            for (int o = 0; o < started; o++)
              if (!done[o]) kill(-pid[o], SIGTERM);
            killed = 1, kill_at = now_s() + 5;
          }
        }
    }
    if (got_signal && !killed) {
      fprintf(stderr, "moec launch: got signal %d; stopping the ranks\n", (int)got_signal);
      for (int o = 0; o < started; o++)
        if (!done[o]) kill(-pid[o], (int)got_signal);
      killed = 1, kill_at = now_s() + 5;
      rc = 1;
    }
    if (killed && live > 0 && now_s() > kill_at) { /* they did not stop: make them */
      for (int o = 0; o < started; o++)
        if (!done[o]) kill(-pid[o], SIGKILL);
      kill_at = now_s() + 3600;
    }
    if (live == 0 && open_streams > 0 && killed) { /* grandchildren holding the pipes: stop reading */
      for (int s = 0; s < 2 * started; s++)
        if (st[s].fd >= 0) flush_lines(&st[s], 1), close(st[s].fd), st[s].fd = -1;
      open_streams = 0;
    }
  }
  if (failed_rank >= 0) {
    char d[96];
    describe(status[failed_rank], d, sizeof d);
    fprintf(stderr, "moec launch: error: rank %d of %d failed with %s (the lines marked [rank %d] above say why)\n",
            failed_rank, n, d, failed_rank);
    rc = 1;
  }
  free(pid), free(status), free(done), free(st), free(pf);
  return rc;
}
