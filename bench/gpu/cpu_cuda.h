// CUDA on the CPU for the harnesses of the log-linear chunk kernels (gdn_backward_harness.cpp,
// lift_backward_harness.cpp): the kernel files compile as plain C++ after this header; each block
// runs as 256 std::threads with barriers for __syncthreads and per-warp exchanges for the shuffles;
// the tensor-core, bf16 and asynchronous-copy helpers are stand-ins that the FMA kernels never
// call (cp.async is an immediate copy). No GPU and no CUDA headers.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>
using std::exp;
using std::fma;
using std::min;
using std::max;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
struct Dim3 {
    int x = 0, y = 0, z = 0;
};
static Dim3 blockIdx, gridDim, blockDim;
thread_local Dim3 threadIdx;
static unsigned char g_dyn[256 << 10] __attribute__((aligned(16)));
static std::barrier<>* g_bar;
static std::barrier<>* g_warp[8];
static double g_x[8][32];
inline void __syncthreads() { g_bar->arrive_and_wait(); }
template <typename T> T lgb_exchange(T x, int src_of_lane_xor, bool up) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_x[w][l] = (double)x;
    g_warp[w]->arrive_and_wait();
    const int src = up ? l - src_of_lane_xor : (l ^ src_of_lane_xor);
    const T y = (up && src < 0) ? x : (T)g_x[w][src];
    g_warp[w]->arrive_and_wait();
    return y;
}
template <typename T> T __shfl_xor_sync(unsigned, T x, int o) { return lgb_exchange(x, o, false); }
template <typename T> T __shfl_up_sync(unsigned, T x, int o) { return lgb_exchange(x, o, true); }
inline long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }
inline float mx_exp(float x) { return expf(x); }
inline double mx_exp(double x) { return exp(x); }
// What loglinear_common.cuh's tensor-core and bf16 helpers name (not called here).
typedef unsigned short mx_bf16;
struct float4 {
    float x, y, z, w;
};
struct uint2 {
    unsigned x, y;
};
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline unsigned mx_tf32(float x) { return __float_as_uint(x); }
inline float mx_bf16_f32(mx_bf16 b) { return __uint_as_float((unsigned)b << 16); }
inline float4 mx_bf16x4_f32(uint2) { return {0, 0, 0, 0}; }
inline bool mx_aligned(const void*, unsigned) { return false; }
inline void mx_mma_tf32(float (&)[4], unsigned, unsigned, unsigned, unsigned, unsigned, unsigned) {}
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
// cp.async as a plain copy (the kernel file's commit and wait statements are removed by sed).
#define llc_cp_async llc_cp_async_device
#include "../../mixer-cuda/kernels/loglinear_common.cuh"
#undef llc_cp_async
inline void llc_cp_async(void* dst, const void* src, int bytes, int valid) {
    if (valid) std::memcpy(dst, src, bytes);
    else std::memset(dst, 0, bytes);
}
// Runs kernel(…) on a grid of (gx, gy, gz) blocks of 256 threads, one block at a time.
static void launch(int gx, int gy, int gz, const std::function<void()>& kernel) {
    gridDim = {gx, gy, gz};
    blockDim = {256, 1, 1};
    std::barrier<> bar(256);
    std::vector<std::barrier<>*> warps;
    for (int w = 0; w < 8; ++w) warps.push_back(new std::barrier<>(32));
    g_bar = &bar;
    for (int w = 0; w < 8; ++w) g_warp[w] = warps[w];
    for (int bz = 0; bz < gz; ++bz)
      for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            blockIdx = {bx, by, bz};
            std::vector<std::thread> ts;
            for (int t = 0; t < 256; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    kernel();
                });
            for (auto& t : ts) t.join();
        }
    for (auto* w : warps) delete w;
}

static void launch(int gx, int gy, const std::function<void()>& kernel) { launch(gx, gy, 1, kernel); }
