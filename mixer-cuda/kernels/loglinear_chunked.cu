// Chunk-parallel forms of the scalar-decay log-linear mixers (docs/math.md §2.1–§2.6): linear
// attention and Mamba-2, and their Fenwick lifts. Every pass is parallel over (chunk, batch·head,
// value tile); only a tree of log₂(#chunks) short elementwise launches joins the chunks.
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]; g [B,T,H]; lam [B,T,H,L] (weights, mapped).
//
// Chunks have CH = 64 tokens (f32) or 32 (f64); the last one may be partial. With chunk-local
// cumulative log-decays γ_r (r < n) and chunk totals a_j = γ_{n−1}:
// 1. llc_states: per chunk j the state Z_j = Σ_s e^{a_j − γ_s} k_s v_sᵀ (Dk×Dv) and a_j — the
//    level-0 entries of the tree.
// 2. llc_tree, per tree level e ≥ 1: the aligned block of 2^e chunks m has
//    F_e(m) = e^{A_{e−1}(2m+1)} F_{e−1}(2m) + F_{e−1}(2m+1) and A_e(m) = A_{e−1}(2m) + A_{e−1}(2m+1):
//    its state decayed to its end, and its total log-decay.
// 3. llc_out, per chunk i: the intra-chunk quadratic part with the Fenwick levels inside the chunk,
//    plus, for every chunk level e with bit e−1 of i set, the bucket of chunks j with
//    bitlen(i ⊕ j) = e. That bucket is the lower half of i's aligned 2^e block: level-(e−1) entry
//    m_e = 2·(i ≫ e). The chunks between its end and i's start are exactly the buckets of the lower
//    set bits of i, so its decay to i's start is d_e = Σ_{e' < e, bit e'−1 set} A_{e'−1}(m_{e'}).
//    y_r += σ λ_r^{(c+e)} e^{γ_r + d_e} q_r · F_{e−1}(m_e), c = log₂ CH. Without a lift the levels
//    are summed first (λ ≡ 1): one product with H_i = Σ_e e^{d_e} F_{e−1}(m_e).
// Tree entries: level e has ⌊NC / 2^e⌋ complete blocks; entries of level e start at
// BH·DD·Σ_{e'<e} ⌊NC/2^{e'}⌋ (DD = Dk·Dv) and are laid out [bh][m][Dk][Dv]; the log-decays A
// likewise without DD. A block that is not complete is never read.

template <typename T> struct Llc;
template <> struct Llc<float> {
    static constexpr int CH = 64, CBITS = 6;
};
template <> struct Llc<double> {
    static constexpr int CH = 32, CBITS = 5;
};
#define LLC_KT 16  // reduction tile
#define LLC_NT 64  // output column tile (value columns or key rows)
#define LLC_LD (LLC_NT + 1)

__device__ inline int llc_bitlen(unsigned x) { return x == 0u ? 0 : 32 - __clz((int)x); }

// Index of tree entry (level e, bh, block m): levels one after the other, each [BH][⌊NC/2^e⌋].
__device__ inline long long llc_entry(int e, int bh, int m, int nc, int BH) {
    long long s = 0;
    for (int l = 0; l < e; ++l) s += (long long)(nc >> l);
    return s * BH + (long long)bh * (nc >> e) + m;
}

// acc[i][j] += Σ_κ X[κ][ty + 16 i] · Y[κ][tx + 16 j] (X, Y in shared memory, rows of LDX / LDY).
template <typename T, int RI, int RJ, int LDX, int LDY>
__device__ inline void llc_gemm(T (&acc)[RI][RJ], const T* X, const T* Y, int K, int ty, int tx) {
#pragma unroll 4
    for (int kk = 0; kk < K; ++kk) {
        T xr[RI], yr[RJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) xr[i] = X[kk * LDX + ty + 16 * i];
#pragma unroll
        for (int j = 0; j < RJ; ++j) yr[j] = Y[kk * LDY + tx + 16 * j];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < RJ; ++j) acc[i][j] = fma(xr[i], yr[j], acc[i][j]);
    }
}

// Stores a thread's RI × 4 tile of a chunk's block (rows ty + 16a, columns c0 + tx + 16jj, as
// llc_gemm leaves it) into x laid out as rows (row0 + r·H) of D columns: rows below n, columns
// below D only.
template <typename T, int RI>
__device__ inline void llc_store(const T (&acc)[RI][4], T* x, long long row0, int H, int D, int n, int c0, int ty,
                                 int tx) {
#pragma unroll
    for (int a = 0; a < RI; ++a)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int r = ty + 16 * a, c = c0 + tx + 16 * jj;
            if (r < n && c < D) x[(row0 + (long long)r * H) * D + c] = acc[a][jj];
        }
}

// Moves `total` elements from `fetch(idx)` to `put(idx, value)`, idx = threadIdx.x + u·NT for u <
// PER: every load is issued before the first store, so that a tile's global loads are in flight
// together rather than one round trip per loop iteration.
template <typename T, int PER, int NT, typename Fetch, typename Put>
__device__ __forceinline__ void llc_stage(int total, Fetch fetch, Put put) {
    T r[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int idx = threadIdx.x + u * NT;
        r[u] = idx < total ? fetch(idx) : T{};
    }
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int idx = threadIdx.x + u * NT;
        if (idx < total) put(idx, r[u]);
    }
}

// γ_r of chunk i0..i0+n (γ_r = γ_{n−1} for r ≥ n) into gam[CH]; has_g = 0: no decay (γ ≡ 0).
// Inclusive prefix sum of x over threads 0..CH−1 (CH ≤ 64) by warp shuffles; every thread of the
// block calls it (it synchronises); tmp holds one double. The result is meaningful for tid < CH.
template <int CH>
__device__ inline double llc_prefix(double x, double* tmp) {
    const int tid = threadIdx.x, lane = tid & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (CH > 32) {
        if (tid == 31) *tmp = x;
        __syncthreads();
        if (tid >= 32 && tid < 64) x += *tmp;
    }
    return x;
}

template <typename T, int CH>
__device__ inline void llc_gamma(double* gam, double* gtmp, const T* g, int has_g, long long rowbase, int H, int n) {
    const int tid = threadIdx.x;
    const double x = (tid < CH && has_g && tid < n) ? (double)g[rowbase + (long long)tid * H] : 0.0;
    const double p = llc_prefix<CH>(x, gtmp);
    if (tid < CH) gam[tid] = p;
    __syncthreads();
}

// 1. Chunk states Z_j [Dk×Dv] (tile of 64 key rows × 64 value columns) and chunk log-decays.
// Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 256 threads.
template <typename T>
__device__ void llc_states(const T* k, const T* v, const T* g, int has_g, T* F, double* A, int Tn, int H, int Dk, int Dv,
                           int nc) {
    constexpr int CH = Llc<T>::CH;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[CH * LLC_LD], Ys[CH * LLC_LD];  // K̂ [s][64 key columns], V [s][64 value columns]
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int ntd = (Dv + LLC_NT - 1) / LLC_NT;
    const int c0 = (blockIdx.z / ntd) * LLC_NT, d0 = (blockIdx.z % ntd) * LLC_NT;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int i0 = j * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;  // row of token i0 (times H per token)
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    const double alast = gam[CH - 1];
    constexpr int PER = CH * LLC_NT / 256;
    llc_stage<T, PER, 256>(
        CH * LLC_NT,
        [&](int idx) {
            const int s = idx / LLC_NT, cc = idx % LLC_NT;
            return (s < n && c0 + cc < Dk) ? k[(row0 + (long long)s * H) * Dk + c0 + cc] : (T)0;
        },
        [&](int idx, T x) {
            const int s = idx / LLC_NT;
            Xs[s * LLC_LD + idx % LLC_NT] = mx_exp((T)(alast - gam[s])) * x;
        });
    llc_stage<T, PER, 256>(
        CH * LLC_NT,
        [&](int idx) {
            const int s = idx / LLC_NT, cc = idx % LLC_NT;
            return (s < n && d0 + cc < Dv) ? v[(row0 + (long long)s * H) * Dv + d0 + cc] : (T)0;
        },
        [&](int idx, T x) { Ys[(idx / LLC_NT) * LLC_LD + idx % LLC_NT] = x; });
    __syncthreads();
    T acc[4][4] = {};
    llc_gemm<T, 4, 4, LLC_LD, LLC_LD>(acc, Xs, Ys, n, ty, tx);
    const long long DD = (long long)Dk * Dv;
    T* Z = F + ((long long)bh * nc + j) * DD;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int c = c0 + ty + 16 * i, d = d0 + tx + 16 * jj;
            if (c < Dk && d < Dv) Z[(long long)c * Dv + d] = acc[i][jj];
        }
    if (blockIdx.z == 0 && tid == 0) A[(long long)bh * nc + j] = alast;
}

// 2. One tree level e ≥ 1. Grid (⌊NC/2^e⌋, BH), 256 threads.
template <typename T>
__device__ void llc_tree(T* __restrict__ F, double* A, int e, int BH, int Dk, int Dv, int nc) {
    const long long DD = (long long)Dk * Dv;
    const int m = blockIdx.x, bh = blockIdx.y;
    const long long lo = llc_entry(e - 1, bh, 2 * m, nc, BH), dst = llc_entry(e, bh, m, nc, BH);
    const double au = A[lo + 1];
    const T w = mx_exp((T)au);
    const T* F0 = F + lo * DD;
    const T* F1 = F0 + DD;
    T* out = F + dst * DD;
    for (long long base = 0; base < DD; base += 4 * 256) {
        T a[4], c[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long idx = base + threadIdx.x + u * 256;
            a[u] = idx < DD ? F0[idx] : (T)0;
            c[u] = idx < DD ? F1[idx] : (T)0;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const long long idx = base + threadIdx.x + u * 256;
            if (idx < DD) out[idx] = fma(w, a[u], c[u]);
        }
    }
    if (threadIdx.x == 0) A[dst] = A[lo] + au;
}

// The chunk's raw scores acc[a][b'] = q_r · k_s (r = ty + 16a, s = tx + 16b', rows ≥ n zero),
// through key-column tiles of 16 staged transposed in Xs, Ys [16][65]. 256 threads.
template <typename T, int CH>
__device__ inline void llc_qk(T (&acc)[CH / 16][CH / 16], const T* q, const T* k, T* Xs, T* Ys, long long row0,
                              int H, int Dk, int n) {
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
        for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
            const int r = idx / LLC_KT, kk = idx % LLC_KT, c = c0 + kk;
            T qv = (T)0, kv = (T)0;
            if (r < n && c < Dk) {
                const long long row = row0 + (long long)r * H;
                qv = q[row * Dk + c];
                kv = k[row * Dk + c];
            }
            Xs[kk * LLC_LD + r] = qv;
            Ys[kk * LLC_LD + r] = kv;
        }
        __syncthreads();
        llc_gemm<T, CH / 16, CH / 16, LLC_LD, LLC_LD>(acc, Xs, Ys, LLC_KT, ty, tx);
        __syncthreads();
    }
}

// The states chunk i reads between chunks (thread 0 of llc_out / llc_out_tc; returns how many):
// for every set bit e − 1 of i, its tree entry (the level-(e−1) block 2·(i ≫ e)), the decay from
// that block's end to the chunk's start (the entries of the lower set bits summed) and e; with
// direct = 1 the one state entering chunk i (entry bh·NC + i), none for i = 0.
__device__ inline int llc_levels(int i, int bh, int nc, int direct, const double* A, long long* ent, double* dec,
                                 int* lev) {
    if (direct) {
        ent[0] = (long long)bh * nc + i;
        dec[0] = 0.0;
        return i > 0 ? 1 : 0;
    }
    int np = 0;
    double d = 0.0;
    for (int e = 1; e <= llc_bitlen((unsigned)i); ++e) {
        if (!((i >> (e - 1)) & 1)) continue;
        ent[np] = llc_entry(e - 1, bh, (i >> e) << 1, nc, gridDim.y);
        dec[np] = d;
        lev[np] = e;
        d += A[ent[np]];
        ++np;
    }
    return np;
}

// 3. Outputs of chunk i, a tile of 64 value columns. Grid (NC, BH, ⌈Dv/64⌉), 256 threads.
// direct = 1 (gated DeltaNet, no lift): F holds the state entering each chunk, [BH][NC][Dk][Dv],
// read once with σ e^{γ_r} q_r; v is then the new values U' of the sequential pass.
template <typename T>
__device__ void llc_out(const T* q, const T* k, const T* v, const T* g, int has_g, const T* lam, const T* F, const double* A,
                        T* y, int Tn, int H, int Dk, int Dv, int L, int lifted, int direct, int nc, double scale) {
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T Pt[CH * (CH + 1)];  // Pt[s][r]
    __shared__ long long lev_ent[32];  // per present chunk level e: its tree entry (level e − 1),
    __shared__ double lev_d[32];       // its decay to the chunk start,
    __shared__ int lev_e[32];          // and e
    __shared__ int nlev_s;
    const int i = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int d0 = blockIdx.z * LLC_NT;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int i0 = i * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const long long DD = (long long)Dk * Dv;
    const T sc = (T)scale;
    if (tid == 0) nlev_s = llc_levels(i, bh, nc, direct, A, lev_ent, lev_d, lev_e);
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    const int nlev = nlev_s;
    // Intra-chunk scores P[r][s] (r = ty + 16a, s = tx + 16b'), masked, decayed, weighted.
    {
        T acc[RI][RI] = {};
        llc_qk<T, CH>(acc, q, k, Xs, Ys, row0, H, Dk, n);
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int bb = 0; bb < RI; ++bb) {
                const int r = ty + 16 * a, s = tx + 16 * bb;
                T p = (T)0;
                if (s <= r && r < n) {
                    p = sc * acc[a][bb] * mx_exp((T)(gam[r] - gam[s]));
                    if (lifted) p *= lam[(row0 + (long long)r * H) * L + llc_bitlen((unsigned)(r ^ s))];
                }
                Pt[s * (CH + 1) + r] = p;
            }
    }
    __syncthreads();
    T acc[RI][4] = {};
    // y = P V.
    for (int s0 = 0; s0 < n; s0 += LLC_KT) {
        for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
            const int kk = idx / LLC_NT, dd = idx % LLC_NT, s = s0 + kk;
            T vv = (T)0;
            if (s < n && d0 + dd < Dv) vv = v[(row0 + (long long)s * H) * Dv + d0 + dd];
            Ys[kk * LLC_LD + dd] = vv;
        }
        __syncthreads();
        llc_gemm<T, RI, 4, CH + 1, LLC_LD>(acc, Pt + s0 * (CH + 1), Ys, min(LLC_KT, n - s0), ty, tx);
        __syncthreads();
    }
    // Between chunks: one product per present level (lift), or one with the summed state.
    const int ngroups = lifted ? nlev : (nlev > 0 ? 1 : 0);
    for (int grp = 0; grp < ngroups; ++grp) {
        for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
            for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
                const int r = idx / LLC_KT, kk = idx % LLC_KT, c = c0 + kk;
                T qv = (T)0;
                if (r < n && c < Dk) {
                    const long long row = row0 + (long long)r * H;
                    double lg = gam[r];
                    T w = sc;
                    if (lifted) {
                        lg += lev_d[grp];
                        w *= lam[row * L + CB + lev_e[grp]];
                    }
                    qv = w * mx_exp((T)lg) * q[row * Dk + c];
                }
                Xs[kk * LLC_LD + r] = qv;
            }
            for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                const int kk = idx / LLC_NT, dd = idx % LLC_NT, c = c0 + kk, d = d0 + dd;
                T fv = (T)0;
                if (c < Dk && d < Dv) {
                    const long long off = (long long)c * Dv + d;
                    if (lifted)
                        fv = F[lev_ent[grp] * DD + off];
                    else
                        for (int l = 0; l < nlev; ++l) fv += mx_exp((T)lev_d[l]) * F[lev_ent[l] * DD + off];
                }
                Ys[kk * LLC_LD + dd] = fv;
            }
            __syncthreads();
            llc_gemm<T, RI, 4, LLC_LD, LLC_LD>(acc, Xs, Ys, LLC_KT, ty, tx);
            __syncthreads();
        }
    }
    llc_store<T, RI>(acc, y, row0, H, Dv, n, d0, ty, tx);
}

// Four consecutive floats p[off + c .. off + c + 3] of a row of D entries, entries at or past D
// read as 0: one 16-byte load when vec (D % 4 = 0 and p 16-byte aligned, so that off + c is a
// multiple of 4), else four loads.
__device__ __forceinline__ float4 llc_ld4(const float* p, long long off, int c, int D, bool vec) {
    float4 r = {0.f, 0.f, 0.f, 0.f};
    if (vec) {
        if (c < D) r = *reinterpret_cast<const float4*>(p + off + c);
    } else {
        if (c < D) r.x = p[off + c];
        if (c + 1 < D) r.y = p[off + c + 1];
        if (c + 2 < D) r.z = p[off + c + 2];
        if (c + 3 < D) r.w = p[off + c + 3];
    }
    return r;
}
// Stores x · s, rounded to tf32, at dst[0..3].
__device__ __forceinline__ void llc_put4_tf32(float* dst, float4 x, float s) {
    dst[0] = __uint_as_float(mx_tf32(s * x.x));
    dst[1] = __uint_as_float(mx_tf32(s * x.y));
    dst[2] = __uint_as_float(mx_tf32(s * x.z));
    dst[3] = __uint_as_float(mx_tf32(s * x.w));
}
__device__ __forceinline__ bool llc_al16(const void* p) { return ((unsigned long long)p & 15) == 0; }

// 3'. llc_out on tensor cores (precision modes tf32 and bf16; f32 data): the same products as
// llc_out, each an m16n8k8 tf32 mma with f32 accumulation. Chunk of 64 rows, value tile of 64
// columns, 4 warps of 16 rows. Shared tiles are padded so that fragment loads hit 32 banks:
// Qs [64][36] (a key tile of 32 columns), KV = Ks [64][36] | Vs [64][72] | Fs [32][72], Ps [64][68].
// Tiles are loaded four floats at a time (16-byte loads where the layout allows), every load of a
// tile in flight before the first store (llc_stage); without a lift the states between chunks are
// summed with their decays e^{d_e} computed once per block.
// Grid (NC, BH, ⌈Dv/64⌉), 128 threads.
#define LLT_LDQ 36
#define LLT_LDP 68
#define LLT_LDV 72
__device__ void llc_out_tc(const float* q, const float* k, const float* v, const float* g, int has_g,
                           const float* lam, const float* F, const double* A, float* y, int Tn, int H, int Dk,
                           int Dv, int L, int lifted, int direct, int nc, double scale) {
    constexpr int CH = 64, CB = 6;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float Qs[CH * LLT_LDQ];
    __shared__ float KV[CH * LLT_LDV];
    __shared__ float Ps[CH * LLT_LDP];
    __shared__ long long lev_ent[32];
    __shared__ double lev_d[32];
    __shared__ float lev_w[32];
    __shared__ int lev_e[32];
    __shared__ int nlev_s;
    const int i = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int d0 = blockIdx.z * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int r0 = warp * 16 + gi, r1 = r0 + 8;
    const int i0 = i * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const long long DD = (long long)Dk * Dv;
    const float sc = (float)scale;
    const bool vq = Dk % 4 == 0 && llc_al16(q) && llc_al16(k), vv = Dv % 4 == 0 && llc_al16(v),
               vf = Dv % 4 == 0 && llc_al16(F);
    if (tid == 0) {
        nlev_s = llc_levels(i, bh, nc, direct, A, lev_ent, lev_d, lev_e);
        for (int l = 0; l < nlev_s; ++l) lev_w[l] = __expf((float)lev_d[l]);
    }
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    const int nlev = nlev_s;
    // Scores S = Q Kᵀ, a warp's 16 rows × 64 keys; key columns in tiles of 32.
    float acc[8][4] = {};
    for (int c0 = 0; c0 < Dk; c0 += 32) {
        llc_stage<float4, 8, 128>(
            2 * CH * 8,
            [&](int idx) {
                const int r = (idx >> 3) & (CH - 1), c = c0 + (idx & 7) * 4;
                return r < n ? llc_ld4(idx < CH * 8 ? q : k, (row0 + (long long)r * H) * Dk, c, Dk, vq)
                             : float4{0.f, 0.f, 0.f, 0.f};
            },
            [&](int idx, float4 x) {
                const int r = (idx >> 3) & (CH - 1), kk = (idx & 7) * 4;
                llc_put4_tf32((idx < CH * 8 ? Qs : KV) + r * LLT_LDQ + kk, x, 1.f);
            });
        __syncthreads();
#pragma unroll
        for (int k8 = 0; k8 < 4; ++k8) {
            const int c = k8 * 8 + tg;
            const unsigned a0 = __float_as_uint(Qs[r0 * LLT_LDQ + c]), a1 = __float_as_uint(Qs[r1 * LLT_LDQ + c]);
            const unsigned a2 = __float_as_uint(Qs[r0 * LLT_LDQ + c + 4]),
                           a3 = __float_as_uint(Qs[r1 * LLT_LDQ + c + 4]);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const int s = nt * 8 + gi;
                mx_mma_tf32(acc[nt], a0, a1, a2, a3, __float_as_uint(KV[s * LLT_LDQ + c]),
                            __float_as_uint(KV[s * LLT_LDQ + c + 4]));
            }
        }
        __syncthreads();
    }
    // P: masked, decayed, λ-weighted; each warp writes and reads its own rows.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = u < 2 ? r0 : r1, s = nt * 8 + 2 * tg + (u & 1);
            float p = 0.f;
            if (s <= r && r < n) {
                p = sc * acc[nt][u] * __expf((float)(gam[r] - gam[s]));
                if (lifted) p *= lam[(row0 + (long long)r * H) * L + llc_bitlen((unsigned)(r ^ s))];
            }
            Ps[r * LLT_LDP + s] = __uint_as_float(mx_tf32(p));
        }
    // V tile [64 s][64 d].
    llc_stage<float4, 8, 128>(
        CH * 16,
        [&](int idx) {
            const int s = idx >> 4, dd = (idx & 15) * 4;
            return s < n ? llc_ld4(v, (row0 + (long long)s * H) * Dv + d0, dd, Dv - d0, vv)
                         : float4{0.f, 0.f, 0.f, 0.f};
        },
        [&](int idx, float4 x) { llc_put4_tf32(KV + (idx >> 4) * LLT_LDV + (idx & 15) * 4, x, 1.f); });
    __syncthreads();
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const int send = (n + 7) / 8;
    for (int k8 = 0; k8 < send; ++k8) {
        const int s = k8 * 8 + tg;
        const unsigned a0 = __float_as_uint(Ps[r0 * LLT_LDP + s]), a1 = __float_as_uint(Ps[r1 * LLT_LDP + s]);
        const unsigned a2 = __float_as_uint(Ps[r0 * LLT_LDP + s + 4]), a3 = __float_as_uint(Ps[r1 * LLT_LDP + s + 4]);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            mx_mma_tf32(acc[nt], a0, a1, a2, a3, __float_as_uint(KV[s * LLT_LDV + nt * 8 + gi]),
                        __float_as_uint(KV[(s + 4) * LLT_LDV + nt * 8 + gi]));
    }
    // Between chunks: per present level (lift) or once with the summed states; the row factor
    // σ λ e^{γ_r + d} is applied to the query fragments.
    const int ngroups = lifted ? nlev : (nlev > 0 ? 1 : 0);
    for (int grp = 0; grp < ngroups; ++grp) {
        float f0 = 0.f, f1 = 0.f;
        {
            const double dg = lifted ? lev_d[grp] : 0.0;
            if (r0 < n) {
                f0 = sc * __expf((float)(gam[r0] + dg));
                if (lifted) f0 *= lam[(row0 + (long long)r0 * H) * L + CB + lev_e[grp]];
            }
            if (r1 < n) {
                f1 = sc * __expf((float)(gam[r1] + dg));
                if (lifted) f1 *= lam[(row0 + (long long)r1 * H) * L + CB + lev_e[grp]];
            }
        }
        for (int c0 = 0; c0 < Dk; c0 += 32) {
            __syncthreads();
            // Q tile [64 r][32 c] and the state tile [32 c][64 d] (summed over the levels without
            // a lift), 4 + 4 loads of four floats per thread.
            llc_stage<float4, 8, 128>(
                CH * 8 + 32 * 16,
                [&](int idx) {
                    float4 x = {0.f, 0.f, 0.f, 0.f};
                    if (idx < CH * 8) {
                        const int r = idx >> 3;
                        return r < n ? llc_ld4(q, (row0 + (long long)r * H) * Dk, c0 + (idx & 7) * 4, Dk, vq) : x;
                    }
                    const int kk = (idx - CH * 8) >> 4, c = c0 + kk, dd = (idx & 15) * 4;
                    if (c >= Dk) return x;
                    const long long off = (long long)c * Dv + d0;
                    if (lifted) return llc_ld4(F, lev_ent[grp] * DD + off, dd, Dv - d0, vf);
#pragma unroll 4
                    for (int l = 0; l < nlev; ++l) {
                        const float4 f = llc_ld4(F, lev_ent[l] * DD + off, dd, Dv - d0, vf);
                        const float w = lev_w[l];
                        x.x += w * f.x, x.y += w * f.y, x.z += w * f.z, x.w += w * f.w;
                    }
                    return x;
                },
                [&](int idx, float4 x) {
                    if (idx < CH * 8) {
                        float* d = Qs + (idx >> 3) * LLT_LDQ + (idx & 7) * 4;
                        d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
                    } else {
                        const int j2 = idx - CH * 8;
                        llc_put4_tf32(KV + (j2 >> 4) * LLT_LDV + (j2 & 15) * 4, x, 1.f);
                    }
                });
            __syncthreads();
#pragma unroll
            for (int k8 = 0; k8 < 4; ++k8) {
                const int c = k8 * 8 + tg;
                const unsigned a0 = mx_tf32(f0 * Qs[r0 * LLT_LDQ + c]), a1 = mx_tf32(f1 * Qs[r1 * LLT_LDQ + c]);
                const unsigned a2 = mx_tf32(f0 * Qs[r0 * LLT_LDQ + c + 4]),
                               a3 = mx_tf32(f1 * Qs[r1 * LLT_LDQ + c + 4]);
#pragma unroll
                for (int nt = 0; nt < 8; ++nt)
                    mx_mma_tf32(acc[nt], a0, a1, a2, a3, __float_as_uint(KV[c * LLT_LDV + nt * 8 + gi]),
                                __float_as_uint(KV[(c + 4) * LLT_LDV + nt * 8 + gi]));
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = u < 2 ? r0 : r1, d = d0 + nt * 8 + 2 * tg + (u & 1);
            if (r < n && d < Dv) y[(row0 + (long long)r * H) * Dv + d] = acc[nt][u];
        }
}

extern "C" __global__ void __launch_bounds__(128, 4)
    llc_out_tc_f32(const float* q, const float* k, const float* v, const float* g, int has_g, const float* lam,
                   const float* F, const double* A, float* y, int Tn, int H, int Dk, int Dv, int L, int lifted,
                   int direct, int nc, double scale) {
    llc_out_tc(q, k, v, g, has_g, lam, F, A, y, Tn, H, Dk, Dv, L, lifted, direct, nc, scale);
}

// 1'. llc_states on tensor cores (tf32 / bf16 modes, f32 data): Z_j = K̂ᵀ V as m16n8k8 tf32 mma,
// a 64 × 64 tile of (key rows, value columns) per block, 4 warps of 16 key rows. Ks, Vs [64][72]
// (padded: fragment loads hit 32 banks). Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 128 threads.
__device__ void llc_states_tc(const float* k, const float* v, const float* g, int has_g, float* F, double* A, int Tn,
                              int H, int Dk, int Dv, int nc) {
    constexpr int CH = 64;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float Ks[CH * LLT_LDV], Vs[CH * LLT_LDV];
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int ntd = (Dv + 63) / 64;
    const int c0 = (blockIdx.z / ntd) * 64, d0 = (blockIdx.z % ntd) * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int i0 = j * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    const double alast = gam[CH - 1];
    llc_stage<float, CH * 64 / 128, 128>(
        CH * 64,
        [&](int idx) {
            const int s = idx >> 6, c = c0 + (idx & 63);
            return (s < n && c < Dk) ? k[(row0 + (long long)s * H) * Dk + c] : 0.f;
        },
        [&](int idx, float x) {
            const int s = idx >> 6;
            Ks[s * LLT_LDV + (idx & 63)] = __uint_as_float(mx_tf32(__expf((float)(alast - gam[s])) * x));
        });
    llc_stage<float, CH * 64 / 128, 128>(
        CH * 64,
        [&](int idx) {
            const int s = idx >> 6, d = d0 + (idx & 63);
            return (s < n && d < Dv) ? v[(row0 + (long long)s * H) * Dv + d] : 0.f;
        },
        [&](int idx, float x) { Vs[(idx >> 6) * LLT_LDV + (idx & 63)] = __uint_as_float(mx_tf32(x)); });
    __syncthreads();
    float acc[8][4] = {};
    const int cr = warp * 16 + gi;
    for (int k8 = 0; k8 < (n + 7) / 8; ++k8) {
        const int s = k8 * 8 + tg;
        const unsigned a0 = __float_as_uint(Ks[s * LLT_LDV + cr]), a1 = __float_as_uint(Ks[s * LLT_LDV + cr + 8]);
        const unsigned a2 = __float_as_uint(Ks[(s + 4) * LLT_LDV + cr]),
                       a3 = __float_as_uint(Ks[(s + 4) * LLT_LDV + cr + 8]);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            mx_mma_tf32(acc[nt], a0, a1, a2, a3, __float_as_uint(Vs[s * LLT_LDV + nt * 8 + gi]),
                        __float_as_uint(Vs[(s + 4) * LLT_LDV + nt * 8 + gi]));
    }
    const long long DD = (long long)Dk * Dv;
    float* Z = F + ((long long)bh * nc + j) * DD;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = c0 + cr + (u < 2 ? 0 : 8), d = d0 + nt * 8 + 2 * tg + (u & 1);
            if (c < Dk && d < Dv) Z[(long long)c * Dv + d] = acc[nt][u];
        }
    if (blockIdx.z == 0 && tid == 0) A[(long long)bh * nc + j] = alast;
}

extern "C" __global__ void __launch_bounds__(128)
    llc_states_tc_f32(const float* k, const float* v, const float* g, int has_g, float* F, double* A, int Tn, int H,
                      int Dk, int Dv, int nc) {
    llc_states_tc(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc);
}

// T⁻¹ = (I + Lm)⁻¹ for a strictly lower triangular CH × CH Lm (rows of LDL), row by row,
// X[r][c] = δ_rc − Σ_{s<r} Lm[r][s] X[s][c] (zero above the diagonal by itself): four lanes per
// column c split the sum and join it by shuffles; column c lives in row c of Tt (rows of LDX),
// read and written by its own warp only. Threads 0 .. 4·CH − 1 of the block take part.
template <typename T, int CH, int LDL, int LDX>
__device__ inline void llc_tri_inverse(const T* Lm, T* Tt) {
    const int tid = threadIdx.x, c = tid >> 2, part = tid & 3;
    if (c >= CH) return;
    T* x = Tt + c * LDX;
    for (int r = 0; r < CH; ++r) {
        T a0 = (T)0, a1 = (T)0;
        int s2 = part;
        for (; s2 + 4 < r; s2 += 8) {
            a0 = fma(Lm[r * LDL + s2], x[s2], a0);
            a1 = fma(Lm[r * LDL + s2 + 4], x[s2 + 4], a1);
        }
        if (s2 < r) a0 = fma(Lm[r * LDL + s2], x[s2], a0);
        T acc = a0 + a1;
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (part == 0) x[r] = (r == c ? (T)1 : (T)0) - acc;
        __syncwarp();
    }
}

// 4. Gated DeltaNet (no lift), chunk-parallel WY/UT pieces (docs/math.md §2.6). Per chunk, with
// γ and β: Lm = strict(diag(β)(KKᵀ ⊙ Γ)), T⁻¹ = (I + Lm)⁻¹ by forward substitution (four lanes per
// column), W = T⁻¹ diag(β e^γ) K, U = T⁻¹ diag(β) V, written as W [B,T,H,Dk], U [B,T,H,Dv].
// Grid (NC, BH), 256 threads.
template <typename T>
__device__ void llc_wy(const T* k, const T* v, const T* g, int has_g, const T* beta, T* W, T* U, T* Ti, int want_ti,
                       int Tn, int H, int Dk, int Dv) {
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDT = CH + 1;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Lm[CH * LDT];  // Lm[r][s]
    __shared__ T Tt[CH * LDT];  // Tt[s][r] = T⁻¹[r][s]
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T bet[CH];
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int i0 = j * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : (T)0;
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    {
        T acc[RI][RI] = {};
        for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
            llc_stage<T, LLC_KT * CH / 256, 256>(
                LLC_KT * CH,
                [&](int idx) {
                    const int r = idx / LLC_KT, c = c0 + idx % LLC_KT;
                    return (r < n && c < Dk) ? k[(row0 + (long long)r * H) * Dk + c] : (T)0;
                },
                [&](int idx, T x) { Xs[(idx % LLC_KT) * LLC_LD + idx / LLC_KT] = x; });
            __syncthreads();
            llc_gemm<T, RI, RI, LLC_LD, LLC_LD>(acc, Xs, Xs, LLC_KT, ty, tx);
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int bb = 0; bb < RI; ++bb) {
                const int r = ty + 16 * a, s = tx + 16 * bb;
                Lm[r * LDT + s] = (s < r && r < n) ? bet[r] * acc[a][bb] * mx_exp((T)(gam[r] - gam[s])) : (T)0;
            }
    }
    __syncthreads();
    llc_tri_inverse<T, CH, LDT, LDT>(Lm, Tt);
    __syncthreads();
    if (want_ti) {
        // T⁻¹ of the chunk, row-major [CH][CH], for the lift's intra-chunk coefficients.
        T* dst = Ti + ((long long)bh * gridDim.x + j) * CH * CH;
        for (int idx = tid; idx < CH * CH; idx += 256) dst[idx] = Tt[(idx % CH) * LDT + idx / CH];
    }
    // W (over key tiles), then U (over value tiles): out[r][col] = Σ_s T⁻¹[r][s] Y[s][col].
    for (int pass = 0; pass < 2; ++pass) {
        const int D = pass == 0 ? Dk : Dv;
        const T* src = pass == 0 ? k : v;
        T* dst = pass == 0 ? W : U;
        for (int c0 = 0; c0 < D; c0 += LLC_NT) {
            T acc[RI][4] = {};
            for (int s0 = 0; s0 < CH; s0 += LLC_KT) {
                llc_stage<T, LLC_KT * LLC_NT / 256, 256>(
                    LLC_KT * LLC_NT,
                    [&](int idx) {
                        const int s2 = s0 + idx / LLC_NT, cc = c0 + idx % LLC_NT;
                        return (s2 < n && cc < D) ? src[(row0 + (long long)s2 * H) * D + cc] : (T)0;
                    },
                    [&](int idx, T x) {
                        const int s2 = s0 + idx / LLC_NT;
                        const T w = s2 < n ? (pass == 0 ? bet[s2] * mx_exp((T)gam[s2]) : bet[s2]) : (T)0;
                        Ys[(idx / LLC_NT) * LLC_LD + idx % LLC_NT] = w * x;
                    });
                __syncthreads();
                llc_gemm<T, RI, 4, LDT, LLC_LD>(acc, Tt + s0 * LDT, Ys, LLC_KT, ty, tx);
                __syncthreads();
            }
            llc_store<T, RI>(acc, dst, row0, H, D, n, c0, ty, tx);
        }
    }
}

// 5. Gated DeltaNet, the one sequential pass over chunks. One block per (b·h, tile of 16 value
// columns) keeps the state in shared memory. The next chunk's W, K, U and g are copied into a
// second buffer (cp.async) while the current one is computed. Per chunk j, K̂_s = e^{a_j − γ_s} k_s:
// - lifted = 0 (one state S [Dk × 16]): write the entering state to Hs [BH][NC][Dk][Dv], form the
//   new values U' = U − W S (written to Vn, laid out as v), and move on: S ← e^{a_j} S + K̂ᵀ U'.
// - lifted = 1 (chunk-level Fenwick states S^(e), e < E, docs/math.md §2.6): merge levels 0..m
//   into m + 1 (m = ctz j, j ≥ 1); write every non-empty level e ≥ 1 (bit e − 1 of j) to Hs at slot
//   popsum(j) + rank [BH][slots][Dk][Dv] (popsum(j) = Σ_{j'<j} popcount(j'), so chunk j's levels
//   follow each other); take every such level through the chunk, S ← e^{a_j} S − K̂ᵀ (W S); and
//   insert the chunk's own state at level 0, S^(0) = K̂ᵀ U.
// Grid (BH, ⌈Dv/16⌉), 256 threads; dynamic shared memory: see delta_h_smem on the host.
#define LLC_DVT 16
__device__ __forceinline__ void llc_cp_async(void* dst, const void* src, int bytes, int valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
// Σ_{j' < j} popcount(j'): for each bit b, the numbers below j with bit b set.
__device__ inline long long llc_popsum(long long j) {
    long long s = 0;
    for (int b2 = 0; b2 < 40; ++b2) {
        const long long p = 1LL << b2;
        if (p > j) break;
        s += (j >> (b2 + 1)) * p + max(0LL, (j & (2 * p - 1)) - p);
    }
    return s;
}
template <typename T>
__device__ void llc_delta_h(const T* k, const T* g, int has_g, const T* W, const T* U, T* Vn, T* Hs, int Tn, int H,
                            int Dk, int Dv, int nc, int lifted, int E, long long slots) {
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDU = LLC_DVT + 1;
    const int LDW = Dk + 1;
    const int SD = Dk * LLC_DVT;  // one state tile
    extern __shared__ unsigned char llc_dyn[];
    // Layout (elements of T): S [E][Dk·16] | Wb [2][CH·LDW] | Kb [2][CH·LDW] | Ub [2][CH·16] | gb [2][CH] |
    // Un [CH·LDU] | dec [CH].
    T* S = reinterpret_cast<T*>(llc_dyn);
    T* Wb = S + E * SD;
    T* Kb = Wb + 2 * CH * LDW;
    T* Ub = Kb + 2 * CH * LDW;
    T* gb = Ub + 2 * CH * LLC_DVT;
    T* Un = gb + 2 * CH;
    T* dec = Un + CH * LDU;
    __shared__ double gam[CH], gtmp1;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int d0 = blockIdx.y * LLC_DVT;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const long long DD = (long long)Dk * Dv;
    auto prefetch = [&](int j, int buf) {
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        for (int idx = tid; idx < CH * Dk; idx += 256) {
            const int s = idx / Dk, c = idx % Dk, ok = s < n;
            const long long at = (row0 + (long long)(ok ? s : 0) * H) * Dk + c;
            llc_cp_async(Wb + buf * CH * LDW + s * LDW + c, W + at, sizeof(T), ok);
            llc_cp_async(Kb + buf * CH * LDW + s * LDW + c, k + at, sizeof(T), ok);
        }
        for (int idx = tid; idx < CH * LLC_DVT; idx += 256) {
            const int s = idx / LLC_DVT, dd = idx % LLC_DVT, ok = s < n && d0 + dd < Dv;
            const long long at = (row0 + (long long)(ok ? s : 0) * H) * Dv + (ok ? d0 + dd : 0);
            llc_cp_async(Ub + buf * CH * LLC_DVT + idx, U + at, sizeof(T), ok);
        }
        if (tid < CH) {
            const int ok = has_g && tid < n;
            llc_cp_async(gb + buf * CH + tid, g + (ok ? row0 + (long long)tid * H : 0), sizeof(T), ok);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int idx = tid; idx < E * SD; idx += 256) S[idx] = (T)0;
    prefetch(0, 0);
    for (int j = 0; j < nc; ++j) {
        const int buf = j & 1;
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        if (j + 1 < nc) {
            prefetch(j + 1, buf ^ 1);
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();
        const T* Wc = Wb + buf * CH * LDW;
        const T* Kc = Kb + buf * CH * LDW;
        const T* Uc = Ub + buf * CH * LLC_DVT;
        {
            const double p = llc_prefix<CH>(tid < CH ? (double)gb[buf * CH + tid] : 0.0, &gtmp1);
            if (tid < CH) gam[tid] = p;
        }
        if (lifted && j >= 1) {
            const int m = __ffs(j) - 1;
            for (int idx = tid; idx < SD; idx += 256) {
                T sum = (T)0;
                for (int e = 0; e <= m; ++e) {
                    sum += S[e * SD + idx];
                    S[e * SD + idx] = (T)0;
                }
                S[(m + 1) * SD + idx] = sum;
            }
        }
        __syncthreads();
        // The entering states, written out.
        if (lifted) {
            long long slot = llc_popsum(j);
            for (int e = 1; e < E; ++e) {
                if (!((j >> (e - 1)) & 1)) continue;
                T* Hj = Hs + ((long long)bh * slots + slot) * DD;
                for (int idx = tid; idx < SD; idx += 256) {
                    const int c = idx / LLC_DVT, dd = idx % LLC_DVT;
                    if (d0 + dd < Dv) Hj[(long long)c * Dv + d0 + dd] = S[e * SD + idx];
                }
                ++slot;
            }
        } else {
            T* Hj = Hs + ((long long)bh * nc + j) * DD;
            for (int idx = tid; idx < SD; idx += 256) {
                const int c = idx / LLC_DVT, dd = idx % LLC_DVT;
                if (d0 + dd < Dv) Hj[(long long)c * Dv + d0 + dd] = S[idx];
            }
        }
        const double alast = gam[CH - 1];
        if (tid < CH) dec[tid] = mx_exp((T)(alast - gam[tid]));
        const T tot = mx_exp((T)alast);
        // Each pass: Un from the level's state (sign −1: Un = W S; base: Un = U − W S; the lift's
        // level 0: Un = U), then S^(e) ← e^{a_j} S^(e) + sign·K̂ᵀ Un.
        for (int e = lifted ? E - 1 : 0; e >= 0; --e) {
            const int from_w = !lifted || e >= 1;
            if (lifted && e >= 1 && !((j >> (e - 1)) & 1)) continue;
            T* Se = S + e * SD;
            T acc[RI] = {};
            if (from_w)
                for (int c = 0; c < Dk; ++c) {
                    const T sv = Se[c * LLC_DVT + tx];
#pragma unroll
                    for (int a = 0; a < RI; ++a) acc[a] = fma(Wc[(ty + 16 * a) * LDW + c], sv, acc[a]);
                }
            const T sign = (lifted && e >= 1) ? (T)-1 : (T)1;
#pragma unroll
            for (int a = 0; a < RI; ++a) {
                const int s = ty + 16 * a, d = d0 + tx;
                T un = (T)0;
                if (s < n && d < Dv) {
                    un = (lifted && e >= 1) ? acc[a] : Uc[s * LLC_DVT + tx] - acc[a];
                    if (!lifted) Vn[(row0 + (long long)s * H) * Dv + d] = un;
                }
                Un[s * LDU + tx] = un;
            }
            __syncthreads();
            for (int c0 = 0; c0 < Dk; c0 += 64) {
                T acc2[4] = {};
                for (int s = 0; s < n; ++s) {
                    const T u = dec[s] * Un[s * LDU + tx];
#pragma unroll
                    for (int a = 0; a < 4; ++a) {
                        const int c = c0 + ty + 16 * a;
                        if (c < Dk) acc2[a] = fma(Kc[s * LDW + c], u, acc2[a]);
                    }
                }
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    const int c = c0 + ty + 16 * a;
                    if (c < Dk) Se[c * LLC_DVT + tx] = tot * Se[c * LLC_DVT + tx] + sign * acc2[a];
                }
            }
            __syncthreads();
        }
    }
}

// 5'. llc_delta_h on tensor cores (tf32 / bf16 modes, f32 data): the same pass, levels and chunk
// order, with each level's two products as m16n8k8 tf32 mma with f32 accumulation, eight warps:
//   Un = W S          — the (16 token rows × 8 value columns) tiles of the 64 × 16 result, one per
//                       warp, ⌈Dk/8⌉ k-steps in two accumulator chains;
//   S ← e^{a_j} S + sign·K̂ᵀ Un — the (16 key rows × 8 value columns) tiles over the warps, k-steps
//                       over the chunk's tokens; the decays e^{a_j − γ_s} and the sign are folded
//                       into Un.
// The states stay f32 in shared memory (only the products' inputs are rounded to tf32). Rows of
// W and K are padded to LDK ≡ 4 (mod 32) floats and rows of S and Un to 24, so that fragment
// loads hit 32 distinct banks; columns Dk..DKP of W and K and rows Dk..DKP of S are zero (DKP = Dk
// rounded up to 16). The chunks' W, K, U and g are loaded ST − 1 chunks ahead (cp.async, 16
// bytes where Dk, Dv and the pointers allow) into ST buffers. Warp 0 loads the chunk's log-decays
// and alone takes their prefix sums (f32, two tokens per lane), so that one barrier per chunk
// publishes the loaded tiles and the decays.
// Grid (BH, ⌈Dv/16⌉), 256 threads; dynamic shared memory: see delta_h_tc_smem on the host.
#define LDT_LDS 24
__device__ __forceinline__ void llc_cp_async16(void* dst, const void* src, int valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ void llc_delta_h_tc(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn,
                               float* Hs, int Tn, int H, int Dk, int Dv, int nc, int lifted, int E, long long slots,
                               int ST) {
    constexpr int CH = 64, NW = 8, NT = NW * 32;
    const int DKP = (Dk + 15) / 16 * 16, LDK = (DKP + 31) / 32 * 32 + 4;
    const int SD = DKP * LDT_LDS;  // one state tile
    extern __shared__ unsigned char llc_dyn[];
    // Layout (floats): S [E][SD] | Wb [ST][CH·LDK] | Kb [ST][CH·LDK] | Ub [ST][CH·16] | gb [ST][CH] |
    // Un [CH·24] | dec [CH + 1] (the last entry: e^{a_j}).
    float* S = reinterpret_cast<float*>(llc_dyn);
    float* Wb = S + E * SD;
    float* Kb = Wb + ST * CH * LDK;
    float* Ub = Kb + ST * CH * LDK;
    float* gb = Ub + ST * CH * LLC_DVT;
    float* Un = gb + ST * CH;
    float* dec = Un + CH * LDT_LDS;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int d0 = blockIdx.y * LLC_DVT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const long long DD = (long long)Dk * Dv;
    const bool vk = Dk % 4 == 0 && ((unsigned long long)k & 15) == 0 && ((unsigned long long)W & 15) == 0;
    const bool vu = Dv % 4 == 0 && ((unsigned long long)U & 15) == 0;
    auto prefetch = [&](int j, int buf) {
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        float* Wd = Wb + buf * CH * LDK;
        float* Kd = Kb + buf * CH * LDK;
        if (vk && NT % (DKP / 4) == 0) {
            // Each thread keeps one column quad c and walks rows s ≡ tid / q4 (mod NT / q4).
            const int q4 = DKP / 4, c = (tid % q4) * 4;
            const long long rs = (long long)H * Dk, at0 = row0 * Dk + c;
            for (int s = tid / q4; s < CH; s += NT / q4) {
                const int ok = s < n && c < Dk;
                llc_cp_async16(Wd + s * LDK + c, ok ? W + at0 + s * rs : W, ok);
                llc_cp_async16(Kd + s * LDK + c, ok ? k + at0 + s * rs : k, ok);
            }
        } else {
            for (int idx = tid; idx < CH * DKP; idx += NT) {
                const int s = idx / DKP, c = idx % DKP, ok = s < n && c < Dk;
                const long long at = ok ? (row0 + (long long)s * H) * Dk + c : 0;
                llc_cp_async(Wd + s * LDK + c, W + at, 4, ok);
                llc_cp_async(Kd + s * LDK + c, k + at, 4, ok);
            }
        }
        float* Ud = Ub + buf * CH * LLC_DVT;
        if (vu) {
            const int dd = (tid & 3) * 4;
            for (int s = tid >> 2; s < CH; s += NT / 4) {
                const int ok = s < n && d0 + dd < Dv;
                llc_cp_async16(Ud + s * LLC_DVT + dd, ok ? U + (row0 + (long long)s * H) * Dv + d0 + dd : U, ok);
            }
        } else {
            for (int idx = tid; idx < CH * LLC_DVT; idx += NT) {
                const int s = idx / LLC_DVT, dd = idx % LLC_DVT, ok = s < n && d0 + dd < Dv;
                llc_cp_async(Ud + idx, U + (ok ? (row0 + (long long)s * H) * Dv + d0 + dd : 0), 4, ok);
            }
        }
        if (tid < 32)  // warp 0 loads every log-decay of the chunk: it alone takes their prefix sums
            for (int s = 2 * tid; s < 2 * tid + 2; ++s) {
                const int ok = has_g && s < n;
                llc_cp_async(gb + buf * CH + s, g + (ok ? row0 + (long long)s * H : 0), 4, ok);
            }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int idx = tid; idx < E * SD; idx += NT) S[idx] = 0.f;
    for (int jj = 0; jj < ST - 1 && jj < nc; ++jj) prefetch(jj, jj);
    for (int j = 0; j < nc; ++j) {
        const int buf = j % ST;
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        if (lifted && j >= 1) {  // merge levels 0..m into m + 1 (S is idle since the last barrier)
            const int m = __ffs(j) - 1;
            for (int idx = tid; idx < SD; idx += NT) {
                float sum = 0.f;
                for (int e = 0; e <= m; ++e) {
                    sum += S[e * SD + idx];
                    S[e * SD + idx] = 0.f;
                }
                S[(m + 1) * SD + idx] = sum;
            }
        }
        // Chunk j's group is complete once at most (chunks issued after it) groups are pending.
        if (j + ST - 1 < nc) prefetch(j + ST - 1, (j + ST - 1) % ST);
        const int after = min(ST - 1, nc - 1 - j);
        if (after >= 3) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
        else if (after >= 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
        else if (after == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        if (warp == 0) {
            // γ (chunk-local cumulative log-decays, two tokens per lane, f32), the decays
            // e^{a_j − γ_s} (0 past the chunk's end) and e^{a_j}.
            __syncwarp();
            const float x0 = gb[buf * CH + 2 * lane], x1 = gb[buf * CH + 2 * lane + 1];
            float inc = x0 + x1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            const float alast = __shfl_sync(0xffffffffu, inc, 31);
            dec[2 * lane] = 2 * lane < n ? __expf(alast - (inc - x1)) : 0.f;
            dec[2 * lane + 1] = 2 * lane + 1 < n ? __expf(alast - inc) : 0.f;
            if (lane == 0) dec[CH] = __expf(alast);
        }
        __syncthreads();
        const float* Wc = Wb + buf * CH * LDK;
        const float* Kc = Kb + buf * CH * LDK;
        const float* Uc = Ub + buf * CH * LLC_DVT;
        const float tot = dec[CH];
        auto write_state = [&](const float* Se, float* Hj) {
            if (Dv % 4 == 0) {  // float4 stores: rows c ≡ tid / 4 (mod NT / 4), columns dd..dd+3
                const int dd = (tid & 3) * 4;
                if (d0 + dd < Dv)
                    for (int c = tid >> 2; c < Dk; c += NT / 4)
                        *reinterpret_cast<float4*>(Hj + (long long)c * Dv + d0 + dd) =
                            *reinterpret_cast<const float4*>(Se + c * LDT_LDS + dd);
                return;
            }
            for (int idx = tid; idx < Dk * LLC_DVT; idx += NT) {
                const int c = idx / LLC_DVT, dd = idx % LLC_DVT;
                if (d0 + dd < Dv) Hj[(long long)c * Dv + d0 + dd] = Se[c * LDT_LDS + dd];
            }
        };
        if (lifted) {
            long long slot = llc_popsum(j);
            for (int e = 1; e < E; ++e) {
                if (!((j >> (e - 1)) & 1)) continue;
                write_state(S + e * SD, Hs + ((long long)bh * slots + slot) * DD);
                ++slot;
            }
        } else {
            write_state(S, Hs + ((long long)bh * nc + j) * DD);
        }
        for (int e = lifted ? E - 1 : 0; e >= 0; --e) {
            const int from_w = !lifted || e >= 1;
            if (lifted && e >= 1 && !((j >> (e - 1)) & 1)) continue;
            float* Se = S + e * SD;
            const float sign = (lifted && e >= 1) ? -1.f : 1.f;
            // Product 1: (m-tile, n-tile) pairs of the 64 × 16 Un over the warps.
            for (int pr = warp; pr < 8; pr += NW) {
                const int mw = pr & 3, nt = pr >> 2;
                float acc[4] = {}, acc2[4] = {};
                if (from_w) {
                    const float* wr = Wc + (mw * 16 + gi) * LDK + tg;
                    const float* sr = Se + tg * LDT_LDS + nt * 8 + gi;
                    int c8 = 0;
#pragma unroll 2
                    for (; c8 + 16 <= DKP; c8 += 16) {
                        mx_mma_tf32(acc, mx_tf32(wr[c8]), mx_tf32(wr[8 * LDK + c8]), mx_tf32(wr[c8 + 4]),
                                    mx_tf32(wr[8 * LDK + c8 + 4]), mx_tf32(sr[c8 * LDT_LDS]),
                                    mx_tf32(sr[(c8 + 4) * LDT_LDS]));
                        mx_mma_tf32(acc2, mx_tf32(wr[c8 + 8]), mx_tf32(wr[8 * LDK + c8 + 8]), mx_tf32(wr[c8 + 12]),
                                    mx_tf32(wr[8 * LDK + c8 + 12]), mx_tf32(sr[(c8 + 8) * LDT_LDS]),
                                    mx_tf32(sr[(c8 + 12) * LDT_LDS]));
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int s = mw * 16 + gi + (u < 2 ? 0 : 8), dd = nt * 8 + 2 * tg + (u & 1), d = d0 + dd;
                    const float ws = acc[u] + acc2[u];
                    float un = 0.f;
                    if (s < n && d < Dv) {
                        un = (lifted && e >= 1) ? ws : Uc[s * LLC_DVT + dd] - ws;
                        if (!lifted) Vn[(row0 + (long long)s * H) * Dv + d] = un;
                    }
                    Un[s * LDT_LDS + dd] = sign * dec[s] * un;
                }
            }
            __syncthreads();
            // Product 2: S ← e^{a_j} S + K̂ᵀ (sign·dec·Un), (m-tile, n-tile) pairs over the warps.
            for (int pr = warp; pr < (DKP / 16) * 2; pr += NW) {
                const int mt = pr >> 1, nt = pr & 1;
                float st[4], st2[4] = {};
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    st[u] = tot * Se[(mt * 16 + gi + (u < 2 ? 0 : 8)) * LDT_LDS + nt * 8 + 2 * tg + (u & 1)];
                const float* kr = Kc + tg * LDK + mt * 16 + gi;
                const float* ur = Un + tg * LDT_LDS + nt * 8 + gi;
                int s8 = 0;
#pragma unroll 2
                for (; s8 + 16 <= ((n + 15) & ~15); s8 += 16) {
                    mx_mma_tf32(st, mx_tf32(kr[s8 * LDK]), mx_tf32(kr[s8 * LDK + 8]), mx_tf32(kr[(s8 + 4) * LDK]),
                                mx_tf32(kr[(s8 + 4) * LDK + 8]), mx_tf32(ur[s8 * LDT_LDS]),
                                mx_tf32(ur[(s8 + 4) * LDT_LDS]));
                    mx_mma_tf32(st2, mx_tf32(kr[(s8 + 8) * LDK]), mx_tf32(kr[(s8 + 8) * LDK + 8]),
                                mx_tf32(kr[(s8 + 12) * LDK]), mx_tf32(kr[(s8 + 12) * LDK + 8]),
                                mx_tf32(ur[(s8 + 8) * LDT_LDS]), mx_tf32(ur[(s8 + 12) * LDT_LDS]));
                }
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    Se[(mt * 16 + gi + (u < 2 ? 0 : 8)) * LDT_LDS + nt * 8 + 2 * tg + (u & 1)] = st[u] + st2[u];
            }
            __syncthreads();
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, 1)
    llc_delta_h_tc_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn, float* Hs,
                       int Tn, int H, int Dk, int Dv, int nc, int lifted, int E, long long slots, int stages) {
    llc_delta_h_tc(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, lifted, E, slots, stages);
}


// 6. Outputs of gated DeltaNet's lift, chunk i, a tile of 64 value columns (docs/math.md §2.6):
// P = σ QKᵀ ⊙ Γ (s ≤ r); the intra-chunk coefficients A = P T⁻¹ diag(β), weighted λ_r^(ℓ(r,s)), give
// y = A V; the carried queries Q̃ = σ diag(e^γ) Q − P W read every level state llc_delta_h wrote for
// the chunk: y_r += Σ_e λ_r^(c+e) Q̃_r S^(e). Grid (NC, BH, ⌈Dv/64⌉), 256 threads; dynamic shared
// memory (Pt, At [CH][CH+1], Qt [64][CH+1], Xs, Ys [16][65]).
template <typename T>
__device__ void llc_out_dl(const T* q, const T* k, const T* v, const T* g, int has_g, const T* beta, const T* lam,
                           const T* W, const T* Ti, const T* Hs, T* y, int Tn, int H, int Dk, int Dv, int L, int nc,
                           long long slots, double scale) {
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16, LDC = CH + 1;
    extern __shared__ unsigned char llc_dyn[];
    T* Pt = reinterpret_cast<T*>(llc_dyn);  // Pt[s][r] = P[r][s]
    T* At = Pt + CH * LDC;                  // At[s][r] = λ-weighted A[r][s]
    T* Qt = At + CH * LDC;                  // Qt[c][r] = Q̃[r][c0 + c]
    T* Xs = Qt + 64 * LDC;
    T* Ys = Xs + LLC_KT * LLC_LD;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T bet[CH];
    const int i = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int d0 = blockIdx.z * LLC_NT;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int i0 = i * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const long long DD = (long long)Dk * Dv;
    const T sc = (T)scale;
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : (T)0;
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    {
        T acc[RI][RI] = {};
        llc_qk<T, CH>(acc, q, k, Xs, Ys, row0, H, Dk, n);
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int bb = 0; bb < RI; ++bb) {
                const int r = ty + 16 * a, s = tx + 16 * bb;
                Pt[s * LDC + r] = (s <= r && r < n) ? sc * acc[a][bb] * mx_exp((T)(gam[r] - gam[s])) : (T)0;
            }
    }
    __syncthreads();
    {
        // A = P T⁻¹ diag(β), reduced over j in tiles of 16.
        const T* Tc = Ti + ((long long)bh * nc + i) * CH * CH;
        T acc[RI][RI] = {};
        for (int j0 = 0; j0 < CH; j0 += LLC_KT) {
            for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
                const int kk = idx / CH, s = idx % CH;
                Ys[kk * LLC_LD + s] = Tc[(j0 + kk) * CH + s] * bet[s];
            }
            __syncthreads();
            llc_gemm<T, RI, RI, LDC, LLC_LD>(acc, Pt + j0 * LDC, Ys, LLC_KT, ty, tx);
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int bb = 0; bb < RI; ++bb) {
                const int r = ty + 16 * a, s = tx + 16 * bb;
                At[s * LDC + r] = (s <= r && r < n)
                                      ? acc[a][bb] * lam[(row0 + (long long)r * H) * L + llc_bitlen((unsigned)(r ^ s))]
                                      : (T)0;
            }
    }
    __syncthreads();
    T yacc[RI][4] = {};
    for (int s0 = 0; s0 < n; s0 += LLC_KT) {
        for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
            const int kk = idx / LLC_NT, dd = idx % LLC_NT, s = s0 + kk;
            Ys[kk * LLC_LD + dd] = (s < n && d0 + dd < Dv) ? v[(row0 + (long long)s * H) * Dv + d0 + dd] : (T)0;
        }
        __syncthreads();
        llc_gemm<T, RI, 4, LDC, LLC_LD>(yacc, At + s0 * LDC, Ys, min(LLC_KT, n - s0), ty, tx);
        __syncthreads();
    }
    const long long first = llc_popsum(i);
    const int ne = __popc((unsigned)i);
    for (int c0 = 0; ne > 0 && c0 < Dk; c0 += 64) {
        // Q̃ for key columns c0..c0+64: σ e^γ Q − P W.
        T qa[RI][4] = {};
        for (int s0 = 0; s0 < n; s0 += LLC_KT) {
            for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                const int kk = idx / LLC_NT, cc = idx % LLC_NT, s = s0 + kk;
                Ys[kk * LLC_LD + cc] = (s < n && c0 + cc < Dk) ? W[(row0 + (long long)s * H) * Dk + c0 + cc] : (T)0;
            }
            __syncthreads();
            llc_gemm<T, RI, 4, LDC, LLC_LD>(qa, Pt + s0 * LDC, Ys, min(LLC_KT, n - s0), ty, tx);
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int r = ty + 16 * a, cc = tx + 16 * jj, c = c0 + cc;
                Qt[cc * LDC + r] = (r < n && c < Dk)
                                       ? sc * mx_exp((T)gam[r]) * q[(row0 + (long long)r * H) * Dk + c] - qa[a][jj]
                                       : (T)0;
            }
        __syncthreads();
        int rank = 0;
        for (int e = 1; e <= llc_bitlen((unsigned)i); ++e) {
            if (!((i >> (e - 1)) & 1)) continue;
            const T* Se = Hs + ((long long)bh * slots + first + rank) * DD;
            ++rank;
            T la[RI][4] = {};
            for (int k0 = 0; k0 < 64 && c0 + k0 < Dk; k0 += LLC_KT) {
                for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                    const int kk = idx / LLC_NT, dd = idx % LLC_NT, c = c0 + k0 + kk;
                    Ys[kk * LLC_LD + dd] = (c < Dk && d0 + dd < Dv) ? Se[(long long)c * Dv + d0 + dd] : (T)0;
                }
                __syncthreads();
                llc_gemm<T, RI, 4, LDC, LLC_LD>(la, Qt + k0 * LDC, Ys, LLC_KT, ty, tx);
                __syncthreads();
            }
#pragma unroll
            for (int a = 0; a < RI; ++a) {
                const int r = ty + 16 * a;
                const T w = r < n ? lam[(row0 + (long long)r * H) * L + CB + e] : (T)0;
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) yacc[a][jj] += w * la[a][jj];
            }
        }
    }
    llc_store<T, RI>(yacc, y, row0, H, Dv, n, d0, ty, tx);
}

// Decoder step, row-parallel (docs/math.md §2.5): one warp per (b·h, value row r) does, for its row
// of every level state S^(l) [Dv×Dk]: the merge (levels 0..m into m + 1, when t ≥ 1 and lifted),
// the transition (Mamba-2 S ← e^g S; gated DeltaNet S ← e^g (S − β (S k) kᵀ)), the insert at
// level 0 (β v_r kᵀ), and the read y_r = σ Σ_l λ^(l) S^(l)_r · q. Grid (⌈Dv/4⌉, BH), 128 threads.
// g, beta and lam are read only when the mixer has them.
template <typename T>
__device__ void llc_step(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* lam, T* st, T* y,
                         int BH, int Dk, int Dv, int NL, int L, int base, int lifted, int t, int m, unsigned occ,
                         double scale) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * 4 + (threadIdx.x >> 5);
    const int bh = blockIdx.y;
    if (r >= Dv) return;
    const long long DD = (long long)Dk * Dv;
    T* S = st + (long long)bh * NL * DD + (long long)r * Dk;
    const T* qq = q + (long long)bh * Dk;
    const T* kk = k + (long long)bh * Dk;
    const T e = base >= 1 ? mx_exp(g[bh]) : (T)1;
    const T bt = base == 2 ? beta[bh] : (T)1;
    const T vr = v[(long long)bh * Dv + r];
    const int merged = lifted && t >= 1;
    T out = (T)0;
    // Descending, so that level m + 1 sums levels 0..m before level 0 is rewritten.
    for (int l = NL - 1; l >= 0; --l) {
        if (!((occ >> l) & 1u)) continue;
        T* Sl = S + l * DD;
        // The row before the transition: the merged sum at level m + 1, zero at level 0 of a lift.
        // u = S_r · k (gated DeltaNet).
        T u = (T)0;
        if (base == 2) {
            for (int c = lane; c < Dk; c += 32) {
                T s;
                if (merged && l == m + 1) {
                    s = (T)0;
                    for (int l2 = 0; l2 <= m; ++l2) s += S[l2 * DD + c];
                } else if (lifted && l == 0) {
                    s = (T)0;
                } else {
                    s = Sl[c];
                }
                u += s * kk[c];
            }
            for (int o = 16; o > 0; o >>= 1) u += __shfl_xor_sync(0xffffffffu, u, o);
        }
        T rd = (T)0;
        for (int c = lane; c < Dk; c += 32) {
            T s;
            if (merged && l == m + 1) {
                s = (T)0;
                for (int l2 = 0; l2 <= m; ++l2) s += S[l2 * DD + c];
            } else if (lifted && l == 0) {
                s = (T)0;
            } else {
                s = Sl[c];
            }
            if (base == 2)
                s = e * (s - bt * u * kk[c]);
            else
                s *= e;
            if (l == 0) s += bt * vr * kk[c];
            Sl[c] = s;
            rd += s * qq[c];
        }
        for (int o = 16; o > 0; o >>= 1) rd += __shfl_xor_sync(0xffffffffu, rd, o);
        out += (lifted ? lam[(long long)bh * L + l] : (T)1) * rd;
    }
    // Levels 1..m were merged away: clear them (level 0 was rewritten above).
    if (merged)
        for (int l = 1; l <= m; ++l)
            for (int c = lane; c < Dk; c += 32) S[l * DD + c] = (T)0;
    if (lane == 0) y[(long long)bh * Dv + r] = (T)scale * out;
}

#define LLC_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_states_##S(const T* k, const T* v, const T* g, int has_g, T* F, double* A, int Tn, int H, int Dk,      \
                       int Dv, int nc) {                                                                          \
        llc_states<T>(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc);                                                   \
    }                                                                                                             \
    extern "C" __global__ void llc_tree_##S(T* F, double* A, int e, int BH, int Dk, int Dv, int nc) {             \
        llc_tree<T>(F, A, e, BH, Dk, Dv, nc);                                                                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_out_##S(const T* q, const T* k, const T* v, const T* g, int has_g, const T* lam, const T* F,          \
                    const double* A, T* y, int Tn, int H, int Dk, int Dv, int L, int lifted, int direct, int nc,  \
                    double scale) {                                                                               \
        llc_out<T>(q, k, v, g, has_g, lam, F, A, y, Tn, H, Dk, Dv, L, lifted, direct, nc, scale);                 \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_wy_##S(const T* k, const T* v, const T* g, int has_g, const T* beta, T* W, T* U, T* Ti, int want_ti,   \
                   int Tn, int H, int Dk, int Dv) {                                                               \
        llc_wy<T>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv);                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_delta_h_##S(const T* k, const T* g, int has_g, const T* W, const T* U, T* Vn, T* Hs, int Tn, int H,   \
                        int Dk, int Dv, int nc, int lifted, int E, long long slots) {                             \
        llc_delta_h<T>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, lifted, E, slots);                           \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_out_dl_##S(const T* q, const T* k, const T* v, const T* g, int has_g, const T* beta, const T* lam,      \
                       const T* W, const T* Ti, const T* Hs, T* y, int Tn, int H, int Dk, int Dv, int L, int nc,  \
                       long long slots, double scale) {                                                           \
        llc_out_dl<T>(q, k, v, g, has_g, beta, lam, W, Ti, Hs, y, Tn, H, Dk, Dv, L, nc, slots, scale);           \
    }                                                                                                             \
    extern "C" __global__ void llc_step_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,         \
                                            const T* lam, T* st, T* y, int BH, int Dk, int Dv, int NL, int L,     \
                                            int base, int lifted, int t, int m, unsigned occ, double scale) {     \
        llc_step<T>(q, k, v, g, beta, lam, st, y, BH, Dk, Dv, NL, L, base, lifted, t, m, occ, scale);             \
    }

LLC_EXPORT(float, f32)
LLC_EXPORT(double, f64)
