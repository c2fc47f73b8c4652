/* launch.h -- moec as one process of a world of ranks (torchrun's variables), and `moec launch`. */
#ifndef MOEC_LAUNCH_H
#define MOEC_LAUNCH_H

#include <stdint.h>

struct comm_world;

/* For moec train: 0 when this is not a multi-process run (WORLD_SIZE unset or 1); 1 when it is;
 * -1 after printing an error (a bad RANK, WORLD_SIZE, MASTER_ADDR, ...). */
int launch_train_check(void);
/* After launch_train_check returned 1: LOCAL_RANK, and LOCAL_WORLD_SIZE (0 when unset). With
 * --device cuda the rank trains on GPU LOCAL_RANK (mod the GPUs visible). */
void launch_local(int *local_rank, int *local_world);

/* Joins the world (after launch_train_check returned 1): WORLD_SIZE must be ep x dp; connects
 * the TCP mesh. NULL after printing an error. */
struct comm_world *launch_train_join(int64_t ep, int64_t dp, int *rank);

/* moec launch -n N [--master-port P] [--] CMD ARGS... */
int cmd_launch(int argc, char **argv);

#endif
