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

// The recurrence, pipelined over tiles of GLR_L tokens: a block owns GLR_CH channels of one batch
// row and walks the tiles in order. While warp 0 runs the recurrence of tile i, the other warps
// (one thread per (token, channel) of the tile) prepare tile i + 1, whose first token is t0:
//  * pre[t] = α[t,0]·x[t] + Σ_k α[t,k+1]·x[d_k(t)] + Σ_{k: d_k(t) < t0 − L} β[t,k]·y[d_k(t)]:
//    every term whose y is final (tiles before i), loaded with all taps of a batch in flight;
//  * for the taps k < GLR_NN that reach tile i or i + 1 (d_k(t) ≥ t0 − L): b1[t] = Σ β[t,k] over
//    those with d_k(t) = t − 1, and a gather list of (β[t,k], ring slot of d_k(t)) for the others
//    (β = 0 and an always-zero slot for taps that are inactive, far, or at lag 1).
// Warp 0 then needs one FMA on its critical path per token, y[t] = pa[t] + b1[t]·y[t−1], where
// pa[t] = pre[t] + Σ_list β·ring[slot] is gathered while the previous token is computed (every
// listed position is at least two tokens back). Taps k ≥ GLR_NN that reach the two tiles (only
// when knear > GLR_NN, i.e. patterns with many small offsets) are added by warp 0 directly.
// Only taps k < knear can reach them: the host gives knear = 1 + max{k : f(k) − a_k + 1 ≤ 2L − 1}
// (a_k = 1 when translation-invariant), since d_k(t) ≤ t − f(k) + a_k − 1.
// y of the last two tiles lives in a ring of 2L rows (row d mod 2L) plus one zero row; warp 0
// copies each finished tile to y in global memory.
// Shared memory (dynamic): pre, b1 [2][L][CH] T; list β [2][L][NN][CH] T; ring [2L+1][CH] T;
// list slots [2][L][NN][CH] u16. Block: 32 + L·CH threads.
#ifndef GLR_L
#define GLR_L 64
#endif
#ifndef GLR_CH
#define GLR_CH 8
#endif
#ifndef GLR_NN
#define GLR_NN 8
#endif
#define GLR_THREADS (32 + GLR_L * GLR_CH)
#define GLR_BATCH 8

template <typename T>
__device__ void glr_tiled(const T* x, const T* alpha, const T* beta, const long long* off, const long long* stride,
                          T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce, int knear) {
    extern __shared__ __align__(16) unsigned char glr_smem[];
    const int TILE = GLR_L * GLR_CH, LIST = GLR_L * GLR_NN * GLR_CH, ZERO = 2 * GLR_L * GLR_CH;
    T* pre = (T*)glr_smem;
    T* b1s = pre + 2 * TILE;
    T* lb = b1s + 2 * TILE;
    T* ring = lb + 2 * LIST;
    unsigned short* li = (unsigned short*)(ring + (2 * GLR_L + 1) * GLR_CH);
    const int groups = (C + GLR_CH - 1) / GLR_CH;
    const int b = blockIdx.x / groups, c0 = (blockIdx.x % groups) * GLR_CH;
    const int tid = threadIdx.x;
    const long long row = (long long)b * Tn;
    const int tiles = (Tn + GLR_L - 1) / GLR_L;
    for (int j = tid; j < (2 * GLR_L + 1) * GLR_CH; j += GLR_THREADS) ring[j] = (T)0;
    __syncthreads();
    for (int i = -1; i < tiles; ++i) {
        if (tid < 32) {
            // Warp 0: the recurrence of tile i, one lane per channel.
            if (i >= 0 && tid < GLR_CH) {
                const int c = tid, cc = c0 + c, t0 = i * GLR_L, lim = min(GLR_L, Tn - t0);
                const T* pr = pre + (i & 1) * TILE;
                const T* b1 = b1s + (i & 1) * TILE;
                const T* lbt = lb + (i & 1) * LIST;
                const unsigned short* lit = li + (i & 1) * LIST;
                T yprev = t0 > 0 ? ring[((t0 - 1) % (2 * GLR_L)) * GLR_CH + c] : (T)0;
                T pa = pr[c], w1 = b1[c];
#pragma unroll
                for (int k = 0; k < GLR_NN; ++k) pa += lbt[k * GLR_CH + c] * ring[lit[k * GLR_CH + c]];
                for (int tl = 0; tl < lim; ++tl) {
                    const int t = t0 + tl;
                    // Operands of the next token first: none of them is y[t].
                    const int nx = min(tl + 1, lim - 1);
                    T npre = pr[nx * GLR_CH + c], nw1 = b1[nx * GLR_CH + c], nb[GLR_NN], ny[GLR_NN];
#pragma unroll
                    for (int k = 0; k < GLR_NN; ++k) {
                        nb[k] = lbt[(nx * GLR_NN + k) * GLR_CH + c];
                        ny[k] = ring[lit[(nx * GLR_NN + k) * GLR_CH + c]];
                    }
                    T acc = pa + w1 * yprev;
                    for (int k = GLR_NN; k < knear && cc < C; ++k) {
                        if (off[k] > t) break;
                        const int d = glr_dep(t, (int)off[k], (int)stride[k], ce);
                        if (d >= t0 - GLR_L)
                            acc += beta[((row + t) * K + k) * C + cc] * ring[(d % (2 * GLR_L)) * GLR_CH + c];
                    }
                    ring[(t % (2 * GLR_L)) * GLR_CH + c] = acc;
                    yprev = acc;
                    w1 = nw1;
                    // Two independent FMA chains (half the latency of one).
                    T s0 = npre, s1 = 0;
#pragma unroll
                    for (int k = 0; k < GLR_NN; k += 2) s0 += nb[k] * ny[k];
#pragma unroll
                    for (int k = 1; k < GLR_NN; k += 2) s1 += nb[k] * ny[k];
                    pa = s0 + s1;
                }
            }
            // The tile's y from the ring to global memory, coalesced, before the barrier (the
            // gathering threads read it from the next iteration on).
            __syncwarp();
            if (i >= 0) {
                const int t0 = i * GLR_L, lim = min(GLR_L, Tn - t0);
                for (int j = tid; j < lim * GLR_CH; j += 32) {
                    const int tl = j / GLR_CH, c = j % GLR_CH, t = t0 + tl;
                    if (c0 + c < C) y[(row + t) * C + c0 + c] = ring[(t % (2 * GLR_L)) * GLR_CH + c];
                }
            }
        } else if (i + 1 < tiles) {
            // One (token, channel) of tile i + 1 per thread.
            const int t0 = (i + 1) * GLR_L, far = t0 - GLR_L;
            const int p = tid - 32, tl = p / GLR_CH, c = p % GLR_CH, cc = c0 + c, t = t0 + tl;
            if (t < Tn) {
                const bool live = cc < C;
                T* pr = pre + ((i + 1) & 1) * TILE;
                T* b1 = b1s + ((i + 1) & 1) * TILE;
                T* lbt = lb + ((i + 1) & 1) * LIST;
                unsigned short* lit = li + ((i + 1) & 1) * LIST;
                const long long bt = row + t;
                T acc = live ? alpha[bt * NA * C + cc] * x[bt * C + cc] : (T)0, w1 = 0;
                {
                    // Taps k < GLR_NN: loads first, then sort each into pre, b1 or the list.
                    T bk[GLR_NN], yk[GLR_NN], ak[GLR_NN], xk[GLR_NN];
                    int dk[GLR_NN];
#pragma unroll
                    for (int k = 0; k < GLR_NN; ++k) {
                        const bool act = live && k < K && off[k] <= t;
                        dk[k] = act ? glr_dep(t, (int)off[k], (int)stride[k], ce) : -1;
                        bk[k] = act && has_b ? beta[(bt * K + k) * C + cc] : (T)0;
                        yk[k] = act && has_b && dk[k] < far ? y[(row + dk[k]) * C + cc] : (T)0;
                        ak[k] = act && has_a ? alpha[(bt * NA + k + 1) * C + cc] : (T)0;
                        xk[k] = act && has_a ? x[(row + dk[k]) * C + cc] : (T)0;
                    }
#pragma unroll
                    for (int k = 0; k < GLR_NN; ++k) {
                        acc += ak[k] * xk[k];
                        const bool listed = dk[k] >= 0 && dk[k] >= far && dk[k] < t - 1;
                        if (dk[k] >= 0 && dk[k] < far) acc += bk[k] * yk[k];
                        if (dk[k] >= 0 && dk[k] == t - 1) w1 += bk[k];
                        lbt[(tl * GLR_NN + k) * GLR_CH + c] = listed ? bk[k] : (T)0;
                        lit[(tl * GLR_NN + k) * GLR_CH + c] =
                            (unsigned short)(listed ? (dk[k] % (2 * GLR_L)) * GLR_CH + c : ZERO + c);
                    }
                }
                // Taps k ≥ GLR_NN (active ones are a prefix, f being increasing): the far ones.
                for (int k0 = GLR_NN; live && k0 < K && off[k0] <= t; k0 += GLR_BATCH) {
                    T av[GLR_BATCH], xv[GLR_BATCH], bv[GLR_BATCH], yv[GLR_BATCH];
#pragma unroll
                    for (int u = 0; u < GLR_BATCH; ++u) {
                        const int k = k0 + u;
                        const bool act = k < K && off[k] <= t;
                        const int d = act ? glr_dep(t, (int)off[k], (int)stride[k], ce) : 0;
                        const bool fy = act && has_b && d < far;
                        av[u] = act && has_a ? alpha[(bt * NA + k + 1) * C + cc] : (T)0;
                        xv[u] = act && has_a ? x[(row + d) * C + cc] : (T)0;
                        bv[u] = fy ? beta[(bt * K + k) * C + cc] : (T)0;
                        yv[u] = fy ? y[(row + d) * C + cc] : (T)0;
                    }
#pragma unroll
                    for (int u = 0; u < GLR_BATCH; ++u) acc += av[u] * xv[u] + bv[u] * yv[u];
                }
                pr[tl * GLR_CH + c] = acc;
                b1[tl * GLR_CH + c] = w1;
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
                      T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce, int knear) {         \
        glr_tiled<T>(x, alpha, beta, off, stride, y, B, Tn, C, K, NA, has_a, has_b, ce, knear);                  \
    }                                                                                                            \
    extern "C" __global__ void glr_step_##S(const T* xt, const T* at, const T* bt, const int* slot, T* cx, T* cy, \
                                            T* yt, int B, int C, int K, int NA, int has_a, int has_b, int out) { \
        glr_step<T>(xt, at, bt, slot, cx, cy, yt, B, C, K, NA, has_a, has_b, out);                               \
    }

GLR_EXPORT(float, f32)
GLR_EXPORT(double, f64)
