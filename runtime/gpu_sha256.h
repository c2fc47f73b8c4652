/* gpu_sha256.h -- SHA-256 (FIPS 180-4), the kernel cache's key. */
#ifndef MOEC_GPU_SHA256_H
#define MOEC_GPU_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  uint32_t h[8];
  uint64_t len;      /* bytes hashed so far */
  uint8_t buf[64];
  size_t n;          /* bytes waiting in buf */
} gpu_sha256;

void gpu_sha256_init(gpu_sha256 *s);
void gpu_sha256_update(gpu_sha256 *s, const void *data, size_t n);
void gpu_sha256_hex(gpu_sha256 *s, char hex[65]); /* finishes; hex is NUL-terminated */

#endif
