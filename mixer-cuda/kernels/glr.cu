// Generalized linear recurrence (docs/math.md §1.2), any offset pattern:
//   y[t] = α[t,0]·x[t] + Σ_{k: f(k) ≤ t} ( α[t,k+1]·x[d_k(t)] + β[t,k]·y[d_k(t)] )   per (b, c),
// with the α-terms on x present for on = a | both and the β-terms for on = b | both.
// The pattern reaches the GPU as a table computed on the host: offsets f(k) and lattice
// strides a_k (k < K). Positions: translation-invariant d = t − f(k); cache-efficient
// d = a_k·⌈(t + 1 − f(k)) / a_k⌉ − 1. Layouts: x, y [B,T,C]; α [B,T,NA,C] (NA = 1 or K+1);
// β [B,T,K,C].

// glr_dep (the position d_k(t) of an active tap) is in glr_common.cuh, prepended by the host.

// The recurrence, pipelined over tiles of GLR_L tokens: a block owns GLR_CH channels of one batch
// row and walks the tiles in order. While warp 0 runs the recurrence of tile i, the other warps
// (one thread per (token, channel) of the tile) prepare tile i + 1, whose first token is t0:
//  * pre[t] = α[t,0]·x[t] + Σ_k α[t,k+1]·x[d_k(t)] + Σ_{k: d_k(t) < t0 − L} β[t,k]·y[d_k(t)]:
//    every term whose y is final (tiles before i), loaded with all taps of a batch in flight;
//  * for the taps k < GLR_NN that reach tile i or i + 1 (d_k(t) ≥ t0 − L): b1[t] and b2[t], the
//    sums of β[t,k] over those with d_k(t) = t − 1 and t − 2, and for the others (lag ≥ 3) a list
//    of (β[t,k], ring slot of d_k(t)) at entry k − GLR_K2 (β = 0 and an always-zero slot when the
//    tap is inactive, far, or at lag 1 or 2). GLR_K2 = #{k : f(k) ≤ 2} (those taps never have
//    lag ≥ 3) and GLR_NL = min(knear, GLR_NN) − GLR_K2 entries hold every listed tap.
// Warp 0 then computes, one lane per channel, y[t] = q[t] + b1[t]·y[t−1] with
// q[t] = pre[t] + b2[t]·y[t−2] + Σ_list β·ring[slot]: one FMA on the critical path, y[t−1] and
// y[t−2] in registers; every listed position is at least three tokens back, so the ring values of
// token t + 2 are loaded while y[t] is computed, and the sum q[t + 1] is formed from the values
// loaded one token earlier. Each token's operands are one record [pre, b1, b2, β…] (16-byte
// loads) and one slot record. Taps k ≥ GLR_NN that reach the two tiles (only when
// knear > GLR_NN, i.e. patterns with many small offsets) are added by warp 0 directly.
// Only taps k < knear can reach them: the host gives knear = 1 + max{k : f(k) − a_k + 1 ≤ 2L − 1}
// (a_k = 1 when translation-invariant), since d_k(t) ≤ t − f(k) + a_k − 1.
// y of the last two tiles lives in a ring of 2L rows (row d mod 2L) plus one zero row; warp 0
// copies each finished tile to y in global memory.
// Shared memory (dynamic): records [2][L][CH][GLR_REC] T; ring [2L+1][CH] T;
// slot records [2][L][CH][GLR_SREC] u16 (byte offsets into the ring). Block: 32 + L·CH threads.
#ifndef GLR_L
#define GLR_L 64
#endif
#ifndef GLR_CH
#define GLR_CH 8
#endif
#ifndef GLR_NN
#define GLR_NN 8
#endif
#ifndef GLR_K2
#define GLR_K2 2
#endif
#ifndef GLR_NL
#define GLR_NL 6
#endif
#ifndef GLR_FARNEAR
#define GLR_FARNEAR 1
#endif
#define GLR_THREADS (32 + GLR_L * GLR_CH)
// GLR_REV = 1 compiles the backward's reverse recurrence (glr_backward.cu; pattern on B,
// translation-invariant): token t takes x[T − 1 − t] with α = 1 (x: the output's cotangent) and tap
// k's β of token T − 1 − t + f(k), the token that reads through it; y is the total cotangent g in
// reversed time. GLR_SELF(t) is token t's own term α[t,0]·x[t], GLR_BETA(t, k) its β[t,k].
#ifndef GLR_REV
#define GLR_REV 0
#endif
#if GLR_REV
#define GLR_SELF(t) x[(row + Tn - 1 - (t)) * C + cc]
#define GLR_BETA(t, k) beta[((row + Tn - 1 - (t) + off[k]) * K + (k)) * C + cc]
#else
#define GLR_SELF(t) (alpha[(row + (t)) * NA * C + cc] * x[(row + (t)) * C + cc])
#define GLR_BETA(t, k) beta[((row + (t)) * K + (k)) * C + cc]
#endif
#define GLR_BATCH 8
// Record lengths: [pre, b1, b2, β_0 … β_{NL−1}] rounded up to 16 bytes of f32 (4 elements; f64
// records use the same element count, 32 bytes), slots rounded up to 8 (16 bytes).
#define GLR_REC (((3 + GLR_NL + 3) / 4) * 4)
#define GLR_SREC (GLR_NL > 8 ? 16 : 8)

// n consecutive elements from shared memory by 16-byte loads (n a multiple of 16 / sizeof(T)).
template <int N> __device__ __forceinline__ void glr_ld(const float* p, float (&r)[N]) {
#pragma unroll
    for (int j = 0; j < N; j += 4) {
        const float4 v = *reinterpret_cast<const float4*>(p + j);
        r[j] = v.x, r[j + 1] = v.y, r[j + 2] = v.z, r[j + 3] = v.w;
    }
}
template <int N> __device__ __forceinline__ void glr_ld(const double* p, double (&r)[N]) {
#pragma unroll
    for (int j = 0; j < N; j += 2) {
        const double2 v = *reinterpret_cast<const double2*>(p + j);
        r[j] = v.x, r[j + 1] = v.y;
    }
}
template <int N> __device__ __forceinline__ void glr_ld(const unsigned short* p, unsigned (&r)[N]) {
#pragma unroll
    for (int j = 0; j < N; j += 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(p + j);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) r[j + 2 * u] = w[u] & 0xffffu, r[j + 2 * u + 1] = w[u] >> 16;
    }
}

#define GLR_NLA (GLR_NL > 0 ? GLR_NL : 1)
#if ((2 * GLR_L * GLR_CH) & (2 * GLR_L * GLR_CH - 1)) != 0 || (GLR_L & (GLR_L - 1)) != 0
#error "GLR_L and GLR_CH must be powers of two (ring positions wrap by masking)"
#endif

// Index in the ring (the last two tiles' outputs, row d mod 2L) of position d ≥ 0, channel lane c.
__device__ __forceinline__ int glr_ring(int d, int c) { return (d & (2 * GLR_L - 1)) * GLR_CH + c; }

// The sequential warp's state for one channel (lane): records and slot records of the tile, the
// ring (slots are byte offsets into it), the write position of y_t in the ring, y_{t−1}, y_{t−2},
// q and b1 of the current token, and the slots of the token after next.
template <typename T> struct GlrSeq {
    static constexpr int RS = GLR_CH * GLR_REC, SS = GLR_CH * GLR_SREC;
    const T* rt;
    const unsigned short* st;
    unsigned char* ring;
    int wpos, lim;
    T y1, y2, q, w1;
    unsigned sn[GLR_SREC];
    __device__ __forceinline__ T ringv(unsigned byte) const { return *(const T*)(ring + byte); }
    // Token tl: y = q + b1·y_{t−1} (plus near taps k ≥ GLR_NN when GLR_FARNEAR), stored in the ring;
    // then the ring values (vn2) and record (rn2) of token tl + 2 and the slots of tl + 3 are
    // loaded, and q, b1 of token tl + 1 formed from vn, rn (loaded one token earlier).
    __device__ __forceinline__ void step(int tl, const T (&vn)[GLR_NLA], const T (&rn)[GLR_REC], T (&vn2)[GLR_NLA],
                                         T (&rn2)[GLR_REC], const T* beta, const long long* off,
                                         const long long* stride, long long row, int Tn, int K, int C, int cc,
                                         int ce, int knear, int t0) {
        T acc = q + w1 * y1;
#if GLR_FARNEAR
        const int t = t0 + tl;
        for (int k = GLR_NN; k < knear && cc < C; ++k) {
            if (off[k] > t) break;
            const int d = glr_dep(t, (int)off[k], (int)stride[k], ce);
            if (d >= t0 - GLR_L)
                acc += GLR_BETA(t, k) * ((const T*)ring)[glr_ring(d, wpos & (GLR_CH - 1))];
        }
#endif
        ((T*)ring)[wpos] = acc;
        wpos = (wpos + GLR_CH) & (2 * GLR_L * GLR_CH - 1);
        y2 = y1;
        y1 = acc;
        const int a2 = min(tl + 2, lim - 1), a3 = min(tl + 3, lim - 1);
#pragma unroll
        for (int j = 0; j < GLR_NL; ++j) vn2[j] = ringv(sn[j]);
        glr_ld(rt + a2 * RS, rn2);
        glr_ld(st + a3 * SS, sn);
        T s0q = rn[0] + rn[2] * y2, s1q = (T)0;
#pragma unroll
        for (int j = 0; j < GLR_NL; j += 2) s0q += rn[3 + j] * vn[j];
#pragma unroll
        for (int j = 1; j < GLR_NL; j += 2) s1q += rn[3 + j] * vn[j];
        q = s0q + s1q;
        w1 = rn[1];
    }
};

template <typename T>
__device__ void glr_tiled(const T* x, const T* alpha, const T* beta, const long long* off, const long long* stride,
                          T* y, int B, int Tn, int C, int K, int NA, int has_a, int has_b, int ce, int knear) {
    extern __shared__ __align__(16) unsigned char glr_smem[];
    const int TILE = GLR_L * GLR_CH, ZERO = 2 * GLR_L * GLR_CH;
    T* rec = (T*)glr_smem;
    T* ring = rec + 2 * TILE * GLR_REC;
    unsigned short* sl = (unsigned short*)(ring + (2 * GLR_L + 1) * GLR_CH);
    const int groups = (C + GLR_CH - 1) / GLR_CH;
    const int b = blockIdx.x / groups, c0 = (blockIdx.x % groups) * GLR_CH;
    const int tid = threadIdx.x;
    const long long row = (long long)b * Tn;
    const int tiles = (Tn + GLR_L - 1) / GLR_L;
    // Everything zero once: the ring's zero row, and record padding that is loaded but not used.
    for (int j = tid; j < 2 * TILE * GLR_REC + (2 * GLR_L + 1) * GLR_CH; j += GLR_THREADS) rec[j] = (T)0;
    for (int j = tid; j < 2 * TILE * GLR_SREC; j += GLR_THREADS) sl[j] = (unsigned short)(ZERO * sizeof(T));
    __syncthreads();
    for (int i = -1; i < tiles; ++i) {
        if (tid < 32) {
            // Warp 0: the recurrence of tile i, one lane per channel.
            if (i >= 0 && tid < GLR_CH) {
                const int c = tid, cc = c0 + c, t0 = i * GLR_L, lim = min(GLR_L, Tn - t0);
                GlrSeq<T> s;
                s.rt = rec + (i & 1) * TILE * GLR_REC + c * GLR_REC;
                s.st = sl + (i & 1) * TILE * GLR_SREC + c * GLR_SREC;
                s.ring = (unsigned char*)ring;
                s.wpos = glr_ring(t0, c);
                s.lim = lim;
                s.y1 = t0 >= 1 ? ring[glr_ring(t0 - 1, c)] : (T)0;
                s.y2 = t0 >= 2 ? ring[glr_ring(t0 - 2, c)] : (T)0;
                // Prologue: q and b1 of token 0, ring values and record of token 1, slots of token 2.
                T r0[GLR_REC], ra[GLR_REC], rb[GLR_REC], va[GLR_NLA], vb[GLR_NLA];
                unsigned s0[GLR_SREC];
                glr_ld(s.rt, r0);
                glr_ld(s.st, s0);
                const int n1 = min(1, lim - 1), n2 = min(2, lim - 1);
                glr_ld(s.rt + n1 * GlrSeq<T>::RS, ra);
                glr_ld(s.st + n1 * GlrSeq<T>::SS, s.sn);
                s.q = r0[0] + r0[2] * s.y2;
                s.w1 = r0[1];
#pragma unroll
                for (int j = 0; j < GLR_NL; ++j) s.q += r0[3 + j] * s.ringv(s0[j]);
#pragma unroll
                for (int j = 0; j < GLR_NL; ++j) va[j] = s.ringv(s.sn[j]);
                glr_ld(s.st + n2 * GlrSeq<T>::SS, s.sn);
                // Two tokens per trip, the two register sets swapping roles (no copies).
                int tl = 0;
                for (; tl + 1 < lim; tl += 2) {
                    s.step(tl, va, ra, vb, rb, beta, off, stride, row, Tn, K, C, cc, ce, knear, t0);
                    s.step(tl + 1, vb, rb, va, ra, beta, off, stride, row, Tn, K, C, cc, ce, knear, t0);
                }
                if (tl < lim) s.step(tl, va, ra, vb, rb, beta, off, stride, row, Tn, K, C, cc, ce, knear, t0);
            }
            // The tile's y from the ring to global memory, coalesced, before the barrier (the
            // gathering threads read it from the next iteration on).
            __syncwarp();
            if (i >= 0) {
                const int t0 = i * GLR_L, lim = min(GLR_L, Tn - t0);
                for (int j = tid; j < lim * GLR_CH; j += 32) {
                    const int tl = j / GLR_CH, c = j % GLR_CH, t = t0 + tl;
                    if (c0 + c < C) y[(row + t) * C + c0 + c] = ring[glr_ring(t, c)];
                }
            }
        } else if (i + 1 < tiles) {
            // One (token, channel) of tile i + 1 per thread.
            const int t0 = (i + 1) * GLR_L, far = t0 - GLR_L;
            const int p = tid - 32, tl = p / GLR_CH, c = p % GLR_CH, cc = c0 + c, t = t0 + tl;
            if (t < Tn) {
                const bool live = cc < C;
                T* rr = rec + ((i + 1) & 1) * TILE * GLR_REC + (tl * GLR_CH + c) * GLR_REC;
                unsigned short* ss = sl + ((i + 1) & 1) * TILE * GLR_SREC + (tl * GLR_CH + c) * GLR_SREC;
                const long long bt = row + t;
                T acc = live ? GLR_SELF(t) : (T)0, w1 = 0, w2 = 0;
                {
                    // Taps k < GLR_NN: loads first, then sort each into pre, b1, b2 or the list.
                    T bk[GLR_NN], yk[GLR_NN], ak[GLR_NN], xk[GLR_NN];
                    int dk[GLR_NN];
#pragma unroll
                    for (int k = 0; k < GLR_NN; ++k) {
                        const bool act = live && k < K && off[k] <= t;
                        dk[k] = act ? glr_dep(t, (int)off[k], (int)stride[k], ce) : -1;
                        bk[k] = act && has_b ? GLR_BETA(t, k) : (T)0;
                        yk[k] = act && has_b && dk[k] < far ? y[(row + dk[k]) * C + cc] : (T)0;
                        ak[k] = act && has_a ? alpha[(bt * NA + k + 1) * C + cc] : (T)0;
                        xk[k] = act && has_a ? x[(row + dk[k]) * C + cc] : (T)0;
                    }
#pragma unroll
                    for (int k = 0; k < GLR_NN; ++k) {
                        acc += ak[k] * xk[k];
                        if (dk[k] >= 0 && dk[k] < far) acc += bk[k] * yk[k];
                        if (dk[k] >= 0 && dk[k] == t - 1) w1 += bk[k];
                        if (dk[k] >= 0 && dk[k] == t - 2) w2 += bk[k];
                        if (k >= GLR_K2 && k < GLR_K2 + GLR_NL) {
                            const bool listed = dk[k] >= 0 && dk[k] >= far && dk[k] < t - 2;
                            rr[3 + k - GLR_K2] = listed ? bk[k] : (T)0;
                            ss[k - GLR_K2] =
                                (unsigned short)((listed ? glr_ring(dk[k], c) : ZERO + c) * sizeof(T));
                        }
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
                        bv[u] = fy ? GLR_BETA(t, k) : (T)0;
                        yv[u] = fy ? y[(row + d) * C + cc] : (T)0;
                    }
#pragma unroll
                    for (int u = 0; u < GLR_BATCH; ++u) acc += av[u] * xv[u] + bv[u] * yv[u];
                }
                rr[0] = acc;
                rr[1] = w1;
                rr[2] = w2;
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
