// Softmax attention (docs/math.md §1.3): y_t = Σ_{s ≤ t, t−s < window} softmax_s(scale · q_t·k_s) v_s.
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]. window ≤ 0 means full causal attention.

// Tiled online-softmax forward. Grid (⌈T/BQ⌉, B·H); block BQ threads, one query row each.
// Dynamic shared memory: q tile [BQ,Dk], accumulators [BQ,Dv], key tile [BK,Dk], value tile
// [BK,Dv]. For every key tile: the tile's running maximum m', rescale (l, acc) by e^{m−m'},
// add e^{score−m'}·v. Scores are masked before exponentiating.
//
// Overflow-free logits (the CPU's `Logits`): the dot product q·k is accumulated in double and
// kept as the key u = sign(scale)·(q·k); maxima are over keys, and weights are
// e^{|scale|·(u − max u)} ≤ 1, so neither a huge scale (1e308, passed as a double) nor f32 inputs
// with q·k beyond 3.4e38 produce ∞ − ∞.
__device__ inline double attn_weight(double abs_scale, double key, double max_key) {
    return (abs_scale == 0.0 || key == max_key) ? 1.0 : exp(abs_scale * (key - max_key));
}

template <typename T>
__device__ inline double attn_dot(const T* a, const T* b, int n) {
    double s = 0.0;
    for (int d = 0; d < n; ++d) s += (double)a[d] * (double)b[d];
    return s;
}

template <typename T>
__device__ void attn_fwd(const T* q, const T* k, const T* v, T* y, int B, int Tn, int H, int Dk, int Dv, int window,
                         double scale, int BK) {
    const double asc = fabs(scale), sg = scale < 0.0 ? -1.0 : 1.0;
    extern __shared__ unsigned char smem_raw[];
    T* sm = reinterpret_cast<T*>(smem_raw);
    const int BQ = blockDim.x;
    T* qs = sm;
    T* acc = qs + BQ * Dk;
    T* ks = acc + BQ * Dv;
    T* vs = ks + BK * Dk;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int t0 = blockIdx.x * BQ, i = threadIdx.x, t = t0 + i;
    const bool active = t < Tn;
    if (active) {
        for (int d = 0; d < Dk; ++d) qs[i * Dk + d] = q[(((long long)b * Tn + t) * H + h) * Dk + d];
        for (int d = 0; d < Dv; ++d) acc[i * Dv + d] = (T)0;
    }
    double m = Lim<double>::neg_inf();
    T l = (T)0;
    const int t_last = min(t0 + BQ, Tn) - 1;
    const int s_begin = window > 0 ? max(0, t0 - window + 1) : 0;
    for (int s0 = s_begin; s0 <= t_last; s0 += BK) {
        __syncthreads();
        for (int idx = i; idx < BK * Dk; idx += BQ) {
            int j = idx / Dk, d = idx % Dk, s = s0 + j;
            ks[idx] = s <= t_last ? k[(((long long)b * Tn + s) * H + h) * Dk + d] : (T)0;
        }
        for (int idx = i; idx < BK * Dv; idx += BQ) {
            int j = idx / Dv, d = idx % Dv, s = s0 + j;
            vs[idx] = s <= t_last ? v[(((long long)b * Tn + s) * H + h) * Dv + d] : (T)0;
        }
        __syncthreads();
        if (!active) continue;
        const int lo = window > 0 ? max(s0, t - window + 1) : s0;
        const int hi = min(s0 + BK - 1, t);
        if (lo > hi) continue;
        double mt = m;
        for (int s = lo; s <= hi; ++s) mt = fmax(mt, sg * attn_dot(qs + i * Dk, ks + (s - s0) * Dk, Dk));
        const T corr = (T)attn_weight(asc, m, mt);
        l *= corr;
        for (int d = 0; d < Dv; ++d) acc[i * Dv + d] *= corr;
        for (int s = lo; s <= hi; ++s) {
            const T p = (T)attn_weight(asc, sg * attn_dot(qs + i * Dk, ks + (s - s0) * Dk, Dk), mt);
            l += p;
            const T* vr = vs + (s - s0) * Dv;
            for (int d = 0; d < Dv; ++d) acc[i * Dv + d] += p * vr[d];
        }
        m = mt;
    }
    if (active) {
        for (int d = 0; d < Dv; ++d) y[(((long long)b * Tn + t) * H + h) * Dv + d] = acc[i * Dv + d] / l;
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
    extern "C" __global__ void attn_fwd_##S(const T* q, const T* k, const T* v, T* y, int B, int Tn, int H,      \
                                            int Dk, int Dv, int window, double scale, int BK) {                  \
        attn_fwd<T>(q, k, v, y, B, Tn, H, Dk, Dv, window, scale, BK);                                            \
    }                                                                                                            \
    extern "C" __global__ void attn_split_##S(const T* q, const T* kc, const T* vc, double* part, int B, int H,  \
                                              int Dk, int Dv, int n, double scale) {                             \
        attn_split<T>(q, kc, vc, part, B, H, Dk, Dv, n, scale);                                                  \
    }                                                                                                            \
    extern "C" __global__ void attn_combine_##S(const double* part, T* y, int H, int Dv, int S, double scale) {  \
        attn_combine<T>(part, y, H, Dv, S, scale);                                                               \
    }

ATTN_EXPORT(float, f32)
ATTN_EXPORT(double, f64)
