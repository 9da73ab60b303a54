// Softmax attention (docs/math.md §1.3): y_t = Σ_{s ≤ t, t−s < window} softmax_s(scale · q_t·k_s) v_s.
// Layouts: q [B,T,H,Dk], y [B,T,H,Dv]; k [B,Nk,H,Dk], v [B,Nk,H,Dv]. window ≤ 0 means full causal
// attention. The forward kernels take the keys of a KV cache before the queries (a run from a
// state, docs/math.md §7.1): prefix null, or P_b = prefix[b] keys before batch row b's first query,
// so that query t sits at position a = P_b + t among the keys 0 … P_b + T − 1 of its row (Nk ≥
// P_b + T rows per batch row; Nk = T and P = 0 for a plain run).

// Exact forward (FlashAttention-2 structure on FMA units, f32 for f32 inputs, f64 for f64).
// Grid (⌈T/BQ⌉, B·H), blocks longest query tile first; AX_THREADS = 256 threads seen as a
// 16 × 16 grid: ty = tid / 16 owns the AX_TM query rows q0 + ty·TM + i of the block's BQ = 16·TM,
// tx = tid % 16 owns the keys k0 + tx + 16·n (n < TN = BK/16) of every score tile and the output
// columns tx + 16·c (c < NV = ⌈Dv/16⌉). Per key tile (K, V staged in shared memory, Q staged once):
//   S = Q Kᵀ          each thread a TM × TN register tile, four dims per step from 16-byte loads;
//   u = sign(σ)·S      the CPU's overflow-free keys (`Logits`): |σ| stays out of the difference;
//   m' = max(m, max_s u), ℓ ← ℓ·w(m, m') + Σ_s w(u_s, m'), O ← O·w(m, m') + Σ_s w(u_s, m') V_s,
//   w(a, b) = 1 if |σ| = 0 or a = b, else 2^{|σ|·log2(e)·(a − b)}  (a ≤ b: never above 1),
// the row maxima by shuffles over the 16 lanes of a row group, P through shared memory, O as a
// TM × NV register tile. Masked keys (causal, window, past T) get u = −∞ and weight 0, on tiles
// that straddle a boundary only; tiles wholly outside the window are skipped. y = O / ℓ.
// Compile-time sizes (NVRTC defines): AX_DK, AX_DV (head dims), AX_TM (rows per thread), AX_BK
// (keys per tile), AX_MINB (blocks per multiprocessor for __launch_bounds__); the host's
// `attention::fast::exact_tile` chooses them and sizes the dynamic shared memory as AxLayout.
//
// Overflow: where some q·k of a visited tile is not finite in T (f32 products beyond 3.4e38), or
// the host says |σ|·log2 e is not a normal number in T (`force_exact`), the block computes its rows
// again with keys and maxima in double (`attn_row_f64` of attention_common.cuh, as the CPU's exact
// fallback), so neither a huge σ (1e308, passed as a double) nor f32 dot products beyond 3.4e38
// produce ∞ − ∞.
#ifndef AX_DK
#define AX_DK 64
#endif
#ifndef AX_DV
#define AX_DV 64
#endif
#ifndef AX_TM
#define AX_TM 8
#endif
#ifndef AX_BK
#define AX_BK 64
#endif
#ifndef AX_MINB
#define AX_MINB 1
#endif
#define AX_THREADS 256
#define AX_LANES 16
#define AX_BQ (AX_LANES * AX_TM)
#define AX_TN (AX_BK / AX_LANES)
#define AX_DKP ((AX_DK + 3) / 4 * 4)
#define AX_DVP ((AX_DV + AX_LANES - 1) / AX_LANES * AX_LANES)
#define AX_NV (AX_DVP / AX_LANES)

// 16-byte vectors of T.
template <typename T> struct AxVec;
template <> struct AxVec<float> {
    typedef float4 V;
    __device__ static void get(const float* p, float* o) {
        const float4 x = *reinterpret_cast<const float4*>(p);
        o[0] = x.x, o[1] = x.y, o[2] = x.z, o[3] = x.w;
    }
    __device__ static void put(float* p, const float* o) { *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]); }
};
template <> struct AxVec<double> {
    __device__ static void get(const double* p, double* o) {
        const double2 x = *reinterpret_cast<const double2*>(p);
        o[0] = x.x, o[1] = x.y;
    }
    __device__ static void put(double* p, const double* o) { *reinterpret_cast<double2*>(p) = make_double2(o[0], o[1]); }
};

// Shared-memory layout (elements of T): Q [BQ][KS] | K [BK][KS] | V [BK][DVP] | P [BK][PS]
// (P transposed: key-major). KS = DKP and PS = BQ, each widened by one vector where its count of
// 16-byte vectors is even, so that the rows read by eight lanes at once fall in distinct banks.
template <typename T> struct AxLayout {
    static constexpr int VW = 16 / sizeof(T);
    static constexpr int KS = (AX_DKP / VW) % 2 ? AX_DKP : AX_DKP + VW;
    static constexpr int PS = (AX_BQ / VW) % 2 ? AX_BQ : AX_BQ + VW;
    static constexpr int Q = 0, K = AX_BQ * KS, V = K + AX_BK * KS, P = V + AX_BK * AX_DVP;
};

// Rows [r0, r0 + n) of one (batch, head) of a [B,T,H,width] tensor (base at row 0, row stride tok)
// into dst[n][stride], columns past width and rows past Tn as 0.
template <typename T, int WP>
__device__ __forceinline__ void ax_load_rows(T* dst, int stride, const T* base, long long tok, int r0, int n, int Tn,
                                             int width) {
    for (int idx = threadIdx.x; idx < n * WP; idx += AX_THREADS) {
        const int r = idx / WP, d = idx % WP, row = r0 + r;
        dst[r * stride + d] = (row < Tn && d < width) ? base[(long long)row * tok + d] : (T)0;
    }
}

__device__ __forceinline__ float ax_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ double ax_exp2(double x) { return exp2(x); }
// w(a, b) above, with al2 = |σ|·log2 e.
template <typename T>
__device__ __forceinline__ T ax_weight(T al2, T a, T b) {
    return (al2 == (T)0 || a == b) ? (T)1 : ax_exp2(al2 * (a - b));
}

template <typename T>
__device__ void attn_exact(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ y,
                           int Tn, int H, int window, double scale, int force_exact, const int* prefix, int Nk) {
    typedef AxLayout<T> L;
    typedef AxVec<T> Vec;
    constexpr int VW = L::VW;
    extern __shared__ __align__(16) unsigned char ax_raw[];
    T* sm = reinterpret_cast<T*>(ax_raw);
    T *qs = sm + L::Q, *ks = sm + L::K, *vs = sm + L::V, *ps = sm + L::P;
    __shared__ int overflow;
    const int tid = threadIdx.x, tx = tid % AX_LANES, ty = tid / AX_LANES;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * AX_BQ;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const long long tk = (long long)H * AX_DK, tv = (long long)H * AX_DV;
    const T* qb = q + (long long)b * Tn * tk + (long long)h * AX_DK;
    const T* kb = k + (long long)b * Nk * tk + (long long)h * AX_DK;
    const T* vb = v + (long long)b * Nk * tv + (long long)h * AX_DV;
    T* yb = y + (long long)b * Tn * tv + (long long)h * AX_DV;
    // Positions among the keys: the block's first query a0, its last a_last; Tk keys.
    const int P = prefix ? prefix[b] : 0, Tk = P + Tn, a0 = q0 + P;
    const int a_last = min(q0 + AX_BQ, Tn) - 1 + P;
    const int first = window > 0 ? max(0, a0 - window + 1) / AX_BK : 0, last = a_last / AX_BK;
    const T sg = scale < 0.0 ? (T)-1 : (T)1;
    const T al2 = (T)(fabs(scale) * 1.4426950408889634);
    const T ninf = Lim<T>::neg_inf();
    if (tid == 0) overflow = force_exact;
    ax_load_rows<T, AX_DKP>(qs, L::KS, qb, tk, q0, AX_BQ, Tn, AX_DK);

    T o[AX_TM][AX_NV], m[AX_TM], l[AX_TM];
#pragma unroll
    for (int i = 0; i < AX_TM; ++i) {
        m[i] = ninf;
        l[i] = (T)0;
#pragma unroll
        for (int c = 0; c < AX_NV; ++c) o[i][c] = (T)0;
    }
    const int row0 = q0 + ty * AX_TM;
    for (int j = first; j <= last; ++j) {
        const int k0 = j * AX_BK;
        __syncthreads();  // every thread is done with the last tile's K, V, P (and Q is staged)
        if (overflow) break;
        ax_load_rows<T, AX_DKP>(ks, L::KS, kb, tk, k0, AX_BK, Tk, AX_DK);
        ax_load_rows<T, AX_DVP>(vs, AX_DVP, vb, tv, k0, AX_BK, Tk, AX_DV);
        __syncthreads();
        // S = Q Kᵀ, four dims per step.
        T s[AX_TM][AX_TN];
#pragma unroll
        for (int i = 0; i < AX_TM; ++i)
#pragma unroll
            for (int n = 0; n < AX_TN; ++n) s[i][n] = (T)0;
#pragma unroll 1
        for (int d = 0; d < AX_DKP; d += 4) {
            T kr[AX_TN][4];
#pragma unroll
            for (int n = 0; n < AX_TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; e += VW) Vec::get(ks + (tx + AX_LANES * n) * L::KS + d + e, kr[n] + e);
#pragma unroll
            for (int i = 0; i < AX_TM; ++i) {
                T qr[4];
#pragma unroll
                for (int e = 0; e < 4; e += VW) Vec::get(qs + (ty * AX_TM + i) * L::KS + d + e, qr + e);
#pragma unroll
                for (int n = 0; n < AX_TN; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[i][n] = fma(qr[e], kr[n][e], s[i][n]);
            }
        }
        // Keys, the overflow check, masks.
        bool bad = false;
        const bool edge = k0 + AX_BK - 1 > a0 || k0 + AX_BK > Tk || (window > 0 && a0 + AX_BQ - 1 - k0 >= window);
#pragma unroll
        for (int i = 0; i < AX_TM; ++i)
#pragma unroll
            for (int n = 0; n < AX_TN; ++n) {
                bad = bad || !isfinite(s[i][n]);
                s[i][n] *= sg;
                if (edge) {
                    const int r = P + row0 + i, c = k0 + tx + AX_LANES * n;
                    if (c > r || c >= Tk || (window > 0 && r - c >= window)) s[i][n] = ninf;
                }
            }
        if (bad) atomicExch(&overflow, 1);  // atomic: many threads may set it at once
        // Online softmax per row (the 16 lanes of a row group hold the same m and correction).
        bool moved = false;
        T cf[AX_TM];
#pragma unroll
        for (int i = 0; i < AX_TM; ++i) {
            T mx = s[i][0];
#pragma unroll
            for (int n = 1; n < AX_TN; ++n) mx = fmax(mx, s[i][n]);
#pragma unroll
            for (int o2 = AX_LANES / 2; o2 > 0; o2 >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o2));
            mx = fmax(m[i], mx);
            cf[i] = ax_weight(al2, m[i], mx);
            moved = moved || cf[i] != (T)1;
            m[i] = mx;
            T sum = (T)0;
#pragma unroll
            for (int n = 0; n < AX_TN; ++n) {
                const T p = s[i][n] == ninf ? (T)0 : ax_weight(al2, s[i][n], mx);
                s[i][n] = p;
                sum += p;
            }
            l[i] = l[i] * cf[i] + sum;
        }
        if (moved)
#pragma unroll
            for (int i = 0; i < AX_TM; ++i)
#pragma unroll
                for (int c = 0; c < AX_NV; ++c) o[i][c] *= cf[i];
        // P to shared memory, key-major: the TM rows of a key as TM / VW vectors.
#pragma unroll
        for (int n = 0; n < AX_TN; ++n) {
            T pr[AX_TM];
#pragma unroll
            for (int i = 0; i < AX_TM; ++i) pr[i] = s[i][n];
#pragma unroll
            for (int i = 0; i < AX_TM; i += VW) Vec::put(ps + (tx + AX_LANES * n) * L::PS + ty * AX_TM + i, pr + i);
        }
        __syncthreads();
        // O += P V.
#pragma unroll 4
        for (int kk = 0; kk < AX_BK; ++kk) {
            T pr[AX_TM], vr[AX_NV];
#pragma unroll
            for (int i = 0; i < AX_TM; i += VW) Vec::get(ps + kk * L::PS + ty * AX_TM + i, pr + i);
#pragma unroll
            for (int c = 0; c < AX_NV; ++c) vr[c] = vs[kk * AX_DVP + tx + AX_LANES * c];
#pragma unroll
            for (int i = 0; i < AX_TM; ++i)
#pragma unroll
                for (int c = 0; c < AX_NV; ++c) o[i][c] = fma(pr[i], vr[c], o[i][c]);
        }
    }
    __syncthreads();  // the last tile's overflow flag is visible; K, V are free for the fallback
    if (overflow) {
        if (tid < AX_BQ && q0 + tid < Tn) attn_row_f64<T>(qb, kb, vb, yb, tk, tv, AX_DK, AX_DV, q0 + tid, P, window, scale);
        return;
    }
#pragma unroll
    for (int i = 0; i < AX_TM; ++i) {
        T lt = l[i];
#pragma unroll
        for (int o2 = AX_LANES / 2; o2 > 0; o2 >>= 1) lt += __shfl_xor_sync(0xffffffffu, lt, o2);
        const int r = row0 + i;
        if (r < Tn) {
            const T inv = (T)1 / lt;
#pragma unroll
            for (int c = 0; c < AX_NV; ++c) {
                const int col = tx + AX_LANES * c;
                if (col < AX_DV) yb[(long long)r * tv + col] = o[i][c] * inv;
            }
        }
    }
}

// Decode step over a device KV cache of n entries (ring buffer rows [cap, B, H, D]; the
// order of entries does not matter to softmax), split over the keys (flash-decoding):
//
// attn_split: grid (B·H, S), block ATTN_SPLIT_THREADS (8 warps); block s takes keys
// [s·ATTN_SPLIT_KEYS, (s+1)·ATTN_SPLIT_KEYS) ∩ [0, n) and writes the partial
// (m_s, l_s, a_s) = (max key, Σ e^{|scale|(u−m_s)}, Σ e^{|scale|(u−m_s)} v) to part[bh, s, :]
// (2 + Dv doubles), with the overflow-free keys u = sign(scale)·(q·k) in double. Each warp owns 32
// consecutive keys; its lanes split the head dimension, so every cache row is read by one warp
// in coalesced 128-byte pieces, eight rows in flight per lane, and the dot products are finished
// with warp shuffles. Dynamic shared memory: [8][Dv] doubles, each warp's weighted-value sums,
// added in a fixed order (the result does not depend on scheduling).
// attn_combine: one block per (b, h): M = max_s m_s, y = Σ_s e^{|scale|(m_s−M)} a_s /
// Σ_s e^{|scale|(m_s−M)} l_s (below).
// Sum (or maximum) of v over the block, returned to every thread; red holds one double per warp.
__device__ inline double attn_block_reduce(double v, bool is_max, double* red) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const double u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmax(v, u) : v + u;
    }
    if (lane == 0) red[w] = v;
    __syncthreads();
    double r = red[0];
    for (int i = 1; i < nw; ++i) r = is_max ? fmax(r, red[i]) : r + red[i];
    __syncthreads();
    return r;
}

#define ATTN_SPLIT_KEYS 256
#define ATTN_SPLIT_THREADS 256
#define ATTN_SPLIT_ROWS 8

template <typename T>
__device__ void attn_split(const T* q, const T* kc, const T* vc, double* part, int B, int H, int Dk, int Dv, int n,
                           double scale) {
    __shared__ double u[ATTN_SPLIT_KEYS];
    __shared__ double red[ATTN_SPLIT_THREADS / 32];
    extern __shared__ double attn_acc[];
    const double asc = fabs(scale), sg = scale < 0.0 ? -1.0 : 1.0;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, s = blockIdx.y, tid = threadIdx.x;
    const int w = tid >> 5, lane = tid & 31, warps = ATTN_SPLIT_THREADS / 32;
    const int j0 = s * ATTN_SPLIT_KEYS, cnt = min(ATTN_SPLIT_KEYS, n - j0);
    const long long rk = (long long)B * H * Dk, rv = (long long)B * H * Dv;
    const T* qr = q + ((long long)b * H + h) * Dk;
    const T* kb = kc + (long long)j0 * rk + ((long long)b * H + h) * Dk;
    const T* vb = vc + (long long)j0 * rv + ((long long)b * H + h) * Dv;
    const int kw0 = w * (ATTN_SPLIT_KEYS / warps), kw1 = min(cnt, kw0 + ATTN_SPLIT_KEYS / warps);
    double mloc = Lim<double>::neg_inf();
    for (int jb = kw0; jb < kw1; jb += ATTN_SPLIT_ROWS) {
        double dot[ATTN_SPLIT_ROWS];
#pragma unroll
        for (int e = 0; e < ATTN_SPLIT_ROWS; ++e) dot[e] = 0.0;
        for (int d = lane; d < Dk; d += 32) {
            const double qd = (double)qr[d];
            T kv[ATTN_SPLIT_ROWS];
#pragma unroll
            for (int e = 0; e < ATTN_SPLIT_ROWS; ++e) kv[e] = jb + e < kw1 ? kb[(jb + e) * rk + d] : (T)0;
#pragma unroll
            for (int e = 0; e < ATTN_SPLIT_ROWS; ++e) dot[e] += qd * (double)kv[e];
        }
#pragma unroll
        for (int e = 0; e < ATTN_SPLIT_ROWS; ++e) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) dot[e] += __shfl_xor_sync(0xffffffffu, dot[e], o);
            if (jb + e < kw1) {
                mloc = fmax(mloc, sg * dot[e]);
                if (lane == 0) u[jb + e] = sg * dot[e];
            }
        }
    }
    const double mx = attn_block_reduce(mloc, true, red);
    double lsum = 0.0;
    for (int j = tid; j < cnt; j += ATTN_SPLIT_THREADS) {
        u[j] = attn_weight(asc, u[j], mx);
        lsum += u[j];
    }
    const double l = attn_block_reduce(lsum, false, red);
    for (int d = lane; d < Dv; d += 32) {
        double a = 0.0;
        for (int jb = kw0; jb < kw1; jb += ATTN_SPLIT_ROWS) {
            T vv[ATTN_SPLIT_ROWS];
#pragma unroll
            for (int e = 0; e < ATTN_SPLIT_ROWS; ++e) vv[e] = jb + e < kw1 ? vb[(jb + e) * rv + d] : (T)0;
#pragma unroll
            for (int e = 0; e < ATTN_SPLIT_ROWS; ++e)
                if (jb + e < kw1) a += u[jb + e] * (double)vv[e];
        }
        attn_acc[w * Dv + d] = a;
    }
    __syncthreads();
    double* out = part + ((long long)bh * gridDim.y + s) * (2 + Dv);
    if (tid == 0) {
        out[0] = mx;
        out[1] = l;
    }
    for (int d = tid; d < Dv; d += ATTN_SPLIT_THREADS) {
        double a = 0.0;
        for (int i = 0; i < warps; ++i) a += attn_acc[i * Dv + d];
        out[2 + d] = a;
    }
}

// attn_combine, block of ATTN_COMBINE_THREADS: M and L by block reductions over the splits, the
// split weights e^{|scale|(m_s−M)} computed once per chunk of splits into shared memory, then
// one thread per output column.
#define ATTN_COMBINE_THREADS 128
#define ATTN_COMBINE_CHUNK 512

template <typename T>
__device__ void attn_combine(const double* part, T* y, int H, int Dv, int S, double scale) {
    __shared__ double wsh[ATTN_COMBINE_CHUNK];
    __shared__ double red[32];
    const double asc = fabs(scale);
    const int bh = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const long long stride = 2 + Dv;
    const double* p = part + (long long)bh * S * stride;
    double M = Lim<double>::neg_inf();
    for (int s = tid; s < S; s += nt) M = fmax(M, p[s * stride]);
    M = attn_block_reduce(M, true, red);
    double L = 0.0;
    for (int s = tid; s < S; s += nt) L += attn_weight(asc, p[s * stride], M) * p[s * stride + 1];
    L = attn_block_reduce(L, false, red);
    for (int d0 = 0; d0 < Dv; d0 += nt) {
        const int d = d0 + tid;
        double a = 0.0;
        for (int s0 = 0; s0 < S; s0 += ATTN_COMBINE_CHUNK) {
            const int n = min(ATTN_COMBINE_CHUNK, S - s0);
            for (int j = tid; j < n; j += nt) wsh[j] = attn_weight(asc, p[(s0 + j) * stride], M);
            __syncthreads();
            if (d < Dv) {
                const double* col = p + s0 * stride + 2 + d;
#pragma unroll 8
                for (int j = 0; j < n; ++j) a += wsh[j] * col[j * stride];
            }
            __syncthreads();
        }
        if (d < Dv) y[(long long)bh * Dv + d] = (T)(a / L);
    }
}

#define ATTN_EXPORT(T, S)                                                                                        \
    extern "C" __global__ void attn_split_##S(const T* q, const T* kc, const T* vc, double* part, int B, int H,  \
                                              int Dk, int Dv, int n, double scale) {                             \
        attn_split<T>(q, kc, vc, part, B, H, Dk, Dv, n, scale);                                                  \
    }                                                                                                            \
    extern "C" __global__ void attn_combine_##S(const double* part, T* y, int H, int Dv, int S, double scale) {  \
        attn_combine<T>(part, y, H, Dv, S, scale);                                                               \
    }

ATTN_EXPORT(float, f32)
ATTN_EXPORT(double, f64)

// The exact forward of one scalar type per module (its tile sizes are chosen per type):
// attn_exact_f64 with -DAX_ELEM_F64=1, attn_exact_f32 otherwise.
#ifdef AX_ELEM_F64
#define AX_T double
#define AX_NAME attn_exact_f64
#else
#define AX_T float
#define AX_NAME attn_exact_f32
#endif
static_assert(AX_TM % AxLayout<AX_T>::VW == 0 && AX_BK % AX_LANES == 0, "AX_TM: whole vectors; AX_BK: 16 lanes");
extern "C" __global__ void __launch_bounds__(AX_THREADS, AX_MINB)
    AX_NAME(const AX_T* q, const AX_T* k, const AX_T* v, AX_T* y, int Tn, int H, int window, double scale,
            int force_exact, const int* prefix, int Nk) {
    attn_exact<AX_T>(q, k, v, y, Tn, H, window, scale, force_exact, prefix, Nk);
}
