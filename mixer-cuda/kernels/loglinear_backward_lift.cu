// The fast backward of the scalar-decay lifts (loglinear-attention, loglinear-mamba2; docs/math.md
// §2.8), launched by loglinear/backward_lift.rs after loglinear_common.cuh. Per (batch, head), with
// G_t = Σ_{r≤t} g_r, the weights w_{ts} = σ λ_t^{ℓ(t,s)} e^{G_t − G_s} (s ≤ t; λ belongs to the
// later token, the query) and y_t = Σ_s w_{ts} (q_t·k_s) v_s:
//   dv_s = Σ_{t≥s} w_{ts} (q_t·k_s) dy_t,   dk_s = Σ_{t≥s} w_{ts} (dy_t·v_s) q_t,
//   dλ_t^ℓ = Σ_{s: ℓ(t,s)=ℓ} σ e^{G_t−G_s} (q_t·k_s)(dy_t·v_s)
// (dq is the lifted forward with (q, k, v) ← (dy, v, k), and dg the reverse cumulative sum of
// q·dq − k·dk: the host runs both). Chunks of CH tokens (Llc<T>), c = log₂ CH. Between chunks j < i
// the level is c + e with e = bitlen(i ⊕ j): query chunk i reaches the lower half of its aligned
// 2^e block when bit e−1 of i is set, so key chunk j is reached at level e by the upper half of its
// aligned 2^e block when bit e−1 of j is clear. With the query side's level-e sources
//   R^e_i = Σ_{t∈i} σ λ_t^{(c+e)} e^{γ_t} q_t dy_tᵀ        (D_k × D_v, γ chunk-local, so referred to
//                                                         the end of chunk i − 1)
// the adjoint that key chunk j receives is one matrix, the sum over its levels,
//   X_j = Σ_{e: bit e−1 of j clear} Σ_{i in the upper half} e^{G_{end(i−1)} − G_{end(j)}} R^e_i,
// and then dv_s += e^{a_j − γ_s} X_jᵀ k_s, dk_s += e^{a_j − γ_s} X_j v_s (a_j = γ_{n−1} of chunk j).
// 1. llbl_src: R^e_i for every chunk i and set bit e − 1 of i (chunk-parallel products), one slot
//    each. Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 256 threads.
// 2. llbl_join: for every level e and aligned 2^e block with an upper half, the sources of that
//    half referred to its start, U^e_m = Σ_{i in the half} e^{G_end(i−1) − G_end(mid−1)} R^e_i. Key
//    chunk j then reads X_j = Σ_{bit e−1 of j clear} e^{d_e} U^e_{j ≫ e}, d_e the decay from the end
//    of j to the half's start (the complete upper halves of the lower clear bits' blocks: the
//    forward's tree decays) — the mirror of the forward's read of its tree. Grid (#U entries, BH,
//    ⌈Dk·Dv/256⌉), 256 threads, a thread per entry.
// 3. llbl_kv: per (chunk, batch·head, tile of 64 columns of dv, then of dk): the intra-chunk part
//    (levels ≤ c, a CH × CH product) and the inter-chunk part from X_j; the blocks of the first dv
//    tile also write dλ of the levels 0 … c. Grid (NC, BH, ⌈Dv/64⌉ + ⌈Dk/64⌉), 256 threads.
// 4. llbl_dlam: dλ of the chunk levels, per (chunk i, batch·head), from the forward's tree of chunk
//    states (loglinear_ssd.cu, llc_levels): for every set bit e−1 of i,
//    dλ_r^{(c+e)} = σ e^{γ_r + d_e} q_rᵀ F_{e−1}(m_e) dy_r. Grid (NC, BH), 256 threads.
// Every sum runs in a fixed order (no atomics): the same inputs give the same bits.

// Level e's blocks with an upper half (midpoint mid = m·2^e + 2^{e−1} < nc) come first for e = 1,
// then e = 2, …: the index of U entry (e, m) among a batch·head's, and how many there are below e.
__device__ inline long long llbl_ucount(int e, int nc) {
    const long long half = 1LL << (e - 1);
    return nc > half ? ((long long)nc - half + (2 * half - 1)) >> e : 0;
}
__device__ inline long long llbl_ubase(int e, int nc) {
    long long s = 0;
    for (int l = 1; l < e; ++l) s += llbl_ucount(l, nc);
    return s;
}

// 1. llbl_src: R^e_i = Σ_r σ λ_r^{(c+e)} e^{γ_r} q_r dy_rᵀ for every set bit e − 1 of chunk i, into
// slot popsum(i) + (rank of e among the set bits) of the batch·head's popsum(nc) slots, a 64 × 64
// tile of (key rows, value columns) per block. Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 256 threads.
template <typename T>
__device__ void llbl_src(const T* q, const T* dy, const T* g, int has_g, const T* lam, T* R, int Tn, int H, int Dk,
                         int Dv, int L, int nc, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Qs[CH * LLC_LD], Ds[CH * LLC_LD], ew[CH], cs[CH];
    const LlcChunk c = llc_chunk<CH>(Tn, H);
    const int i = c.i, bh = c.bh, tid = c.tid, tx = c.tx, ty = c.ty, n = c.n;
    if (i == 0) return;  // no set bits
    const long long row0 = c.row0;
    const int nvt = (Dv + LLC_NT - 1) / LLC_NT;
    const int k0 = (blockIdx.z / nvt) * LLC_NT, v0 = (blockIdx.z % nvt) * LLC_NT;
    const long long DD = (long long)Dk * Dv;
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    for (int idx = tid; idx < CH * LLC_NT; idx += 256) {
        const int r = idx / LLC_NT, cc = idx % LLC_NT;
        const long long row = row0 + (long long)r * H;
        Qs[r * LLC_LD + cc] = (r < n && k0 + cc < Dk) ? q[row * Dk + k0 + cc] : (T)0;
        Ds[r * LLC_LD + cc] = (r < n && v0 + cc < Dv) ? dy[row * Dv + v0 + cc] : (T)0;
    }
    if (tid < CH) ew[tid] = (T)(scale * mx_exp(gam[tid]));
    __syncthreads();
    const long long slot0 = (long long)bh * llc_popsum(nc) + llc_popsum(i);
    int rank = 0;
    for (int e = 1; e <= llc_bitlen((unsigned)i); ++e) {
        if (!((i >> (e - 1)) & 1)) continue;
        if (tid < CH) cs[tid] = tid < n ? ew[tid] * lam[(row0 + (long long)tid * H) * L + CB + e] : (T)0;
        __syncthreads();
        T acc[4][4] = {};
        for (int r = 0; r < n; ++r) {
            const T w = cs[r];
            T xr[4], yr[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) xr[a] = w * Qs[r * LLC_LD + ty + 16 * a];
#pragma unroll
            for (int bb = 0; bb < 4; ++bb) yr[bb] = Ds[r * LLC_LD + tx + 16 * bb];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int bb = 0; bb < 4; ++bb) acc[a][bb] = fma(xr[a], yr[bb], acc[a][bb]);
        }
        T* out = R + (slot0 + rank) * DD;
        LLC_TILE_EACH(4, 4, a, bb, kr, vc, k0, v0) {
            if (kr < Dk && vc < Dv) out[(long long)kr * Dv + vc] = acc[a][bb];
        }
        ++rank;
        __syncthreads();
    }
}

// 2. llbl_join: per level e and aligned 2^e block m of chunks with an upper half, the sources of
// that upper half referred to its start, U^e_m = Σ_{i in the upper half} e^{G_end(i−1) − G_end(mid−1)}
// R^e_i (summed in chunk order; a_i from the tree's level-0 decays). Grid (Σ_e ucount(e), BH,
// ⌈Dk·Dv/256⌉), 256 threads, a thread per entry.
template <typename T>
__device__ void llbl_join(const T* R, const double* A, T* U, int Dk, int Dv, int nc) {
    LLC_FIX_DIMS(Dk, Dv);
    const long long DD = (long long)Dk * Dv, x = (long long)blockIdx.z * 256 + threadIdx.x;
    const int bh = blockIdx.y;
    long long p = blockIdx.x;
    int e = 1;
    while (p >= llbl_ucount(e, nc)) p -= llbl_ucount(e, nc), ++e;
    if (x >= DD) return;
    const int half = 1 << (e - 1), mid = (int)(p << e) + half, end = min(mid + half, nc);
    const long long base = (long long)bh * llc_popsum(nc);
    double d = 0.0;
    T u = (T)0;
    long long ps = llc_popsum(mid);  // popsum(i), advanced by popcount(i)
#pragma unroll 4
    for (int i = mid; i < end; ++i) {
        const long long slot = base + ps + __popc((unsigned)i & (unsigned)(half - 1));
        u = fma((T)mx_exp(d), R[slot * DD + x], u);
        d += A[(long long)bh * nc + i];
        ps += __popc((unsigned)i);
    }
    U[((long long)bh * llbl_ubase(32, nc) + llbl_ubase(e, nc) + p) * DD + x] = u;
}

// The U entries key chunk j reads (thread 0 of llbl_kv; returns how many): for every clear bit
// e − 1 of j whose block has an upper half, entry (e, j ≫ e) and the decay from the end of chunk j
// to that half's start — the complete upper halves of the lower clear bits' blocks (level-(e'−1)
// tree entries 2·(j ≫ e') + 1) summed.
__device__ inline int llbl_levels(int j, int bh, int nc, const double* A, long long* ent, double* dec) {
    int np = 0;
    double d = 0.0;
    const long long ub = (long long)bh * llbl_ubase(32, nc);
    for (int e = 1; e <= 31; ++e) {
        if ((j >> (e - 1)) & 1) continue;
        const long long m = j >> e;
        const long long mid = (m << e) + (1LL << (e - 1));
        if (mid >= nc) break;
        ent[np] = ub + llbl_ubase(e, nc) + m;
        dec[np] = d;
        ++np;
        if (mid + (1LL << (e - 1)) > nc) break;  // an incomplete half: nothing above it
        d += A[llc_entry(e - 1, bh, (int)(2 * m + 1), nc, gridDim.y)];
    }
    return np;
}

// Stores a thread's tile of raw chunk scores (acc[a][b'] = row r · row s) into P [CH][CH + 1],
// row r first.
template <typename T, int CH>
__device__ inline void llbl_put(const T (&acc)[CH / 16][CH / 16], T* P, int ty, int tx) {
    LLC_TILE_EACH(CH / 16, CH / 16, a, bb, r, s, 0, 0) { P[r * (CH + 1) + s] = acc[a][bb]; }
}

template <typename T>
__device__ void llbl_kv(const T* q, const T* k, const T* v, const T* dy, const T* g, int has_g, const T* lam,
                        const T* U, const double* A, T* dk, T* dv, T* dlam, int Tn, int H, int Dk, int Dv, int L,
                        int nc, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T Pa[CH * (CH + 1)], Pb[CH * (CH + 1)];
    __shared__ long long lev_ent[32];  // the U entries chunk i reads and their decays
    __shared__ double lev_d[32];
    __shared__ T lev_w[32];  // e^{d_e}
    __shared__ int nlev_s;
    const LlcChunk c = llc_chunk<CH>(Tn, H);
    const int i = c.i, bh = c.bh, tid = c.tid, tx = c.tx, ty = c.ty, n = c.n;
    const long long row0 = c.row0;
    const int nvt = (Dv + LLC_NT - 1) / LLC_NT;
    const bool for_v = (int)blockIdx.z < nvt;  // a tile of dv (else of dk)
    const bool with_lam = blockIdx.z == 0;
    const int d0 = (for_v ? (int)blockIdx.z : (int)blockIdx.z - nvt) * LLC_NT;
    const int D = for_v ? Dv : Dk;  // columns of the output
    const long long DD = (long long)Dk * Dv;
    const T sc = (T)scale;
    if (tid == 0) {
        nlev_s = llbl_levels(i, bh, nc, A, lev_ent, lev_d);
        for (int l = 0; l < nlev_s; ++l) lev_w[l] = (T)mx_exp(lev_d[l]);
    }
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);  // synchronises
    const int nlev = nlev_s;
    // S1 = Q Kᵀ (dv and dλ), S2 = dY Vᵀ (dk and dλ): raw scores, rows t, columns s.
    T s1[RI][RI] = {}, s2[RI][RI] = {};
    if (for_v) llc_qk<T, CH>(s1, q, k, Xs, Ys, row0, H, Dk, n);
    if (!for_v || with_lam) llc_qk<T, CH>(s2, dy, v, Xs, Ys, row0, H, Dv, n);
    if (with_lam) {
        llbl_put<T, CH>(s1, Pa, ty, tx);
        llbl_put<T, CH>(s2, Pb, ty, tx);
        __syncthreads();
        if (tid < n) {
            const int r = tid;
            const long long row = row0 + (long long)r * H;
            for (int l = 0; l <= CB && l < L; ++l) {
                int lo = r, hi = r + 1;  // the bucket of level l of token r, chunk-local
                if (l > 0) {
                    lo = (r >> l) << l;
                    hi = ((r >> (l - 1)) & 1) ? lo + (1 << (l - 1)) : lo;
                }
                T acc = (T)0;
                for (int s = lo; s < hi; ++s)
                    acc += (T)mx_exp((T)(gam[r] - gam[s])) * Pa[r * (CH + 1) + s] * Pb[r * (CH + 1) + s];
                dlam[row * L + l] = sc * acc;
            }
        }
        __syncthreads();
    }
    // M[t][s] = w_{ts} S[t][s] (t ≥ s) into Pa, row t first: the left operand of dv = Mᵀ dY, dk = Mᵀ Q.
    LLC_TILE_EACH(RI, RI, a, bb, t, s, 0, 0) {
        T m = (T)0;
        if (s <= t && t < n) {
            const long long row = row0 + (long long)t * H;
            const T raw = for_v ? s1[a][bb] : s2[a][bb];
            m = sc * lam[row * L + llc_bitlen((unsigned)(t ^ s))] * (T)mx_exp((T)(gam[t] - gam[s])) * raw;
        }
        Pa[t * (CH + 1) + s] = m;
    }
    __syncthreads();
    T acc[RI][4] = {};
    const T* rhs = for_v ? dy : q;
    for (int t0 = 0; t0 < n; t0 += LLC_KT) {
        for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
            const int kk = idx / LLC_NT, dd = idx % LLC_NT, t = t0 + kk;
            T x = (T)0;
            if (t < n && d0 + dd < D) x = rhs[(row0 + (long long)t * H) * D + d0 + dd];
            Ys[kk * LLC_LD + dd] = x;
        }
        __syncthreads();
        llc_gemm<T, RI, 4, CH + 1, LLC_LD>(acc, Pa + t0 * (CH + 1), Ys, min(LLC_KT, n - t0), ty, tx);
        __syncthreads();
    }
    // Between chunks: dv_s += e^{a − γ_s} Σ_κ k_s[κ] X[κ][d], dk_s += e^{a − γ_s} Σ_κ v_s[κ] X[d][κ], with
    // X = Σ_e e^{d_e} U^e (the entries of llbl_levels).
    if (nlev > 0) {
        const T* lhs = for_v ? k : v;
        const int Dc = for_v ? Dk : Dv;  // the contracted axis
        const double a = gam[n - 1];
        for (int c0 = 0; c0 < Dc; c0 += LLC_KT) {
            for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
                const int s = idx / LLC_KT, kk = idx % LLC_KT, cc = c0 + kk;
                T x = (T)0;
                if (s < n && cc < Dc)
                    x = (T)mx_exp((T)(a - gam[s])) * lhs[(row0 + (long long)s * H) * Dc + cc];
                Xs[kk * LLC_LD + s] = x;
            }
            for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                const int kk = idx / LLC_NT, dd = idx % LLC_NT, cc = c0 + kk, d = d0 + dd;
                T x = (T)0;
                if (cc < Dc && d < D) {
                    const long long off = for_v ? (long long)cc * Dv + d : (long long)d * Dv + cc;
                    for (int l = 0; l < nlev; ++l) x += lev_w[l] * U[lev_ent[l] * DD + off];
                }
                Ys[kk * LLC_LD + dd] = x;
            }
            __syncthreads();
            llc_gemm<T, RI, 4, LLC_LD, LLC_LD>(acc, Xs, Ys, LLC_KT, ty, tx);
            __syncthreads();
        }
    }
    llc_store<T, RI>(acc, for_v ? dv : dk, row0, H, D, n, d0, ty, tx);
}

template <typename T>
__device__ void llbl_dlam(const T* q, const T* dy, const T* g, int has_g, const T* F, const double* A, T* dlam,
                          int Tn, int H, int Dk, int Dv, int L, int nc, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ long long lev_ent[32];
    __shared__ double lev_d[32];
    __shared__ int lev_e[32];
    __shared__ int nlev_s;
    const LlcChunk c = llc_chunk<CH>(Tn, H);
    const int i = c.i, bh = c.bh, tid = c.tid, tx = c.tx, ty = c.ty, n = c.n;
    const long long row0 = c.row0;
    const long long DD = (long long)Dk * Dv;
    if (tid == 0) nlev_s = llc_levels(i, i == 0, bh, nc, 0, A, lev_ent, lev_d, lev_e);
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);  // synchronises
    const int nlev = nlev_s;
    for (int grp = 0; grp < nlev; ++grp) {
        T dot[RI] = {};
        for (int d0 = 0; d0 < Dv; d0 += LLC_NT) {
            T acc[RI][4] = {};
            for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
                for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
                    const int r = idx / LLC_KT, kk = idx % LLC_KT, cc = c0 + kk;
                    T x = (T)0;
                    if (r < n && cc < Dk) x = q[(row0 + (long long)r * H) * Dk + cc];
                    Xs[kk * LLC_LD + r] = x;
                }
                for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                    const int kk = idx / LLC_NT, dd = idx % LLC_NT, cc = c0 + kk, d = d0 + dd;
                    Ys[kk * LLC_LD + dd] = (cc < Dk && d < Dv) ? F[lev_ent[grp] * DD + (long long)cc * Dv + d] : (T)0;
                }
                __syncthreads();
                llc_gemm<T, RI, 4, LLC_LD, LLC_LD>(acc, Xs, Ys, LLC_KT, ty, tx);
                __syncthreads();
            }
            LLC_TILE_EACH(RI, 4, a, jj, r, d, 0, d0) {
                if (r < n && d < Dv) dot[a] = fma(acc[a][jj], dy[(row0 + (long long)r * H) * Dv + d], dot[a]);
            }
        }
#pragma unroll
        for (int a = 0; a < RI; ++a)
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) dot[a] += __shfl_xor_sync(0xffffffffu, dot[a], o);
        if (tx == 0) {
#pragma unroll
            for (int a = 0; a < RI; ++a) {
                const int r = ty + 16 * a;
                const int l = CB + lev_e[grp];
                if (r < n && l < L)
                    dlam[(row0 + (long long)r * H) * L + l] = (T)scale * (T)mx_exp(gam[r] + lev_d[grp]) * dot[a];
            }
        }
    }
}

#define LLBL_EXPORT(T, S)                                                                                         \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_src_##S(const T* q, const T* dy, const T* g, int has_g, const T* lam, T* R, int Tn, int H, int Dk,    \
                     int Dv, int L, int nc, double scale) {                                                       \
        llbl_src<T>(q, dy, g, has_g, lam, R, Tn, H, Dk, Dv, L, nc, scale);                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_join_##S(const T* R, const double* A, T* U, int Dk, int Dv, int nc) {                                \
        llbl_join<T>(R, A, U, Dk, Dv, nc);                                                                        \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_kv_##S(const T* q, const T* k, const T* v, const T* dy, const T* g, int has_g, const T* lam,          \
                    const T* U, const double* A, T* dk, T* dv, T* dlam, int Tn, int H, int Dk, int Dv, int L,     \
                    int nc, double scale) {                                                                       \
        llbl_kv<T>(q, k, v, dy, g, has_g, lam, U, A, dk, dv, dlam, Tn, H, Dk, Dv, L, nc, scale);                  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_dlam_##S(const T* q, const T* dy, const T* g, int has_g, const T* F, const double* A, T* dlam,       \
                      int Tn, int H, int Dk, int Dv, int L, int nc, double scale) {                               \
        llbl_dlam<T>(q, dy, g, has_g, F, A, dlam, Tn, H, Dk, Dv, L, nc, scale);                                   \
    }

LLBL_EXPORT(float, f32)
LLBL_EXPORT(double, f64)
