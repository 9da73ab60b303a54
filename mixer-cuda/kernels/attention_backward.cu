// The backward pass of softmax attention (docs/gradients.md), FlashAttention-2 style, in three
// launches per call, none with atomics (every output element is written by one thread):
//
//   atb_stats: per query tile, the forward recomputed with an online softmax, keeping per row
//              M_t = max_s u_{t,s} (double), ln ℓ_t with ℓ_t = Σ_s e^{|σ|(u_{t,s} − M_t)}, and
//              D_t = dy_t · y_t (y_t = Σ_s e^{|σ|(u − M)} v_s / ℓ_t is formed in registers, never
//              written);
//   atb_dkdv:  per key tile, over the query tiles that see it: dv_s = Σ_t P_{t,s} dy_t,
//              dk_s = σ Σ_t dS_{t,s} q_t;
//   atb_dq:    per query tile, over the key tiles it sees: dq_t = σ Σ_s dS_{t,s} k_s;
//
// with the keys u_{t,s} = sign(σ)·(q_t · k_s) (the overflow-free logits of attention.cu and the
// CPU), P_{t,s} = e^{|σ|(u_{t,s} − M_t) − ln ℓ_t} on the visible keys (s ≤ t, t − s < window;
// 0 elsewhere) and dS_{t,s} = P_{t,s} (dy_t · v_s − D_t).
//
// Layouts: q, k [B,T,H,Dk]; v, dy, dv [B,T,H,Dv]; dq, dk [B,T,H,Dk]; M, lnl, D [B·H, T].
// window ≤ 0 means full causal attention.
//
// Compile-time sizes: ATB_DK, ATB_DV (head dims, any values up to 256) and ATB_B (the tile: ATB_B
// queries per query tile and ATB_B keys per key tile; 16, 32 or 64). Blocks of 256 threads as a
// 16 × 16 grid (ty, tx); a thread owns rows ty + 16i and columns tx + 16j of every tile
// (register tiles of ATB_B/16 rows): the scores of its (query, key) pairs, and the columns of its
// rows of the accumulators (o in atb_stats, dk and dv in atb_dkdv, dq in atb_dq). Tiles sit in
// shared memory with odd row strides (conflict-free column reads by the 16 lanes of a row).
//
// The three kernels compute a tile's scores with the same code on the same tiles (query and
// key tiles aligned to multiples of ATB_B), so u_{t,s} has the same bits in each and
// u − M ≤ 0 holds exactly. Overflow: in f32 a dot product can exceed 3.4e38; a tile where
// some |q| or |k| exceeds √(1e37 / Dk) forms its dot products in double instead (the same
// decision in every kernel), and the row maxima are kept in double, so logits near or beyond
// the f32 range give weights in [0, 1], never ∞ − ∞.

#ifndef ATB_DK
#define ATB_DK 64
#endif
#ifndef ATB_DV
#define ATB_DV 64
#endif
#ifndef ATB_B
#define ATB_B 64
#endif

#define ATB_THREADS 256
#define ATB_R (ATB_B / 16)
#define ATB_NK (ATB_DK > 0 ? (ATB_DK + 15) / 16 : 1)
#define ATB_NV (ATB_DV > 0 ? (ATB_DV + 15) / 16 : 1)
// Odd row strides of the shared tiles.
#define ATB_SK (ATB_DK | 1)
#define ATB_SV (ATB_DV | 1)
#define ATB_SP (ATB_B + 1)

__device__ __forceinline__ float atb_fma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double atb_fma(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float atb_abs(float a) { return fabsf(a); }
__device__ __forceinline__ double atb_abs(double a) { return fabs(a); }
__device__ __forceinline__ float atb_log(float a) { return logf(a); }
__device__ __forceinline__ double atb_log(double a) { return log(a); }

// Inputs above this magnitude make a tile's f32 dot products risky (Dk·lim² = 1e37 < 3.4e38).
template <typename T> struct AtbLim;
template <> struct AtbLim<float> {
    __device__ static float value() { return sqrtf(1.0e37f / (float)(ATB_DK > 0 ? ATB_DK : 1)); }
};
template <> struct AtbLim<double> {
    __device__ static double value() { return __longlong_as_double(0x7ff0000000000000ULL); }
};

// Whether query t sees key s.
__device__ __forceinline__ bool atb_visible(int t, int s, int Tn, int window) {
    return t < Tn && s <= t && (window <= 0 || t - s < window);
}

// Rows [t0, t0 + ATB_B) of one head of x (row stride rs, row width D) into s (row stride SD),
// zeros past Tn. Returns whether an element this thread loaded exceeds lim in magnitude.
template <typename T, int D, int SD>
__device__ inline bool atb_load(T* s, const T* x, long long rs, int t0, int Tn, T lim) {
    bool big = false;
    for (int idx = threadIdx.x; idx < ATB_B * D; idx += ATB_THREADS) {
        const int r = D > 0 ? idx / D : 0, d = idx - r * D, t = t0 + r;
        const T v = t < Tn ? x[(long long)t * rs + d] : (T)0;
        big |= atb_abs(v) > lim;
        s[r * SD + d] = v;
    }
    return big;
}

// u[i][j] = Σ_d X[ty + 16i][d] · Y[tx + 16j][d] in A, from shared tiles (row strides SX, SY).
template <typename A, typename T, int D, int SX, int SY>
__device__ inline void atb_dots(A (&u)[ATB_R][ATB_R], const T* X, const T* Y) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
#pragma unroll
    for (int i = 0; i < ATB_R; ++i)
#pragma unroll
        for (int j = 0; j < ATB_R; ++j) u[i][j] = (A)0;
#pragma unroll 4
    for (int d = 0; d < D; ++d) {
        A a[ATB_R], b[ATB_R];
#pragma unroll
        for (int i = 0; i < ATB_R; ++i) a[i] = (A)X[(ty + 16 * i) * SX + d];
#pragma unroll
        for (int j = 0; j < ATB_R; ++j) b[j] = (A)Y[(tx + 16 * j) * SY + d];
#pragma unroll
        for (int i = 0; i < ATB_R; ++i)
#pragma unroll
            for (int j = 0; j < ATB_R; ++j) u[i][j] = atb_fma(a[i], b[j], u[i][j]);
    }
}

// The 16 lanes of a row (the lanes with one ty): sum and maximum.
template <typename A>
__device__ __forceinline__ A atb_row_sum(A v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A>
__device__ __forceinline__ A atb_row_max(A v) {
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
        const A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// e^{|σ|(key − mx)} for key ≤ mx (1 where they are equal or σ = 0; 0 for key − mx = −∞).
template <typename T>
__device__ __forceinline__ T atb_weight(T asc, double key, double mx) {
    if (asc == (T)0 || key == mx) return (T)1;
    const T x = (T)(key - mx);
    return x == (T)0 ? (T)1 : mx_exp(asc * x);
}

// P = e^{|σ|(key − M) − ln ℓ} (key ≤ M; clamped there, which only the exact maximum reaches).
template <typename T>
__device__ __forceinline__ T atb_prob(T asc, double key, double M, T lnl) {
    const T x = (T)fmin(key - M, 0.0);
    return mx_exp((asc == (T)0 || x == (T)0) ? -lnl : asc * x - lnl);
}

// --- atb_stats ------------------------------------------------------------------------------

// One key tile of the online softmax of the thread's rows: scores, masks, new maxima, weights
// into Ps, rescaled sums and accumulators, then o += P V.
template <typename A, typename T>
__device__ inline void atb_stats_tile(const T* Qs, const T* Ks, const T* Vs, T* Ps, double (&m)[ATB_R],
                                      T (&l)[ATB_R], T (&o)[ATB_R][ATB_NV], int q0, int k0, int Tn, int window,
                                      double sg, T asc) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    A u[ATB_R][ATB_R];
    atb_dots<A, T, ATB_DK, ATB_SK, ATB_SK>(u, Qs, Ks);
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        const int r = ty + 16 * i, t = q0 + r;
        A mx = Lim<A>::neg_inf();
#pragma unroll
        for (int j = 0; j < ATB_R; ++j) {
            u[i][j] *= (A)sg;
            if (atb_visible(t, k0 + tx + 16 * j, Tn, window)) mx = u[i][j] > mx ? u[i][j] : mx;
        }
        mx = atb_row_max(mx);
        const double mn = fmax(m[i], (double)mx);
        const T corr = atb_weight<T>(asc, m[i], mn);
        T sum = (T)0;
#pragma unroll
        for (int j = 0; j < ATB_R; ++j) {
            const int c = tx + 16 * j;
            const T p = atb_visible(t, k0 + c, Tn, window) ? atb_weight<T>(asc, (double)u[i][j], mn) : (T)0;
            Ps[r * ATB_SP + c] = p;
            sum += p;
        }
        l[i] = l[i] * corr + atb_row_sum(sum);
        m[i] = mn;
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) o[i][j] *= corr;
    }
    __syncthreads();
#pragma unroll 4
    for (int s = 0; s < ATB_B; ++s) {
        T vv[ATB_NV];
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) {
            const int c = tx + 16 * j;
            vv[j] = c < ATB_DV ? Vs[s * ATB_SV + c] : (T)0;
        }
#pragma unroll
        for (int i = 0; i < ATB_R; ++i) {
            const T p = Ps[(ty + 16 * i) * ATB_SP + s];
#pragma unroll
            for (int j = 0; j < ATB_NV; ++j) o[i][j] = atb_fma(p, vv[j], o[i][j]);
        }
    }
}

// Grid (B·H, ⌈T/ATB_B⌉), the longest query tiles first. Dynamic shared memory: Qs, Ks
// [ATB_B][ATB_SK], Vs [ATB_B][ATB_SV], Ps [ATB_B][ATB_SP].
template <typename T>
__device__ void atb_stats(const T* q, const T* k, const T* v, const T* dy, double* Mo, T* Lo, T* Do, int Tn, int H,
                          int window, double scale) {
    extern __shared__ double atb_smem_d[];
    T* Qs = reinterpret_cast<T*>(atb_smem_d);
    T* Ks = Qs + ATB_B * ATB_SK;
    T* Vs = Ks + ATB_B * ATB_SK;
    T* Ps = Vs + ATB_B * ATB_SV;
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATB_B;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const long long rk = (long long)H * ATB_DK, rv = (long long)H * ATB_DV;
    const T* kh = k + ((long long)b * Tn * H + h) * ATB_DK;
    const T* vh = v + ((long long)b * Tn * H + h) * ATB_DV;
    const T* dyh = dy + ((long long)b * Tn * H + h) * ATB_DV;
    const T lim = AtbLim<T>::value(), asc = (T)fabs(scale);
    const double sg = scale < 0.0 ? -1.0 : 1.0;
    const bool qbig = atb_load<T, ATB_DK, ATB_SK>(Qs, q + ((long long)b * Tn * H + h) * ATB_DK, rk, q0, Tn, lim);
    double m[ATB_R];
    T l[ATB_R], o[ATB_R][ATB_NV];
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        m[i] = Lim<double>::neg_inf();
        l[i] = (T)0;
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) o[i][j] = (T)0;
    }
    const int qlast = min(q0 + ATB_B, Tn) - 1;
    const int kfirst = window > 0 ? max(0, q0 - window + 1) : 0;
    for (int k0 = (kfirst / ATB_B) * ATB_B; k0 <= qlast; k0 += ATB_B) {
        __syncthreads();
        const bool kbig = atb_load<T, ATB_DK, ATB_SK>(Ks, kh, rk, k0, Tn, lim);
        atb_load<T, ATB_DV, ATB_SV>(Vs, vh, rv, k0, Tn, lim);
        if (__syncthreads_or(qbig || kbig))
            atb_stats_tile<double, T>(Qs, Ks, Vs, Ps, m, l, o, q0, k0, Tn, window, sg, asc);
        else
            atb_stats_tile<T, T>(Qs, Ks, Vs, Ps, m, l, o, q0, k0, Tn, window, sg, asc);
    }
    // y = o / ℓ into the rows of Vs, then D_t = Σ_d dy_{t,d} y_{t,d} by one thread per row in the
    // order of d, as atb_pds forms dy_t · v_s: where a row's softmax is one-hot (y_t = v_s
    // exactly), D_t equals that dot product bit for bit and dS_{t,s} is exactly 0.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        const int r = ty + 16 * i, t = q0 + r;
        const T inv = t < Tn ? (T)1 / l[i] : (T)0;
        if (t < Tn && tx == 0) {
            Mo[(long long)bh * Tn + t] = m[i];
            Lo[(long long)bh * Tn + t] = atb_log(l[i]);
        }
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) {
            const int c = tx + 16 * j;
            if (c < ATB_DV) Vs[r * ATB_SV + c] = o[i][j] * inv;
        }
    }
    __syncthreads();
    for (int r = threadIdx.x; r < ATB_B; r += ATB_THREADS) {
        const int t = q0 + r;
        if (t >= Tn) continue;
        const T* g = dyh + (long long)t * rv;
        T dd = (T)0;
        for (int d = 0; d < ATB_DV; ++d) dd = atb_fma(g[d], Vs[r * ATB_SV + d], dd);
        const long long at = (long long)bh * Tn + t;
        Do[at] = dd;
    }
}

// --- the tiles of P and dS -------------------------------------------------------------------

// P (into Ps unless null) and dS (into Ss) of one (query tile, key tile) pair, from the shared
// tiles Qs, Ks [ATB_B][ATB_SK], Gs (dy), Vs [ATB_B][ATB_SV] and the rows' M, ln ℓ, D.
template <typename A, typename T>
__device__ inline void atb_pds(const T* Qs, const T* Ks, const T* Vs, const T* Gs, const double* Ms, const T* Ls,
                               const T* Ds, T* Ps, T* Ss, int q0, int k0, int Tn, int window, double sg, T asc) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    A u[ATB_R][ATB_R];
    atb_dots<A, T, ATB_DK, ATB_SK, ATB_SK>(u, Qs, Ks);
    T dp[ATB_R][ATB_R];
    atb_dots<T, T, ATB_DV, ATB_SV, ATB_SV>(dp, Gs, Vs);
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        const int r = ty + 16 * i, t = q0 + r;
#pragma unroll
        for (int j = 0; j < ATB_R; ++j) {
            const int c = tx + 16 * j;
            T p = (T)0;
            if (atb_visible(t, k0 + c, Tn, window)) p = atb_prob<T>(asc, (double)(u[i][j] * (A)sg), Ms[r], Ls[r]);
            if (Ps) Ps[r * ATB_SP + c] = p;
            Ss[r * ATB_SP + c] = p * (dp[i][j] - Ds[r]);
        }
    }
}

// The rows [t0, t0 + ATB_B) of M, ln ℓ and D of head bh (zeros past Tn).
template <typename T>
__device__ inline void atb_load_stats(double* Ms, T* Ls, T* Ds, const double* M, const T* L, const T* D, int bh,
                                      int t0, int Tn) {
    for (int r = threadIdx.x; r < ATB_B; r += ATB_THREADS) {
        const int t = t0 + r;
        const long long at = (long long)bh * Tn + t;
        Ms[r] = t < Tn ? M[at] : 0.0;
        Ls[r] = t < Tn ? L[at] : (T)0;
        Ds[r] = t < Tn ? D[at] : (T)0;
    }
}

// The dynamic shared memory of atb_dkdv and atb_dq: Ms [ATB_B] doubles, then Qs, Ks
// [ATB_B][ATB_SK], Gs, Vs [ATB_B][ATB_SV], Ps, Ss [ATB_B][ATB_SP], Ls, Ds [ATB_B].
template <typename T>
struct AtbTiles {
    double* Ms;
    T *Qs, *Ks, *Gs, *Vs, *Ps, *Ss, *Ls, *Ds;
    __device__ explicit AtbTiles(double* raw) {
        Ms = raw;
        Qs = reinterpret_cast<T*>(raw + ATB_B);
        Ks = Qs + ATB_B * ATB_SK;
        Gs = Ks + ATB_B * ATB_SK;
        Vs = Gs + ATB_B * ATB_SV;
        Ps = Vs + ATB_B * ATB_SV;
        Ss = Ps + ATB_B * ATB_SP;
        Ls = Ss + ATB_B * ATB_SP;
        Ds = Ls + ATB_B;
    }
};

// acc[i][j] += w[i] · X[t][tx + 16j] for the thread's rows i and columns j (row t of a shared
// tile of row stride S and width D; columns past D add 0).
template <typename T, int N, int D, int S>
__device__ __forceinline__ void atb_axpy(T (&acc)[ATB_R][N], const T (&w)[ATB_R], const T* X, int t) {
    const int tx = threadIdx.x & 15;
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const int c = tx + 16 * j;
        const T x = c < D ? X[t * S + c] : (T)0;
#pragma unroll
        for (int i = 0; i < ATB_R; ++i) acc[i][j] = atb_fma(w[i], x, acc[i][j]);
    }
}

// --- atb_dkdv --------------------------------------------------------------------------------

// Grid (B·H, ⌈T/ATB_B⌉), key tile blockIdx.y (the first keys, seen by the most queries, first).
template <typename T>
__device__ void atb_dkdv(const T* q, const T* k, const T* v, const T* dy, const double* M, const T* L, const T* D,
                         T* dk, T* dv, int Tn, int H, int window, double scale) {
    extern __shared__ double atb_smem_d[];
    AtbTiles<T> s(atb_smem_d);
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    const int k0 = blockIdx.y * ATB_B;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const long long rk = (long long)H * ATB_DK, rv = (long long)H * ATB_DV;
    const long long ok = ((long long)b * Tn * H + h) * ATB_DK, ov = ((long long)b * Tn * H + h) * ATB_DV;
    const T lim = AtbLim<T>::value(), asc = (T)fabs(scale);
    const double sg = scale < 0.0 ? -1.0 : 1.0;
    const bool kbig = atb_load<T, ATB_DK, ATB_SK>(s.Ks, k + ok, rk, k0, Tn, lim);
    atb_load<T, ATB_DV, ATB_SV>(s.Vs, v + ov, rv, k0, Tn, lim);
    T adk[ATB_R][ATB_NK], adv[ATB_R][ATB_NV];
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
#pragma unroll
        for (int j = 0; j < ATB_NK; ++j) adk[i][j] = (T)0;
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) adv[i][j] = (T)0;
    }
    // The last query that sees a key of this tile: t − s < window.
    const int qlast = window > 0 ? min(Tn - 1, k0 + ATB_B - 1 + window - 1) : Tn - 1;
    for (int q0 = k0; q0 <= qlast; q0 += ATB_B) {
        __syncthreads();
        const bool qbig = atb_load<T, ATB_DK, ATB_SK>(s.Qs, q + ok, rk, q0, Tn, lim);
        atb_load<T, ATB_DV, ATB_SV>(s.Gs, dy + ov, rv, q0, Tn, lim);
        atb_load_stats<T>(s.Ms, s.Ls, s.Ds, M, L, D, bh, q0, Tn);
        if (__syncthreads_or(qbig || kbig))
            atb_pds<double, T>(s.Qs, s.Ks, s.Vs, s.Gs, s.Ms, s.Ls, s.Ds, s.Ps, s.Ss, q0, k0, Tn, window, sg, asc);
        else
            atb_pds<T, T>(s.Qs, s.Ks, s.Vs, s.Gs, s.Ms, s.Ls, s.Ds, s.Ps, s.Ss, q0, k0, Tn, window, sg, asc);
        __syncthreads();
#pragma unroll 2
        for (int t = 0; t < ATB_B; ++t) {
            T p[ATB_R], ds[ATB_R];
#pragma unroll
            for (int i = 0; i < ATB_R; ++i) {
                p[i] = s.Ps[t * ATB_SP + ty + 16 * i];
                ds[i] = s.Ss[t * ATB_SP + ty + 16 * i];
            }
            atb_axpy<T, ATB_NV, ATB_DV, ATB_SV>(adv, p, s.Gs, t);
            atb_axpy<T, ATB_NK, ATB_DK, ATB_SK>(adk, ds, s.Qs, t);
        }
    }
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        const int t = k0 + ty + 16 * i;
        if (t >= Tn) continue;
#pragma unroll
        for (int j = 0; j < ATB_NK; ++j) {
            const int c = tx + 16 * j;
            // σ applied in double: a σ beyond the f32 range times a zero sum is 0, not NaN.
            if (c < ATB_DK) dk[ok + (long long)t * rk + c] = (T)(scale * (double)adk[i][j]);
        }
#pragma unroll
        for (int j = 0; j < ATB_NV; ++j) {
            const int c = tx + 16 * j;
            if (c < ATB_DV) dv[ov + (long long)t * rv + c] = adv[i][j];
        }
    }
}

// --- atb_dq ----------------------------------------------------------------------------------

// Grid (B·H, ⌈T/ATB_B⌉), the longest query tiles first.
template <typename T>
__device__ void atb_dq(const T* q, const T* k, const T* v, const T* dy, const double* M, const T* L, const T* D,
                       T* dq, int Tn, int H, int window, double scale) {
    extern __shared__ double atb_smem_d[];
    AtbTiles<T> s(atb_smem_d);
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATB_B;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const long long rk = (long long)H * ATB_DK, rv = (long long)H * ATB_DV;
    const long long ok = ((long long)b * Tn * H + h) * ATB_DK, ov = ((long long)b * Tn * H + h) * ATB_DV;
    const T lim = AtbLim<T>::value(), asc = (T)fabs(scale);
    const double sg = scale < 0.0 ? -1.0 : 1.0;
    const bool qbig = atb_load<T, ATB_DK, ATB_SK>(s.Qs, q + ok, rk, q0, Tn, lim);
    atb_load<T, ATB_DV, ATB_SV>(s.Gs, dy + ov, rv, q0, Tn, lim);
    atb_load_stats<T>(s.Ms, s.Ls, s.Ds, M, L, D, bh, q0, Tn);
    T adq[ATB_R][ATB_NK];
#pragma unroll
    for (int i = 0; i < ATB_R; ++i)
#pragma unroll
        for (int j = 0; j < ATB_NK; ++j) adq[i][j] = (T)0;
    const int qlast = min(q0 + ATB_B, Tn) - 1;
    const int kfirst = window > 0 ? max(0, q0 - window + 1) : 0;
    for (int k0 = (kfirst / ATB_B) * ATB_B; k0 <= qlast; k0 += ATB_B) {
        __syncthreads();
        const bool kbig = atb_load<T, ATB_DK, ATB_SK>(s.Ks, k + ok, rk, k0, Tn, lim);
        atb_load<T, ATB_DV, ATB_SV>(s.Vs, v + ov, rv, k0, Tn, lim);
        if (__syncthreads_or(qbig || kbig))
            atb_pds<double, T>(s.Qs, s.Ks, s.Vs, s.Gs, s.Ms, s.Ls, s.Ds, nullptr, s.Ss, q0, k0, Tn, window, sg, asc);
        else
            atb_pds<T, T>(s.Qs, s.Ks, s.Vs, s.Gs, s.Ms, s.Ls, s.Ds, nullptr, s.Ss, q0, k0, Tn, window, sg, asc);
        __syncthreads();
#pragma unroll 4
        for (int c = 0; c < ATB_B; ++c) {
            T ds[ATB_R];
#pragma unroll
            for (int i = 0; i < ATB_R; ++i) ds[i] = s.Ss[(ty + 16 * i) * ATB_SP + c];
            atb_axpy<T, ATB_NK, ATB_DK, ATB_SK>(adq, ds, s.Ks, c);
        }
    }
#pragma unroll
    for (int i = 0; i < ATB_R; ++i) {
        const int t = q0 + ty + 16 * i;
        if (t >= Tn) continue;
#pragma unroll
        for (int j = 0; j < ATB_NK; ++j) {
            const int c = tx + 16 * j;
            if (c < ATB_DK) dq[ok + (long long)t * rk + c] = (T)(scale * (double)adq[i][j]);
        }
    }
}

#define ATB_EXPORT(T, S)                                                                                        \
    extern "C" __global__ void __launch_bounds__(ATB_THREADS)                                                    \
        atb_stats_##S(const T* q, const T* k, const T* v, const T* dy, double* M, T* L, T* D, int Tn, int H,    \
                      int window, double scale, const float* only_if) {                                           \
        if (only_if && *only_if == 0.f) return;                                                                  \
        atb_stats<T>(q, k, v, dy, M, L, D, Tn, H, window, scale);                                                \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATB_THREADS)                                                    \
        atb_dkdv_##S(const T* q, const T* k, const T* v, const T* dy, const double* M, const T* L, const T* D,  \
                     T* dk, T* dv, int Tn, int H, int window, double scale, const float* only_if) {              \
        if (only_if && *only_if == 0.f) return;                                                                  \
        atb_dkdv<T>(q, k, v, dy, M, L, D, dk, dv, Tn, H, window, scale);                                         \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATB_THREADS)                                                    \
        atb_dq_##S(const T* q, const T* k, const T* v, const T* dy, const double* M, const T* L, const T* D,    \
                   T* dq, int Tn, int H, int window, double scale, const float* only_if) {                       \
        if (only_if && *only_if == 0.f) return;                                                                  \
        atb_dq<T>(q, k, v, dy, M, L, D, dq, Tn, H, window, scale);                                               \
    }

ATB_EXPORT(float, f32)
ATB_EXPORT(double, f64)
