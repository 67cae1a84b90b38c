/* zicoum: a GPU memory manager for deep-learning training.
 *
 * This is the C API of libzicoum. The same library also answers, unchanged,
 * to CUDA programs through LD_PRELOAD (cudaMalloc, cudaFree, cudaMallocAsync,
 * cudaFreeAsync, cudaMemGetInfo, cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2)
 * and to PyTorch through its pluggable-allocator ABI (zico_torch_malloc and
 * zico_torch_free below).
 *
 * Configuration comes from ZICO_* environment variables, read once on first
 * use (see README.md). Memory on each device is capped by ZICO_BUDGET: an
 * allocation that would map more physical memory than the budget fails with
 * ZICO_ERROR_OUT_OF_MEMORY and nothing else changes.
 *
 * Thread-safety: every function may be called from any thread.
 * Streams: a stream is a cudaStream_t (or CUstream) passed as void*; NULL is
 * the legacy default stream. Memory freed on a stream is reused on that
 * stream at once, and on other streams only after the GPU has finished the
 * work enqueued before the free.
 * No function throws (except zico_torch_malloc, see below), exits, or
 * prints to stdout.
 */
#ifndef ZICOUM_ZICOUM_H_
#define ZICOUM_ZICOUM_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ZICO_API __attribute__((visibility("default")))
#else
#define ZICO_API
#endif

typedef enum zico_status {
  ZICO_OK = 0,
  ZICO_ERROR_OUT_OF_MEMORY = 1,   /* the budget (or the device) is full */
  ZICO_ERROR_INVALID_VALUE = 2,   /* bad pointer, size, device or argument */
  ZICO_ERROR_CONFIG = 3,          /* a ZICO_* variable is malformed (see stderr) */
  ZICO_ERROR_NO_DEVICE = 4,       /* no driver or no such device */
  ZICO_ERROR_NOT_SUPPORTED = 5,
  ZICO_ERROR_DRIVER = 6,          /* the CUDA driver reported an error */
  ZICO_ERROR_INTERNAL = 7,
  ZICO_ERROR_SUSPENDED = 8        /* the device's memory is evicted until zico_resume() */
} zico_status_t;

/* A static, human-readable description of `status`. Never NULL. */
ZICO_API const char* zico_status_string(zico_status_t status);

/* Details of the last failure on the calling thread (e.g. which variable was
 * malformed, or how much of the budget was in use). Never NULL; empty when
 * nothing failed yet. Valid until the thread's next zicoum call. */
ZICO_API const char* zico_last_error(void);

/* Reads the configuration and opens the driver. Optional: every other call
 * initializes on first use. Returns ZICO_ERROR_CONFIG for a bad variable. */
ZICO_API zico_status_t zico_init(void);

/* Allocates `size` bytes (256-byte aligned) of device memory on `device`,
 * usable by work on `stream`. size 0 yields NULL and ZICO_OK. */
ZICO_API zico_status_t zico_malloc(void** ptr, size_t size, int device, void* stream);

/* Frees memory from zico_malloc. `stream` is the stream of the last use: the
 * memory is reused on it at once and elsewhere after a fence. NULL is a no-op. */
ZICO_API zico_status_t zico_free(void* ptr, void* stream);

/* Work queued on `stream` uses `ptr` (from zico_malloc, allocated for
 * another stream): once freed, the memory is not reused before that work is
 * done, as with PyTorch's Tensor.record_stream. ZICO_ERROR_INVALID_VALUE if
 * `ptr` is not the start of a live allocation or `stream` is
 * cudaStreamPerThread (pass the stream's own handle). */
ZICO_API zico_status_t zico_record_stream(void* ptr, void* stream);

/* Counters for one device. `struct_size` must be set to sizeof(zico_stats_t)
 * by the caller, so fields can be added without breaking old callers. */
typedef struct zico_stats {
  size_t struct_size;
  uint64_t budget_bytes;        /* cap on mapped bytes (under zico-umd: the most the daemon could lend) */
  uint64_t allocated_bytes;     /* bytes in live allocations (rounded sizes) */
  uint64_t peak_allocated_bytes;
  uint64_t mapped_bytes;        /* physical memory held: allocated + cached */
  uint64_t peak_mapped_bytes;
  uint64_t allocations;         /* successful allocations so far */
  uint64_t frees;
  uint64_t failed_allocations;  /* out-of-memory results */
  uint64_t chunk_maps;          /* physical chunks mapped so far */
  uint64_t chunk_unmaps;
  uint64_t iterations;          /* zico_mark_iteration() calls */
  uint64_t last_iteration_peak_bytes; /* peak allocated during the last full iteration */
  /* UM mode (ZICO_MODE=um); zero otherwise. */
  uint64_t resident_bytes;      /* the job's pages on the GPU now (at most the budget) */
  uint64_t peak_resident_bytes;
  uint64_t faulted_pages;       /* absent when a kernel used them: faulted in by the driver */
  uint64_t prefetched_pages;    /* brought to the GPU ahead of use */
  uint64_t evicted_pages;       /* sent to host memory (planned, to make room, or for a smaller budget) */
  uint64_t modelled_ns;         /* simulated backend: the device's modelled clock; 0 on a GPU */
  /* Memory the process made itself with the driver's cuMemCreate (PyTorch's
   * expandable segments, NCCL) under LD_PRELOAD; with ZICO_BUDGET set and no
   * zico-umd it counts against the budget (budget_bytes is then what is left
   * for zicoum's own allocations). */
  uint64_t outside_bytes;
  /* UM mode: kernel launches zicoum observed in this process (every device),
   * and how many of them it found no zicoum memory in the parameters of. A
   * job whose kernels go unseen (launched by a route LD_PRELOAD does not
   * reach) pages only by the driver's faults: kernels stays 0. */
  uint64_t kernels;
  uint64_t kernels_without_blocks;
  /* UM mode with fault reports (ZICO_FAULT_REPORTS=on and CUPTI, or the
   * simulated backend): pages kernels faulted in that their parameters did
   * not point to (each is then named for its kernel's place in the
   * iteration: learnt_pages now), and pages that arrived on the GPU unasked
   * while zicoum counted them elsewhere (then counted within the budget). */
  uint64_t unnamed_faults;
  uint64_t learnt_pages;
  uint64_t unasked_arrivals;
  /* UM mode: one-dimensional copies and memsets (cudaMemcpy[Async],
   * cudaMemset[Async], the driver's cuMemcpy* and cuMemsetD*; not 2D/3D or
   * peer copies, nor the driver's per-thread-stream twins) that touched
   * zicoum memory, announced to the pager like kernels (every device). */
  uint64_t copies;
  /* UM mode: the most a kernel had the driver bring to the GPU beyond the
   * job's budget of the moment (it used more pages than the budget, or, under
   * zico-umd, than it was lent and could get lent): 0 while the budget held. */
  uint64_t peak_over_budget_bytes;
} zico_stats_t;

ZICO_API zico_status_t zico_get_stats(int device, zico_stats_t* stats);

/* The peaks of zico_get_stats start again from the current values. */
ZICO_API zico_status_t zico_reset_peak_stats(int device);

/* What `device` offers this job, as cudaMemGetInfo answers under zicoum:
 * *total_bytes is the budget in whole chunks (what can be allocated; UM mode:
 * the arena), *free_bytes that less its allocations,
 * also capped by what the device really has free. */
ZICO_API zico_status_t zico_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

/* Marks an iteration boundary of the training loop (call at the start of
 * each iteration). Lets zicoum learn the job's memory cycle. */
ZICO_API zico_status_t zico_mark_iteration(void);

/* UM mode: the work the caller is about to launch (one op: one or more
 * kernels) uses the blocks `ptrs` point into (any offset; blocks of one
 * device). The pager brings what the op needs and makes room for it before
 * this returns; `op_id` identifies the op across iterations (e.g. a hash of
 * its name and arguments), `expected_ns` is how long it computes if known (0:
 * unknown; the simulated backend runs it for that long). Pointers zicoum did
 * not allocate are ignored. In VMM mode: ZICO_OK, nothing done.
 * ZICO_ERROR_OUT_OF_MEMORY: nothing to end; with ZICO_UM_MEMORY=swap and
 * zico_last_error() saying so, a page the op uses could not be mapped on the
 * GPU (another process holds its memory): do not launch the op (it would
 * read unmapped memory). */
ZICO_API zico_status_t zico_op_begin(uint64_t op_id, const void* const* ptrs, size_t count, uint64_t expected_ns);

/* The op of the last zico_op_begin() on this thread was launched (on the
 * simulated backend: it runs now, on the modelled clock). Ops are announced
 * one at a time per device: between a thread's zico_op_begin() and its
 * zico_op_end(), another thread's op (or UM-mode kernel launch, copy or
 * memset) on that device waits, so end every op you begin. A second
 * zico_op_begin() on the same thread, or the thread's end, ends the first
 * without running it. */
ZICO_API zico_status_t zico_op_end(void);

/* Returns cached, unused physical memory on `device` to the driver. */
ZICO_API zico_status_t zico_empty_cache(int device);

/* Where zico_suspend() puts a device's memory. */
typedef enum zico_store {
  ZICO_STORE_HOST = 0,  /* pinned host memory on the GPU's NUMA node */
  ZICO_STORE_NVME = 1   /* a file under ZICO_SWAP_DIR, through io_uring */
} zico_store_t;

/* Suspends the calling job's use of `device` (like vLLM's sleep mode): waits
 * for all GPU work, then saves every allocation's contents to `store` and
 * releases all of the device's memory to the driver. Pointers stay valid as
 * numbers but must not be used until zico_resume(); allocations fail with
 * ZICO_ERROR_SUSPENDED meanwhile. No other thread may launch GPU work on this
 * memory while suspended. On failure nothing changed (or, if even undoing
 * failed, zico_resume() finishes the job; zico_last_error() says which). */
ZICO_API zico_status_t zico_suspend(int device, zico_store_t store);

/* Maps the memory back at the same addresses and restores its contents.
 * A no-op if the device is not suspended; may be retried after a failure. */
ZICO_API zico_status_t zico_resume(int device);

/* Parses "512MiB", "40GiB", "1.5GB" (see README). ZICO_ERROR_INVALID_VALUE
 * and *bytes untouched if `text` is not a size. */
ZICO_API zico_status_t zico_parse_size(const char* text, uint64_t* bytes);

/* PyTorch CUDAPluggableAllocator ABI, for torch.cuda.memory.CUDAPluggableAllocator.
 * PyTorch does not check malloc's result for NULL, so zico_torch_malloc reports
 * failure by throwing a C++ exception (std::bad_alloc on out-of-memory, with a
 * message starting "CUDA out of memory."), which PyTorch raises as a Python
 * RuntimeError. Call it only from C++ that expects exceptions. size 0 returns
 * NULL. zico_torch_free logs errors to stderr. */
ZICO_API void* zico_torch_malloc(ssize_t size, int device, void* stream);
ZICO_API void zico_torch_free(void* ptr, ssize_t size, int device, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* ZICOUM_ZICOUM_H_ */
