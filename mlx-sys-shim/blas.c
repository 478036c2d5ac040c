/* Which BLAS serves MLX's CPU matmuls.
 *
 * The Linux mlx-cpu wheel links libmlx against the reference netlib BLAS it bundles, which runs
 * f32 GEMM about 30x slower than an optimised one. When built with ZIMAGE_OPENBLAS, this file
 * defines the CBLAS GEMM entry points that libmlx imports and forwards them to OpenBLAS (the
 * scipy-openblas32 build, whose symbols carry a `scipy_` prefix). The executable exports these
 * definitions, and the dynamic linker searches the executable before libmlx's own dependencies,
 * so libmlx binds to them instead of the bundled library.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);

#ifdef ZIMAGE_OPENBLAS
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                       int);
void scipy_cblas_dgemm(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                       double*, int);
void scipy_cblas_cgemm(int, int, int, int, int, int, const void*, const void*, int, const void*, int,
                       const void*, void*, int);
void scipy_cblas_sgemm_batch_strided(int, int, int, int, int, int, float, const float*, int, int, const float*, int,
                                     int, float, float*, int, int, int);
char* scipy_openblas_get_config(void);
int scipy_openblas_get_num_threads(void);

/* OpenBLAS's parallel jobs on threads of ours.
 *
 * OpenBLAS's own workers spin for about 0.1 s after each job before they sleep (its
 * OPENBLAS_THREAD_TIMEOUT, read once when the library loads). The shim's kernels run their own
 * threads between products, so each product left a worker spinning on a core those threads
 * wanted: on two cores the VAE encoder spent a quarter of its samples in that spin. OpenBLAS
 * (0.3.27 on) hands its jobs to a caller's runner when one is installed; ours runs them on
 * workers that sleep on a condition variable once spin_ns pass without a job.
 *
 * A product's jobs wait on each other (each packs a share of B the others read), so all of
 * them must run at once: job 0 on the calling thread, job i on worker i − 1, and a thread of
 * its own for any job beyond the workers. One call at a time holds the workers. */
typedef void (*blas_job_fn)(int thread, void* job, int data);
typedef void (*blas_jobs_runner)(int sync, blas_job_fn run, int jobs, size_t job_size, void* job_data, int data);
void scipy_openblas_set_threads_callback_function(blas_jobs_runner runner);

enum { MAX_BLAS_WORKERS = 63 };

/* How long a worker, and a caller waiting for its workers, look for the next round before they
 * sleep: long enough to catch a product issued right after the last (a layer's products come
 * back to back, and a wake-up costs tens of microseconds), short enough to leave the core to
 * the kernels that run between products. */
static const long spin_ns = 50000;

/* Whether OpenBLAS hands its jobs to run_blas_jobs. */
static int runner_installed;

static struct {
  pthread_mutex_t call; /* held by the call that owns the workers */
  pthread_mutex_t lock; /* guards the condition variables' waits */
  pthread_cond_t start, done;
  atomic_ulong round;   /* bumped, after the fields below are set, to start the workers */
  atomic_int pending;   /* the workers yet to finish the round */
  int sleepers;         /* workers waiting on `start` (under `lock`) */
  int caller_sleeps;    /* the caller waits on `done` (under `lock`) */
  blas_job_fn run;
  char* jobs;
  size_t job_size;
  int data, count, workers;
} pool = {.call = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .start = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spins until `done()` holds or spin_ns pass; whether it holds. */
#define SPIN_UNTIL(done)                                  \
  ({                                                      \
    int holds_ = (done);                                  \
    for (long t0_ = now_ns(); !holds_ && now_ns() - t0_ < spin_ns; holds_ = (done)) \
      cpu_relax();                                        \
    holds_;                                               \
  })

static void* blas_worker(void* arg) {
  const int me = (int)(size_t)arg;
  unsigned long seen = 0;
  for (;;) {
    if (!SPIN_UNTIL(atomic_load(&pool.round) != seen)) {
      pthread_mutex_lock(&pool.lock);
      while (atomic_load(&pool.round) == seen) {
        pool.sleepers++;
        pthread_cond_wait(&pool.start, &pool.lock);
        pool.sleepers--;
      }
      pthread_mutex_unlock(&pool.lock);
    }
    seen = atomic_load(&pool.round);
    /* Every worker answers every round, those without a job too, so that the caller sets the
     * next round's fields only once no worker reads this one's. */
    if (me + 1 < pool.count) pool.run(me + 1, pool.jobs + (size_t)(me + 1) * pool.job_size, pool.data);
    if (atomic_fetch_sub(&pool.pending, 1) == 1) {
      pthread_mutex_lock(&pool.lock);
      if (pool.caller_sleeps) pthread_cond_signal(&pool.done);
      pthread_mutex_unlock(&pool.lock);
    }
  }
  return NULL;
}

struct extra_job {
  blas_job_fn run;
  void* job;
  int thread, data;
};

static void* run_extra_job(void* arg) {
  struct extra_job* e = arg;
  e->run(e->thread, e->job, e->data);
  return NULL;
}

static void run_blas_jobs(int sync, blas_job_fn run, int jobs, size_t job_size, void* job_data, int data) {
  (void)sync; /* OpenBLAS asks only for synchronous runs */
  if (jobs <= 0) return;
  pthread_mutex_lock(&pool.call);
  const int pooled = jobs - 1 < pool.workers ? jobs - 1 : pool.workers;
  pool.run = run;
  pool.jobs = job_data;
  pool.job_size = job_size;
  pool.data = data;
  pool.count = pooled + 1;
  atomic_store(&pool.pending, pool.workers);
  pthread_mutex_lock(&pool.lock);
  atomic_fetch_add(&pool.round, 1);
  if (pool.sleepers > 0) pthread_cond_broadcast(&pool.start);
  pthread_mutex_unlock(&pool.lock);
  /* More jobs than workers (OpenBLAS's thread count raised since start): threads of their own. */
  struct extra_job extra[MAX_BLAS_WORKERS];
  pthread_t threads[MAX_BLAS_WORKERS];
  int started = 0;
  for (int i = pooled + 1; i < jobs; ++i, ++started) {
    extra[started] = (struct extra_job){run, (char*)job_data + (size_t)i * job_size, i, data};
    /* A job left unstarted would keep the started ones waiting for it forever. */
    if (started == MAX_BLAS_WORKERS || pthread_create(&threads[started], NULL, run_extra_job, &extra[started]) != 0) {
      fprintf(stderr, "zimage: cannot start a thread for OpenBLAS's job %d of %d\n", i, jobs);
      abort();
    }
  }
  run(0, job_data, data);
  for (int i = 0; i < started; ++i) pthread_join(threads[i], NULL);
  if (!SPIN_UNTIL(atomic_load(&pool.pending) == 0)) {
    pthread_mutex_lock(&pool.lock);
    pool.caller_sleeps = 1;
    while (atomic_load(&pool.pending) > 0) pthread_cond_wait(&pool.done, &pool.lock);
    pool.caller_sleeps = 0;
    pthread_mutex_unlock(&pool.lock);
  }
  pthread_mutex_unlock(&pool.call);
}

/* Installs the runner once the workers are up, before main (and so before any product);
 * without workers, or with ZIMAGE_BLAS_THREADS=openblas, OpenBLAS keeps its own threads. */
__attribute__((constructor)) static void install_blas_jobs_runner(void) {
  const char* choice = getenv("ZIMAGE_BLAS_THREADS");
  if (choice != NULL && strcmp(choice, "openblas") == 0) return;
  int want = scipy_openblas_get_num_threads() - 1;
  if (want > MAX_BLAS_WORKERS) want = MAX_BLAS_WORKERS;
  for (int i = 0; i < want; ++i) {
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    const int failed = pthread_create(&thread, &attr, blas_worker, (void*)(size_t)i);
    pthread_attr_destroy(&attr);
    if (failed) break;
    pool.workers++;
  }
  if (pool.workers == want) {
    scipy_openblas_set_threads_callback_function(run_blas_jobs);
    runner_installed = 1;
  }
}

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  scipy_cblas_sgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_dgemm(int order, int ta, int tb, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  scipy_cblas_dgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void cblas_cgemm(int order, int ta, int tb, int m, int n, int k, const void* alpha, const void* a, int lda,
                 const void* b, int ldb, const void* beta, void* c, int ldc) {
  scipy_cblas_cgemm(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#endif

/* The library that the process-wide `cblas_sgemm` (the one libmlx binds to) lives in. */
static const char* sgemm_owner(void** fn) {
  *fn = dlsym(RTLD_DEFAULT, "cblas_sgemm");
  Dl_info info;
  if (*fn == NULL || dladdr(*fn, &info) == 0 || info.dli_fname == NULL) return NULL;
  return info.dli_fname;
}

const char* mlxs_blas_description(void) {
  /* One buffer per thread, so that two threads asking at once cannot tear each other's text. */
  static _Thread_local char text[512];
  void* fn = NULL;
  const char* owner = sgemm_owner(&fn);
  if (owner == NULL) {
    snprintf(text, sizeof text, "no cblas_sgemm in the process (MLX uses the platform BLAS)");
    return text;
  }
#ifdef ZIMAGE_OPENBLAS
  if (fn == (void*)&cblas_sgemm) {
    snprintf(text, sizeof text, "OpenBLAS (%s), its jobs on %s", scipy_openblas_get_config(),
             runner_installed ? "zimage's workers" : "its own threads");
    return text;
  }
#endif
  snprintf(text, sizeof text, "%s", owner);
  return text;
}

void* mlxs_sgemm_batch_strided_symbol(void) {
#ifdef ZIMAGE_OPENBLAS
  void* fn = NULL;
  sgemm_owner(&fn);
  if (fn == (void*)&cblas_sgemm) return (void*)&scipy_cblas_sgemm_batch_strided;
#endif
  return NULL;
}

void* mlxs_sgemm_symbol(void) {
  void* fn = NULL;
  sgemm_owner(&fn);
  return fn;
}

int mlxs_blas_sgemm(int m, int n, int k, const float* a, const float* b, float* c) {
  void* fn = NULL;
  sgemm_owner(&fn);
  if (fn == NULL) return 1;
  ((sgemm_fn)fn)(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
  return 0;
}
