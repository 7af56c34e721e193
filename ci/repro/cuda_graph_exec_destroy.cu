// A libcuda crash with plain CUDA: graph execs of one graph destroyed on several threads.
// Found by unirt's conformance case capture::graph_objects_used_from_several_threads on an H200
// (driver 580.159, CUDA 13.0); the reason unirt's CUDA backend orders graph calls per family
// (vendors/cuda/graph.rs, GraphFamily). Re-check on a new driver:
//
//   nvcc -O2 -o repro ci/repro/cuda_graph_exec_destroy.cu -lpthread
//   for v in 0 3 4 5 6 7 8 9 10 2; do ./repro $v 100; done
//
// argv[1] = variant (see the comments in main), argv[2] = rounds (default 40). A crash prints
// the crashing thread's last call. Seen there: 0, 4 and 5 crash (4: 3 of 3 runs of 100 rounds);
// 2, 3, 6, 7, 8, 9 and 10 do not (3 runs each).
#include <cuda_runtime.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define CK(x) do { cudaError_t r_ = (x); if (r_ != cudaSuccess) { fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(r_)); exit(2); } } while (0)
__global__ void fill(float *p, float v, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = v; }
static cudaGraph_t g; static cudaGraphExec_t x; static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int variant; static cudaStream_t shared_stream;
static __thread int stage; static __thread int is_main;
static const char *names[] = {"-", "instantiate mine", "launch x", "launch mine", "sync", "destroy mine", "destroy worker stream", "7", "8", "9", "destroy x", "destroy g", "destroy capture stream", "device sync", "launch x (main)", "sync (main)"};
static void on_segv(int sig) { char b[128]; int n = snprintf(b, sizeof b, "SIGSEGV in %s thread at stage: %s\n", is_main ? "main" : "worker", names[stage]); write(2, b, n); _exit(139); }
static void *own_graph_worker(void *arg) {
  // variant 10: a graph of its own, captured and used by this thread alone, nothing serialised
  cudaStream_t t; CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking)); float *p; CK(cudaMalloc(&p, 4 * 4096));
  cudaGraph_t gi; CK(cudaStreamBeginCapture(t, cudaStreamCaptureModeThreadLocal)); fill<<<16, 256, 0, t>>>(p, 1.0f, 4096); CK(cudaStreamEndCapture(t, &gi));
  for (int k = 0; k < 50; k++) {
    cudaGraphExec_t mine; stage = 1; CK(cudaGraphInstantiate(&mine, gi, 0)); stage = 3; CK(cudaGraphLaunch(mine, t));
    stage = 4; CK(cudaStreamSynchronize(t)); stage = 5; CK(cudaGraphExecDestroy(mine));
  }
  stage = 11; CK(cudaGraphDestroy(gi)); stage = 6; CK(cudaStreamDestroy(t)); CK(cudaFree(p)); stage = 0; return 0;
}
static void *worker(void *arg) {
  if (variant == 10) return own_graph_worker(arg);
  cudaStream_t t;
  if (variant == 7) t = shared_stream; else CK(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking));
  for (int k = 0; k < 50; k++) {
    cudaGraphExec_t mine = 0;
    int v4 = variant == 4 || variant == 8 || variant == 9;
    if (variant != 3 && variant != 7) { stage = 1; pthread_mutex_lock(&mu); CK(cudaGraphInstantiate(&mine, g, 0)); pthread_mutex_unlock(&mu); }
    if (!v4) { stage = 2; pthread_mutex_lock(&mu); CK(cudaGraphLaunch(x, t)); pthread_mutex_unlock(&mu); }
    if (mine) { stage = 3; if (variant == 9) pthread_mutex_lock(&mu); CK(cudaGraphLaunch(mine, t)); if (variant == 9) pthread_mutex_unlock(&mu); }
    stage = 4; CK(cudaStreamSynchronize(t));
    if (mine) { stage = 5; if (variant >= 8) pthread_mutex_lock(&mu); CK(cudaGraphExecDestroy(mine)); if (variant >= 8) pthread_mutex_unlock(&mu); }
  }
  stage = 6; if (variant != 7) CK(cudaStreamDestroy(t));
  stage = 0; return 0;
}
int main(int argc, char **argv) {
  variant = atoi(argv[1]); is_main = 1; signal(SIGSEGV, on_segv);
  // 0: 4 threads, each its own stream: instantiate its own exec, launch x and its own, sync, destroy its own
  // 3: as 0, x only   4: as 0, own execs only (x never launched)   5: as 0 + device sync before destroying x
  // 6: main thread alone launches x on 4 streams in turn   7: 4 threads launch x on one shared stream
  // 2: one worker thread as 0   8: as 4, each destroy serialised with the instantiations
  // 9: as 8, launches serialised too   10: each thread a graph of its own, nothing serialised
  float *a; CK(cudaMalloc(&a, 4 * 4096));
  int rounds = argc > 2 ? atoi(argv[2]) : 40;
  for (int round = 0; round < rounds; round++) {
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fill<<<16, 256, 0, s>>>(a, 3.25f, 4096);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    if (variant == 7) CK(cudaStreamCreateWithFlags(&shared_stream, cudaStreamNonBlocking));
    if (variant == 6) {
      cudaStream_t ss[4]; for (int i = 0; i < 4; i++) CK(cudaStreamCreateWithFlags(&ss[i], cudaStreamNonBlocking));
      for (int k = 0; k < 200; k++) { stage = 14; CK(cudaGraphLaunch(x, ss[k % 4])); stage = 15; CK(cudaStreamSynchronize(ss[k % 4])); }
      for (int i = 0; i < 4; i++) CK(cudaStreamDestroy(ss[i]));
    } else {
      int threads = variant == 2 ? 1 : 4;
      pthread_t th[4]; for (long i = 0; i < threads; i++) pthread_create(&th[i], 0, worker, (void *)i);
      for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    }
    if (variant == 5) { stage = 13; CK(cudaDeviceSynchronize()); }
    stage = 10; CK(cudaGraphExecDestroy(x)); stage = 11; CK(cudaGraphDestroy(g));
    if (variant == 7) CK(cudaStreamDestroy(shared_stream));
    stage = 12; CK(cudaStreamDestroy(s)); stage = 0;
  }
  printf("variant %d: %d rounds, no crash\n", variant, rounds); return 0;
}
