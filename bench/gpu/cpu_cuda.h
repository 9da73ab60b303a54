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
// __shfl_sync: lane src's x (src taken mod 32, as on the device).
template <typename T> T __shfl_sync(unsigned, T x, int src) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    g_x[w][l] = (double)x;
    g_warp[w]->arrive_and_wait();
    const T y = (T)g_x[w][src & 31];
    g_warp[w]->arrive_and_wait();
    return y;
}
inline int __ffs(int x) { return __builtin_ffs(x); }
template <typename T> T __shfl_up_sync(unsigned, T x, int o) { return lgb_exchange(x, o, true); }
inline long long gtid() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }
// A harness's checks: each prints its error against its tolerance (NaN fails); harness_end()
// prints the tally and gives the exit status.
static int failures = 0;
static void check(const char* what, double err, double tol) {
    std::printf("%-78s error %.3e (tolerance %.0e)%s\n", what, err, tol, err <= tol ? "" : "  FAILED");
    if (!(err <= tol)) ++failures;
}
static int harness_end() {
    std::printf(failures ? "%d FAILED\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
inline float mx_exp(float x) { return expf(x); }
inline double mx_exp(double x) { return exp(x); }
// What loglinear_common.cuh's tensor-core and bf16 helpers name (not called here).
typedef unsigned short mx_bf16;
struct float4 {
    float x, y, z, w;
};
struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
// f32 rounded to tf32, to nearest with ties away (cvt.rna.tf32.f32 on finite values).
inline unsigned mx_tf32(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }
inline float mx_bf16_f32(mx_bf16 b) { return __uint_as_float((unsigned)b << 16); }
// f32 to bf16, nearest even (the device's cvt.rn.bf16.f32 on finite values).
inline mx_bf16 mx_f32_bf16(float x) {
    unsigned u = __float_as_uint(x);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (mx_bf16)(u >> 16);
}
inline unsigned mx_pack_bf16(float lo, float hi) { return mx_f32_bf16(lo) | (unsigned)mx_f32_bf16(hi) << 16; }
inline float4 mx_bf16x4_f32(uint2) { return {0, 0, 0, 0}; }
inline bool mx_aligned(const void*, unsigned) { return false; }
inline float __expf(float x) { return expf(x); }
// The tensor-core helpers of common.cuh, emulated per warp: every lane posts its registers, then
// each lane forms its own outputs from all of them (the fragment layouts of common.cuh), products
// summed in double and rounded to f32 once per instruction (the hardware's order differs: results
// agree to f32 rounding, not bit for bit).
static unsigned g_wx[8][32][8];
template <typename F> inline void warp_round(const unsigned* post, int n, F each) {
    const int w = threadIdx.x / 32, l = threadIdx.x % 32;
    for (int i = 0; i < n; ++i) g_wx[w][l][i] = post[i];
    g_warp[w]->arrive_and_wait();
    each(g_wx[w], l);
    g_warp[w]->arrive_and_wait();
}
inline float tf32_bits(unsigned u) { return __uint_as_float(u & 0xffffe000u); }
inline float bf16_half(unsigned u, int hi) { return __uint_as_float(hi ? (u & 0xffff0000u) : (u << 16)); }
// c += A·B for one m16n8kK instruction: each lane's four outputs (rows g, g + 8; columns 2i, 2i + 1)
// from every lane's posted a0..a3, b0, b1, read through a_of(x, m, k) and b_of(x, k, n).
template <int K, typename FA, typename FB>
inline void mma_emulated(float (&c)[4], const unsigned (&post)[6], FA a_of, FB b_of) {
    float out[4];
    warp_round(post, 6, [&](unsigned (*x)[8], int l) {
        const int g = l / 4, i = l % 4;
        for (int u = 0; u < 4; ++u) {
            const int m = g + (u >= 2 ? 8 : 0), n = 2 * i + (u & 1);
            double acc = c[u];
            for (int k = 0; k < K; ++k) acc += (double)a_of(x, m, k) * (double)b_of(x, k, n);
            out[u] = (float)acc;
        }
    });
    for (int u = 0; u < 4; ++u) c[u] = out[u];
}
// m16n8k8 tf32: a = A[g][i], A[g+8][i], A[g][i+4], A[g+8][i+4]; b = B[i][g], B[i+4][g].
inline void mx_mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    mma_emulated<8>(
        c, {a0, a1, a2, a3, b0, b1},
        [](unsigned (*x)[8], int m, int k) { return tf32_bits(x[(m % 8) * 4 + k % 4][(m >= 8) + 2 * (k >= 4)]); },
        [](unsigned (*x)[8], int k, int n) { return tf32_bits(x[n * 4 + k % 4][4 + (k >= 4)]); });
}
// m16n8k16 bf16: a = A[g][2i..2i+1], A[g+8][2i..], A[g][2i+8..], A[g+8][2i+8..]; b = B[2i..2i+1][g],
// B[2i+8..2i+9][g]; the lower k in the low half.
inline void mx_mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    mma_emulated<16>(
        c, {a0, a1, a2, a3, b0, b1},
        [](unsigned (*x)[8], int m, int k) {
            return bf16_half(x[(m % 8) * 4 + (k % 8) / 2][(m >= 8) + 2 * (k >= 8)], k % 2);
        },
        [](unsigned (*x)[8], int k, int n) { return bf16_half(x[n * 4 + (k % 8) / 2][4 + (k >= 8)], k % 2); });
}
inline unsigned mx_pack_bf16(float lo, float hi);
// Shared-window addresses as offsets from g_dyn (static storage lies within ±2 GiB of it).
inline unsigned smem_u32(const void* p) { return (unsigned)((const char*)p - (const char*)g_dyn); }
inline const mx_bf16* smem_b16(unsigned a) { return (const mx_bf16*)((const char*)g_dyn + (int)a); }
// ldmatrix x4: lanes 8j .. 8j + 7 give matrix j's row addresses; lane l gets row l / 4, entries
// 2(l % 4), + 1 — or, transposed, entries (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4).
inline void mx_ldsm(unsigned (&r)[4], unsigned addr, bool trans) {
    const unsigned post[1] = {addr};
    warp_round(post, 1, [&](unsigned (*x)[8], int l) {
        for (int j = 0; j < 4; ++j) {
            unsigned lo, hi;
            if (!trans) {
                const mx_bf16* row = smem_b16(x[8 * j + l / 4][0]);
                lo = row[2 * (l % 4)], hi = row[2 * (l % 4) + 1];
            } else {
                lo = smem_b16(x[8 * j + 2 * (l % 4)][0])[l / 4];
                hi = smem_b16(x[8 * j + 2 * (l % 4) + 1][0])[l / 4];
            }
            r[j] = lo | hi << 16;
        }
    });
}
inline void mx_ldsm_x4(unsigned (&r)[4], unsigned addr) { mx_ldsm(r, addr, false); }
// movmatrix.trans of an 8 × 8 b16 matrix, lane l holding row l / 4, entries 2(l % 4), + 1.
inline unsigned mx_movm_t(unsigned x) {
    const unsigned post[1] = {x};
    unsigned r = 0;
    warp_round(post, 1, [&](unsigned (*p)[8], int l) {
        const int row = l / 4, c0 = 2 * (l % 4);
        unsigned out = 0;
        for (int e = 0; e < 2; ++e) {  // entry (row, c0 + e) of the result = (c0 + e, row) of the input
            const int src_row = c0 + e, src_col = row;
            const unsigned w = p[src_row * 4 + src_col / 2][0];
            out |= ((src_col & 1 ? w >> 16 : w & 0xffffu) & 0xffffu) << (16 * e);
        }
        r = out;
    });
    return r;
}
inline void mx_ldsm_x4_t(unsigned (&r)[4], unsigned addr) { mx_ldsm(r, addr, true); }
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
// cp.async as a plain copy (the kernel file's commit and wait statements are removed by sed).
// With LLC_COMMON_SED the harness includes /tmp/llc_common.cuh, the header with its cp.async
// helpers' definitions renamed (sed -e 's/void llc_cp_async\(16\)*(/void llc_cp_async\1_device(/'),
// so that the tile loaders call the plain copies below; else the header as it is, with every
// use of llc_cp_async renamed (its loaders must then not be called).
#ifdef LLC_COMMON_SED
inline void llc_cp_async(void* dst, const void* src, int bytes, int valid) {
    if (valid) std::memcpy(dst, src, bytes);
    else std::memset(dst, 0, bytes);
}
inline void llc_cp_async16(void* dst, const void* src, int valid) { llc_cp_async(dst, src, 16, valid); }
#include "llc_common.cuh"
#else
#define llc_cp_async llc_cp_async_device
#include "../../mixer-cuda/kernels/loglinear_common.cuh"
#undef llc_cp_async
inline void llc_cp_async(void* dst, const void* src, int bytes, int valid) {
    if (valid) std::memcpy(dst, src, bytes);
    else std::memset(dst, 0, bytes);
}
#endif
// Runs kernel(…) on a grid of (gx, gy, gz) blocks of nt threads (256 unless given, at most 256),
// one block at a time.
static void launch(int gx, int gy, int gz, const std::function<void()>& kernel, int nt = 256) {
    gridDim = {gx, gy, gz};
    blockDim = {nt, 1, 1};
    std::barrier<> bar(nt);
    std::vector<std::barrier<>*> warps;
    for (int w = 0; w < 8; ++w) warps.push_back(new std::barrier<>(32));
    g_bar = &bar;
    for (int w = 0; w < 8; ++w) g_warp[w] = warps[w];
    for (int bz = 0; bz < gz; ++bz)
      for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            blockIdx = {bx, by, bz};
            std::vector<std::thread> ts;
            for (int t = 0; t < nt; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    kernel();
                });
            for (auto& t : ts) t.join();
        }
    for (auto* w : warps) delete w;
}

static void launch(int gx, int gy, const std::function<void()>& kernel) { launch(gx, gy, 1, kernel); }
