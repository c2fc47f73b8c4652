/* emu_driver.cpp -- a CPU stand-in for libcuda.so.1, enough of the driver API for moec's
 * runtime (runtime/gpu_loader.c) to run the generated kernels on the host, so that
 * test_gpu_kernels runs where there is no GPU: MOEC_LIBCUDA=.../libcuda_emu.so.
 *
 * "Device" memory is host memory. cuModuleLoadData finds the module's name in the cubin
 * (the moec_module string every generated module carries) and loads the same source built
 * for the host (libemu_<module>.so, beside this library; attention's module, which has no
 * such string, by a kernel name); cuModuleGetFunction returns its emu_<kernel> trampoline.
 * emu_cublaslt.cpp stands in for cuBLASLt on the same memory. A launch runs each block's
 * threads as coroutines (fibers kept between blocks),
 * switching at __syncthreads and warp collectives; a barrier that some live threads never
 * reach is reported as a deadlock. Stream operations run at once, in order.
 *
 * What it does not model: memory ordering, warp divergence (lanes that skip a collective),
 * timing, shared-memory limits, and device math (host expf/exp/log are used).
 * Development tool only: scripts/cuda_emu/run.sh builds it. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <map>
#include <mutex>
#include <string>
#include <ucontext.h>
#include <vector>

#include "emu_cuda.h"

typedef int CUresult;
enum { OK = 0, E_INVALID_VALUE = 1, E_OOM = 2, E_NOT_FOUND = 500, E_LAUNCH_FAILED = 719 };

extern "C" {
emu_uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
}

/* ---- the scheduler ---- */
/* Each thread slot is a fiber (a ucontext on its own stack) made once and kept: it runs the
 * current kernel for its thread of the current block, then waits to run it again for the next
 * block or launch. It is entered the first time through its ucontext; later switches, to it
 * and back, use _setjmp/_longjmp, which unlike swapcontext save no signal mask (two system
 * calls per switch were the emulated step's main cost). AddressSanitizer builds keep
 * swapcontext, whose stack switches it understands. */
#if defined(__SANITIZE_ADDRESS__)
#define EMU_FAST_SWITCH 0
#else
#define EMU_FAST_SWITCH 1
#endif
namespace {
enum { RUN, AT_BLOCK, AT_WARP, DONE };
struct Thread {
  ucontext_t ctx;
  jmp_buf jb;
  int state, started;
};
const unsigned MAX_THREADS = 1024;
Thread threads[MAX_THREADS]; /* never moved: a ucontext points into itself */
unsigned nthr, made;         /* threads of the running block; fibers made */
std::vector<char *> stacks;
const size_t STACK = 256 * 1024;
ucontext_t sched_ctx;
jmp_buf sched_jb;
int cur = -1;
uint64_t slots[MAX_THREADS];
void (*cur_fn)(void **);
void **cur_args;

void to_scheduler() {
#if EMU_FAST_SWITCH
  if (!_setjmp(threads[cur].jb)) _longjmp(sched_jb, 1);
#else
  swapcontext(&threads[cur].ctx, &sched_ctx);
#endif
}

void fiber_main() {
  for (;;) {
    cur_fn(cur_args);
    threads[cur].state = DONE;
    to_scheduler(); /* resumed for the next block: cur is this fiber again */
  }
}

void make_fiber(unsigned t) {
  while (stacks.size() <= t) stacks.push_back((char *)malloc(STACK));
  getcontext(&threads[t].ctx);
  threads[t].ctx.uc_stack.ss_sp = stacks[t];
  threads[t].ctx.uc_stack.ss_size = STACK;
  threads[t].ctx.uc_link = &sched_ctx;
  makecontext(&threads[t].ctx, fiber_main, 0);
  threads[t].started = 0;
}

void yield_as(int state) {
  threads[cur].state = state;
  to_scheduler();
}

/* Runs thread t until it yields or ends. */
void resume(unsigned t) {
#if EMU_FAST_SWITCH
  if (!_setjmp(sched_jb)) {
    if (!threads[t].started) {
      threads[t].started = 1;
      setcontext(&threads[t].ctx);
    }
    _longjmp(threads[t].jb, 1);
  }
#else
  swapcontext(&sched_ctx, &threads[t].ctx);
#endif
}

/* Runs one block to completion; false on a deadlock. */
bool run_block(unsigned nthreads) {
  while (made < nthreads) make_fiber(made++);
  nthr = nthreads;
  for (unsigned t = 0; t < nthreads; t++) threads[t].state = RUN;
  for (;;) {
    bool progress = false, live = false;
    for (unsigned t = 0; t < nthreads; t++) {
      if (threads[t].state != RUN) continue;
      cur = (int)t;
      emu_threadIdx = {t, 0, 0};
      resume(t);
      progress = true;
    }
    /* release warp barriers whose live lanes have all arrived */
    for (unsigned w0 = 0; w0 < nthreads; w0 += 32) {
      bool all = true, any = false;
      for (unsigned t = w0; t < w0 + 32 && t < nthreads; t++) {
        if (threads[t].state == DONE) continue;
        if (threads[t].state != AT_WARP) all = false;
        else any = true;
      }
      if (all && any) {
        for (unsigned t = w0; t < w0 + 32 && t < nthreads; t++)
          if (threads[t].state == AT_WARP) threads[t].state = RUN;
        progress = true;
      }
    }
    /* release the block barrier when every live thread waits at it */
    bool all = true, any = false;
    for (unsigned t = 0; t < nthreads; t++) {
      if (threads[t].state == DONE) continue;
      live = true;
      if (threads[t].state != AT_BLOCK) all = false;
      else any = true;
    }
    if (all && any) {
      for (unsigned t = 0; t < nthreads; t++)
        if (threads[t].state == AT_BLOCK) threads[t].state = RUN;
      progress = true;
    }
    if (!live) return true;
    if (!progress) {
      for (unsigned t = 0; t < nthreads; t++) /* stuck mid-kernel: fresh fibers for the next launch */
        if (threads[t].state != DONE) make_fiber(t);
      return false;
    }
  }
}
} // namespace

extern "C" void emu_syncthreads(void) { yield_as(AT_BLOCK); }

extern "C" void emu_warp_exchange(uint64_t mine, uint64_t *all) {
  const unsigned t = (unsigned)cur, w0 = t & ~31u;
  slots[t] = mine;
  yield_as(AT_WARP); /* every live lane has written */
  for (unsigned l = 0; l < 32; l++) all[l] = w0 + l < nthr ? slots[w0 + l] : 0;
  yield_as(AT_WARP); /* every live lane has read: the slots may be reused */
  emu_threadIdx = {t, 0, 0};
}

/* ---- the driver API ---- */
typedef unsigned long long CUdeviceptr;
namespace {
struct Module {
  void *so;
};
size_t held;
std::map<uintptr_t, size_t> sizes; /* live "device" allocations, by address */
const size_t TOTAL = (size_t)16 << 30;
std::string emu_dir() {
  Dl_info info;
  dladdr((void *)&emu_dir, &info);
  std::string p = info.dli_fname;
  return p.substr(0, p.find_last_of('/'));
}
/* The bytes of a module image: an ELF cubin's extent from its header, else (PTX) its text. */
size_t image_bytes(const char *p) {
  if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2) return strlen(p);
  uint64_t shoff, phoff;
  uint16_t phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, p + 32, 8), memcpy(&shoff, p + 40, 8);
  memcpy(&phentsize, p + 54, 2), memcpy(&phnum, p + 56, 2), memcpy(&shentsize, p + 58, 2), memcpy(&shnum, p + 60, 2);
  size_t end = (size_t)shoff + (size_t)shnum * shentsize, pend = (size_t)phoff + (size_t)phnum * phentsize;
  if (pend > end) end = pend;
  /* the sections themselves, should the headers not come last */
  for (uint16_t i = 0; i < shnum; i++) {
    const char *sh = p + shoff + (size_t)i * shentsize;
    uint32_t type;
    uint64_t off, size;
    memcpy(&type, sh + 4, 4), memcpy(&off, sh + 24, 8), memcpy(&size, sh + 32, 8);
    if (type != 8 /* SHT_NOBITS */ && off + size > end) end = (size_t)(off + size);
  }
  return end;
}
} // namespace

/* One lock for the shared state (the fibers, the launch's globals, the allocation table):
 * ranks as threads of one process launch at once, and their launches run one at a time. */
std::recursive_mutex emu_mu;

extern "C" {
void emu_lock(void) { emu_mu.lock(); } /* emu_cublaslt.cpp holds it over a matmul */
void emu_unlock(void) { emu_mu.unlock(); }
/* 1 when [p, p + bytes) lies within one live allocation (emu_cublaslt.cpp checks operands). */
int emu_mem_check(const void *p, size_t bytes) {
  std::lock_guard<std::recursive_mutex> lk(emu_mu);
  auto it = sizes.upper_bound((uintptr_t)p);
  if (it == sizes.begin()) return 0;
  --it;
  return (uintptr_t)p + bytes <= it->first + it->second;
}
CUresult cuInit(unsigned) { return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(int *d, int o) { *d = o; return o == 0 ? OK : 101; }
CUresult cuDeviceGetName(char *name, int len, int) { snprintf(name, (size_t)len, "moec CUDA emulator (CPU)"); return OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int) {
  switch (attr) {
  case 75: *v = 9; break;        /* compute capability 9.0 */
  case 76: *v = 0; break;
  case 16: *v = 1; break;        /* multiprocessors */
  case 38: *v = 1 << 20; break;  /* L2 */
  case 97: *v = 227 * 1024; break;
  case 1: *v = 1024; break;
  default: *v = 0;
  }
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, int) { *b = TOTAL; return OK; }
CUresult cuDevicePrimaryCtxRetain(void **c, int) { *c = (void *)1; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int) { return OK; }
CUresult cuCtxSetCurrent(void *) { return OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = TOTAL - held; *t = TOTAL; return OK; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  std::lock_guard<std::recursive_mutex> lk(emu_mu);
  if (n > TOTAL - held) return E_OOM;
  /* exactly n bytes, 256-aligned, so that AddressSanitizer sees an overrun at byte n */
  void *m = NULL;
  if (posix_memalign(&m, 256, n ? n : 1) != 0) return E_OOM;
  memset(m, 0xA5, n); /* not zero: kernels must not rely on fresh memory */
  sizes[(uintptr_t)m] = n;
  held += n;
  *p = (CUdeviceptr)m;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  std::lock_guard<std::recursive_mutex> lk(emu_mu);
  auto it = sizes.find((uintptr_t)p);
  if (it == sizes.end()) return p ? E_INVALID_VALUE : OK;
  held -= it->second;
  sizes.erase(it);
  free((void *)p);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *) { memcpy((void *)d, s, n); return OK; }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *) { memcpy(d, (void *)s, n); return OK; }
CUresult cuMemAllocHost_v2(void **p, size_t n) { return (*p = malloc(n ? n : 1)) ? OK : E_OOM; }
CUresult cuMemFreeHost(void *p) {
  free(p);
  return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void *) { memmove((void *)d, (void *)s, n); return OK; }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, void *) { memset((void *)d, v, n); return OK; }
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void *) {
  for (size_t i = 0; i < n; i++) memcpy((char *)d + 4 * i, &v, 4);
  return OK;
}
CUresult cuStreamCreate(void **s, unsigned) { *s = (void *)1; return OK; }
CUresult cuStreamDestroy_v2(void *) { return OK; }
CUresult cuStreamSynchronize(void *) { return OK; }
CUresult cuStreamWaitEvent(void *, void *, unsigned) { return OK; } // one timeline: work runs as it is queued
CUresult cuModuleLoadData(void **m, const void *image) {
  /* The module's name: the moec_module string every generated module carries, else (NVRTC
     modules with sources of their own) a kernel name it is known by; the same source built
     for the host is libemu_<name>.so (gen_sources.c writes both kinds). */
  static const char *const known[][2] = {{"attn_softmax_fwd_f32", "attention"}};
  const char *p = (const char *)image, *key = "moec-module:";
  size_t n = image_bytes(p);
  std::string name;
  for (size_t i = 0; i + 12 < n && name.empty(); i++)
    if (p[i] == 'm' && memcmp(p + i, key, 12) == 0) name = std::string(p + i + 12, strnlen(p + i + 12, n - i - 12));
  for (size_t k = 0; k < sizeof known / sizeof known[0] && name.empty(); k++)
    if (memmem(p, n, known[k][0], strlen(known[k][0]) + 1)) name = known[k][1];
  if (name.empty()) {
    fprintf(stderr, "emu: a module the emulator does not know (no moec_module string, no known kernel)\n");
    return 200; /* CUDA_ERROR_INVALID_IMAGE */
  }
  std::string path = emu_dir() + "/libemu_" + name + ".so";
  void *so = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!so) {
    fprintf(stderr, "emu: %s\n", dlerror());
    return E_NOT_FOUND;
  }
  *m = new Module{so};
  return OK;
}
CUresult cuModuleUnload(void *m) { delete (Module *)m; return OK; }
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  std::string sym = std::string("emu_") + name;
  *f = dlsym(((Module *)m)->so, sym.c_str());
  return *f ? OK : E_NOT_FOUND;
}
CUresult cuFuncSetAttribute(void *, int, int) { return OK; }
CUresult cuFuncGetAttribute(int *v, int, void *) { // host code: no registers to report
  *v = 0;
  return OK;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned,
                        void *, void **args, void **) {
  if (by != 1 || bz != 1 || gz == 0 || bx == 0 || bx > 1024 || bx % 32 != 0) return E_INVALID_VALUE;
  std::lock_guard<std::recursive_mutex> lk(emu_mu);
  cur_fn = (void (*)(void **))f;
  cur_args = args;
  emu_blockDim = {bx, 1, 1};
  emu_gridDim = {gx, gy, gz};
  for (unsigned z = 0; z < gz; z++)
  for (unsigned y = 0; y < gy; y++)
    for (unsigned x = 0; x < gx; x++) {
      emu_blockIdx = {x, y, z};
      if (!run_block(bx)) {
        Dl_info info;
        dladdr(f, &info);
        fprintf(stderr, "emu: deadlock in %s, block (%u, %u): some threads never reach a barrier\n",
                info.dli_sname ? info.dli_sname : "?", x, y);
        return E_LAUNCH_FAILED;
      }
    }
  return OK;
}
CUresult cuEventCreate(void **e, unsigned) { *e = (void *)1; return OK; }
CUresult cuEventRecord(void *, void *) { return OK; }
CUresult cuEventSynchronize(void *) { return OK; }
CUresult cuEventQuery(void *) { return OK; }
CUresult cuEventElapsedTime_v2(float *ms, void *, void *) { *ms = 0; return OK; }
CUresult cuEventDestroy_v2(void *) { return OK; }
CUresult cuGetErrorName(CUresult r, const char **s) {
  *s = r == E_OOM ? "CUDA_ERROR_OUT_OF_MEMORY" : r == E_LAUNCH_FAILED ? "CUDA_ERROR_LAUNCH_FAILED" : "CUDA_ERROR";
  return OK;
}
CUresult cuGetErrorString(CUresult r, const char **s) {
  *s = r == E_OOM ? "out of memory" : "emulator error";
  return OK;
}
}
