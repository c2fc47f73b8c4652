/* test_bootstrap.c -- the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
 * MASTER_PORT, MOEC_BOOT_TIMEOUT): good values parse, bad ones fail naming the variable; the
 * mesh of 3 forked processes connects every pair and carries rank 0's 4 KiB blob to all;
 * a rank without rank 0, rank 0 without the others, and a WORLD_SIZE disagreement fail with
 * messages within the boot timeout. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "check.h"
#include "comm_test.h"

static void set_env(const char *world, const char *rank, const char *addr, const char *port) {
  const char *names[4] = {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}, *vals[4] = {world, rank, addr, port};
  for (int i = 0; i < 4; i++)
    if (vals[i]) setenv(names[i], vals[i], 1);
    else unsetenv(names[i]);
}

/* boot_env_read's result; err must contain want (when want). */
static void expect(const char *world, const char *rank, const char *addr, const char *port, int rc_want, const char *want) {
  set_env(world, rank, addr, port);
  boot_env e;
  char err[1024] = "";
  int rc = boot_env_read(&e, err, sizeof err);
  CHECK(rc == rc_want, "WORLD_SIZE=%s RANK=%s MASTER_ADDR=%s MASTER_PORT=%s: got %d, want %d (%s)", world ? world : "-",
        rank ? rank : "-", addr ? addr : "-", port ? port : "-", rc, rc_want, err);
  if (want) CHECK(strstr(err, want) != NULL, "message '%s' lacks '%s'", err, want);
}

static unsigned char blob[BOOT_BLOB_MAX];

/* One rank of a mesh test: returns failures (as the exit status). world_claim: the
 * WORLD_SIZE this rank says (to test disagreement); want: a message its failure must contain. */
static int mesh_rank(int world, int world_claim, int rank, int port, const char *timeout, const char *want) {
  failures = 0;
  alarm(30);
  char w[16], r[16], p[16];
  snprintf(w, sizeof w, "%d", world_claim);
  snprintf(r, sizeof r, "%d", rank);
  snprintf(p, sizeof p, "%d", port);
  set_env(w, r, "localhost", p);
  setenv("MOEC_BOOT_TIMEOUT", timeout, 1);
  boot_env e;
  char err[1024] = "";
  CHECK(boot_env_read(&e, err, sizeof err) == 1, "env: %s", err);
  int fds[8];
  unsigned char got[BOOT_BLOB_MAX];
  size_t glen = 0;
  double t0 = now_s();
  int rc = boot_mesh(&e, blob, sizeof blob, got, &glen, fds, err, sizeof err);
  if (want) {
    CHECK(rc == -1 && strstr(err, want), "rank %d: wanted a failure with '%s', got %d: %s", rank, want, rc, err);
    CHECK(now_s() - t0 < atof(timeout) + 3, "rank %d: failing took %.1f s", rank, now_s() - t0);
    return failures != 0;
  }
  CHECK(rc == 0, "rank %d: %s", rank, err);
  if (rc) return 1;
  CHECK(glen == sizeof blob && memcmp(got, blob, sizeof blob) == 0, "rank %d: the blob (%zu bytes)", rank, glen);
  CHECK(fds[rank] == -1, "own fd");
  /* every pair is connected, to the right rank: send my rank to each, read theirs */
  for (int j = 0; j < world; j++)
    if (j != rank) CHECK(write(fds[j], &rank, sizeof rank) == sizeof rank, "write to %d", j);
  for (int j = 0; j < world; j++) {
    if (j == rank) continue;
    int v = -1;
    CHECK(read(fds[j], &v, sizeof v) == sizeof v && v == j, "rank %d: the stream of rank %d says %d", rank, j, v);
    close(fds[j]);
  }
  return failures != 0;
}

/* Forks the ranks listed (world_claim[r] < 0: not started); checks every exit status is 0. */
static void mesh(int world, const int *claim, const char *timeout, const char *const *want) {
  int port = free_port();
  pid_t pid[8];
  for (int r = 0; r < world; r++) {
    pid[r] = -1;
    if (claim[r] < 0) continue;
    fflush(stdout), fflush(stderr);
    if ((pid[r] = fork()) == 0) _exit(mesh_rank(world, claim[r], r, port, timeout, want ? want[r] : NULL));
  }
  for (int r = 0; r < world; r++) {
    if (pid[r] < 0) continue;
    int st = 0;
    waitpid(pid[r], &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "world %d: rank %d failed (status %d)", world, r, st);
  }
}

int main(void) {
  unsetenv("LOCAL_RANK");
  unsetenv("MOEC_BOOT_TIMEOUT");
  /* the environment */
  expect(NULL, NULL, NULL, NULL, 0, NULL);              /* not a multi-process run */
  expect("1", "0", NULL, NULL, 0, NULL);                /* torchrun with one process */
  expect(NULL, "1", NULL, NULL, -1, "WORLD_SIZE is not");
  expect("2", NULL, "h", "1", -1, "RANK is not");
  expect("2", "2", "h", "1", -1, "RANK=2 is not below WORLD_SIZE=2");
  expect("2", "abc", "h", "1", -1, "RANK=abc");
  expect("2", "-1", "h", "1", -1, "RANK=-1");
  expect("two", "0", "h", "1", -1, "WORLD_SIZE=two");
  expect("0", "0", "h", "1", -1, "WORLD_SIZE=0");
  expect("2", "1", NULL, "1", -1, "MASTER_ADDR is not set");
  expect("2", "1", "", "1", -1, "MASTER_ADDR is not set");
  expect("2", "1", "h", NULL, -1, "MASTER_PORT is not set");
  expect("2", "1", "h", "70000", -1, "MASTER_PORT=70000");
  expect("2", "1", "h", "29500x", -1, "MASTER_PORT=29500x");
  setenv("LOCAL_RANK", "x", 1);
  expect("2", "1", "h", "29500", -1, "LOCAL_RANK=x");
  setenv("LOCAL_RANK", "1", 1);
  setenv("MOEC_BOOT_TIMEOUT", "0", 1);
  expect("2", "1", "h", "29500", -1, "MOEC_BOOT_TIMEOUT=0");
  setenv("MOEC_BOOT_TIMEOUT", "2.5", 1);
  expect("4", "3", "node0", "29500", 1, NULL);
  boot_env e;
  char err[256];
  boot_env_read(&e, err, sizeof err);
  CHECK(e.rank == 3 && e.world == 4 && e.local_rank == 1 && !strcmp(e.master_addr, "node0") && e.master_port == 29500 &&
            e.timeout_s == 2.5, "parsed values");
  unsetenv("LOCAL_RANK");

  /* the mesh, and its failures */
  for (size_t i = 0; i < sizeof blob; i++) blob[i] = (unsigned char)(i * 131 + 7);
  mesh(3, (int[]){3, 3, 3}, "20", NULL);
  mesh(2, (int[]){2, 2}, "20", NULL);
  mesh(2, (int[]){-1, 2}, "0.5", (const char *const[]){NULL, "cannot connect to rank 0"});
  mesh(3, (int[]){3, -1, 3}, "0.5", (const char *const[]){"missing rank(s): 1", NULL, "rank 0"});
  mesh(2, (int[]){2, 3}, "5", (const char *const[]){"RANK=1 WORLD_SIZE=3 connected, but rank 0 has WORLD_SIZE=2", "rank 0"});
  if (!failures) printf("bootstrap: the environment parses and refuses bad values; the mesh connects and carries the blob\n");
  return failures != 0;
}
