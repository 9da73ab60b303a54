// Generalized linear recurrence (docs/math.md §1.2), any offset pattern:
//   y[t] = α[t,0]·x[t] + Σ_{k: f(k) ≤ t} ( α[t,k+1]·x[d_k(t)] + β[t,k]·y[d_k(t)] )   per (b, c),
// with the α-terms on x present for on = a | both and the β-terms for on = b | both.
// The pattern reaches the GPU as a table computed on the host: offsets f(k) and lattice
// strides a_k (k < K). Positions: translation-invariant d = t − f(k); cache-efficient
// d = a_k·⌈(t + 1 − f(k)) / a_k⌉ − 1. Layouts: x, y [B,T,C]; α [B,T,NA,C] (NA = 1 or K+1);
// β [B,T,K,C].

// Position d_k(t) of an active tap (f(k) ≤ t < 2³¹, hence a_k ≤ f(k) ≤ t: 32-bit arithmetic).
__device__ __forceinline__ int glr_dep(int t, int fk, int ak, int ce) {
    if (!ce || ak == 1) return t - fk;
    return ((t - fk + ak) / ak) * ak - 1;
}

// The recurrence, pipelined over tiles of GLR_L tokens: a block owns GLR_CH channels of one
// batch row and walks the tiles in order. While warp 0 runs the sequential recurrence of tile i,
// the other warps prepare tile i + 1:
//   pre[t] = α[t,0]·x[t] + Σ_k α[t,k+1]·x[d_k(t)] + Σ_{k: d_k(t) < t0(i)} β[t,k]·y[d_k(t)],
// every term whose y is already final (tiles before i), loaded with a batch of taps in flight at
// once. For its tile (first token t0), warp 0 adds the remaining taps, d_k(t) ≥ t0 − L, which lie
// in this tile or the one before: y[t] = pre[t] + Σ_near β[t,k]·y[d_k(t)], reading those two tiles
// of y from a shared ring and β of the first `kn` near taps from shared memory, where the producers
// staged it. Only taps k < knear can be near: the host gives knear = 1 + max{k : f(k) − a_k + 1 ≤
// 2L − 1} (a_k = 1 when translation-invariant), since d_k(t) ≤ t − f(k) + a_k − 1.
// Shared memory (T elements): pre [2][L][CH], ring [2][L][CH], staged β [2][L][kn][CH].
#ifndef GLR_L
#define GLR_L 64
#endif
#ifndef GLR_CH
#define GLR_CH 8
#endif
#ifndef GLR_THREADS
#define GLR_THREADS 512
#endif
#define GLR_BATCH 8
#define GLR_NEAR_UNROLL 12

template <typename T>
__device__ void glr_tiled(const T* x, const T* alpha, const T* beta, const long long* off, const long long* stride,
                          T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce, int knear, int kn) {
    extern __shared__ __align__(16) unsigned char glr_smem[];
    T* pre = (T*)glr_smem;
    T* ring = pre + 2 * GLR_L * GLR_CH;
    T* bnear = ring + 2 * GLR_L * GLR_CH;
    const int groups = (C + GLR_CH - 1) / GLR_CH;
    const int b = blockIdx.x / groups, c0 = (blockIdx.x % groups) * GLR_CH;
    const int tid = threadIdx.x;
    const long long row = (long long)b * Tn;
    const int tiles = (Tn + GLR_L - 1) / GLR_L;
    // The near taps' table, in registers (indices are compile-time after unrolling).
    int offn[GLR_NEAR_UNROLL], strn[GLR_NEAR_UNROLL];
#pragma unroll
    for (int k = 0; k < GLR_NEAR_UNROLL; ++k) {
        offn[k] = k < knear && off[k] <= Tn ? (int)off[k] : 0x7fffffff;
        strn[k] = k < knear && off[k] <= Tn ? (int)stride[k] : 1;
    }
    for (int i = -1; i < tiles; ++i) {
        if (tid < 32) {
            // Warp 0: the recurrence of tile i.
            if (i >= 0 && tid < GLR_CH && c0 + tid < C) {
                const int c = tid, cc = c0 + tid, t0 = i * GLR_L, lim = min(GLR_L, Tn - t0);
                const T* pr = pre + (i & 1) * GLR_L * GLR_CH;
                T* cur = ring + (i & 1) * GLR_L * GLR_CH;
                const T* prev = ring + ((i + 1) & 1) * GLR_L * GLR_CH;
                const T* bn = bnear + (long long)(i & 1) * GLR_L * kn * GLR_CH;
                for (int tl = 0; tl < lim; ++tl) {
                    const int t = t0 + tl;
                    T acc = pr[tl * GLR_CH + c];
                    if (has_b) {
#pragma unroll
                        for (int k = 0; k < GLR_NEAR_UNROLL; ++k) {
                            if (offn[k] <= t) {
                                int d = glr_dep(t, offn[k], strn[k], ce);
                                if (d >= t0 - GLR_L) {
                                    T bv = k < kn ? bn[(tl * kn + k) * GLR_CH + c] : beta[((row + t) * K + k) * C + cc];
                                    T yd = d >= t0 ? cur[(d - t0) * GLR_CH + c] : prev[(d - t0 + GLR_L) * GLR_CH + c];
                                    acc += bv * yd;
                                }
                            }
                        }
                        for (int k = GLR_NEAR_UNROLL; k < knear; ++k) {
                            if (off[k] > t) break;
                            int d = glr_dep(t, (int)off[k], (int)stride[k], ce);
                            if (d >= t0 - GLR_L) {
                                T bv = k < kn ? bn[(tl * kn + k) * GLR_CH + c] : beta[((row + t) * K + k) * C + cc];
                                T yd = d >= t0 ? cur[(d - t0) * GLR_CH + c] : prev[(d - t0 + GLR_L) * GLR_CH + c];
                                acc += bv * yd;
                            }
                        }
                    }
                    cur[tl * GLR_CH + c] = acc;
                    y[(row + t) * C + cc] = acc;
                }
            }
        } else if (i + 1 < tiles) {
            // Producers: the far part of tile i + 1.
            const int t0 = (i + 1) * GLR_L, lim = min(GLR_L, Tn - t0);
            const int far = t0 - GLR_L;
            T* pr = pre + ((i + 1) & 1) * GLR_L * GLR_CH;
            T* bn = bnear + (long long)((i + 1) & 1) * GLR_L * kn * GLR_CH;
            for (int j = tid - 32; j < lim * GLR_CH; j += GLR_THREADS - 32) {
                const int tl = j / GLR_CH, c = j % GLR_CH, cc = c0 + c;
                if (cc >= C) continue;
                const int t = t0 + tl;
                const long long bt = row + t;
                T acc = alpha[bt * NA * C + cc] * x[bt * C + cc];
                // Active taps (f(k) ≤ t) are a prefix, since f is increasing.
                for (int k0 = 0; k0 < K && off[k0] <= t; k0 += GLR_BATCH) {
                    T av[GLR_BATCH], xv[GLR_BATCH], bv[GLR_BATCH], yv[GLR_BATCH];
#pragma unroll
                    for (int u = 0; u < GLR_BATCH; ++u) {
                        const int k = k0 + u;
                        av[u] = 0, xv[u] = 0, bv[u] = 0, yv[u] = 0;
                        if (k < K && off[k] <= t) {
                            const int d = glr_dep(t, (int)off[k], (int)stride[k], ce);
                            if (has_a) {
                                av[u] = alpha[(bt * NA + k + 1) * C + cc];
                                xv[u] = x[(row + d) * C + cc];
                            }
                            if (has_b) {
                                T bk = beta[(bt * K + k) * C + cc];
                                if (d < far) {
                                    bv[u] = bk;
                                    yv[u] = y[(row + d) * C + cc];
                                } else if (k < kn) {
                                    bn[(tl * kn + k) * GLR_CH + c] = bk;
                                }
                            }
                        }
                    }
#pragma unroll
                    for (int u = 0; u < GLR_BATCH; ++u) acc += av[u] * xv[u] + bv[u] * yv[u];
                }
                pr[tl * GLR_CH + c] = acc;
            }
        }
        __syncthreads();
    }
}

// Decoder step: one thread per (b, c). slot[k] is the cache slot of d_k(t) (−1: inactive);
// cache rows [cap, B, C] hold x (cx) and y (cy) of kept positions; the new x_t, y_t are
// written to slot `out` (−1: not kept). A slot freed at this step may be `out`: each thread
// reads all its dependencies before writing its own column.
template <typename T>
__device__ void glr_step(const T* xt, const T* at, const T* bt_, const int* slot, T* cx, T* cy, T* yt, int B, int C,
                         int K, int NA, int has_a, int has_b, int out) {
    long long i = gtid();
    if (i >= (long long)B * C) return;
    int c = (int)(i % C), b = (int)(i / C);
    T xv = xt[i];
    T acc = at[(long long)b * NA * C + c] * xv;
    for (int k = 0; k < K; ++k) {
        int s = slot[k];
        if (s < 0) continue;
        long long ci = ((long long)s * B + b) * C + c;
        if (has_a) acc += at[((long long)b * NA + k + 1) * C + c] * cx[ci];
        if (has_b) acc += bt_[((long long)b * K + k) * C + c] * cy[ci];
    }
    yt[i] = acc;
    if (out >= 0) {
        long long ci = ((long long)out * B + b) * C + c;
        if (has_a) cx[ci] = xv;
        if (has_b) cy[ci] = acc;
    }
}

#define GLR_EXPORT(T, S)                                                                                         \
    extern "C" __global__ void __launch_bounds__(GLR_THREADS)                                                \
        glr_tiled_##S(const T* x, const T* alpha, const T* beta, const long long* off, const long long* stride,  \
                      T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce, int knear, int kn) { \
        glr_tiled<T>(x, alpha, beta, off, stride, y, B, Tn, C, K, NA, has_a, has_b, ce, knear, kn);              \
    }                                                                                                            \
    extern "C" __global__ void glr_step_##S(const T* xt, const T* at, const T* bt, const int* slot, T* cx, T* cy, \
                                            T* yt, int B, int C, int K, int NA, int has_a, int has_b, int out) { \
        glr_step<T>(xt, at, bt, slot, cx, cy, yt, B, C, K, NA, has_a, has_b, out);                               \
    }

GLR_EXPORT(float, f32)
GLR_EXPORT(double, f64)
