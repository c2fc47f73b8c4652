/* bootstrap.h -- joining a world of processes: the torchrun environment (RANK, WORLD_SIZE,
 * LOCAL_RANK, MASTER_ADDR, MASTER_PORT), then a full TCP mesh between the ranks.
 *
 * Rank 0 listens on MASTER_PORT; every other rank opens its own listening socket, connects to
 * rank 0 (retrying until MOEC_BOOT_TIMEOUT seconds, default 300) and says its rank, world size
 * and port; rank 0 sends everyone the table of addresses and a small opaque blob (up to
 * BOOT_BLOB_MAX bytes: later the ncclUniqueId). Then rank r connects to ranks 1..r-1 and
 * accepts ranks r+1..W-1, so each pair of ranks has one stream. IPv4. */
#ifndef MOEC_BOOTSTRAP_H
#define MOEC_BOOTSTRAP_H

#include <stddef.h>

#define BOOT_BLOB_MAX 4096

typedef struct {
  int rank, world, local_rank;
  char master_addr[256];
  int master_port;
  double timeout_s; /* MOEC_BOOT_TIMEOUT */
} boot_env;

/* Reads the environment. 0: not a multi-process run (WORLD_SIZE unset, or 1); 1: *e filled;
 * -1: a bad or missing value, said in err (naming the variable and its value). */
int boot_env_read(boot_env *e, char *err, size_t errlen);

/* Connects the mesh: fds (world entries) gets a stream socket to every other rank (fds[rank]
 * = -1). Rank 0 sends blob (blob_len <= BOOT_BLOB_MAX); every rank gets it in blob_out
 * (BOOT_BLOB_MAX bytes) and its length in *blob_out_len. 0, or -1 with the reason in err
 * (nothing left open). */
int boot_mesh(const boot_env *e, const void *blob, size_t blob_len, void *blob_out, size_t *blob_out_len, int *fds,
              char *err, size_t errlen);

#endif
