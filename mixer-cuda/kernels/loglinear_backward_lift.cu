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
// 1. llbl_pass: X_j for every chunk, one reverse sweep over the chunks per (batch·head, 16 × 16
//    tile of X): every entry keeps one accumulator per chunk level e, A^e = the sources of the
//    later query chunks of the current aligned 2^e block, decayed to the end of the chunk at hand.
//    For chunk j, last to first: A^e ← 0 where j ends its 2^e block; X_j = Σ_{bit e−1 of j clear}
//    A^e; then A^e ← e^{a_j} A^e for every e and A^e += R^e_j for the set bits. The accumulators
//    live in dynamic shared memory (emax·256 entries), the next chunk's inputs are loaded into
//    registers while a chunk computes. Grid (⌈Dk/16⌉·⌈Dv/16⌉, BH), 256 threads (a thread per entry).
// 2. llbl_kv: per (chunk, batch·head, tile of 64 columns of dv, then of dk): the intra-chunk part
//    (levels ≤ c, a CH × CH product) and the inter-chunk part from X_j; the blocks of the first dv
//    tile also write dλ of the levels 0 … c. Grid (NC, BH, ⌈Dv/64⌉ + ⌈Dk/64⌉), 256 threads.
// 3. llbl_dlam: dλ of the chunk levels, per (chunk i, batch·head), from the forward's tree of chunk
//    states (loglinear_ssd.cu, llc_levels): for every set bit e−1 of i,
//    dλ_r^{(c+e)} = σ e^{γ_r + d_e} q_rᵀ F_{e−1}(m_e) dy_r. Grid (NC, BH), 256 threads.
// Every sum runs in a fixed order (no atomics): the same inputs give the same bits.

#define LLBL_LMAX 24  // chunk levels kept by the pass (NC < 2^24 chunks)
#ifndef LLBL_SMEM  // (the CPU harness supplies its own buffer)
#define LLBL_SMEM extern __shared__ __align__(16) unsigned char llbl_smem[]
#endif

// One chunk of the pass's inputs in registers (loaded one chunk ahead, so that the loads of chunk
// j − 1 are in flight while chunk j computes): the block's 16 key columns of q and 16 value columns
// of dy, λ of the chunk levels whose bit is set in j (Ls[e − 1][r]), and g of thread r.
template <typename T, int CH> struct LlblRegs {
    static constexpr int PQ = CH * 16 / 256, PL = LLBL_LMAX * CH / 256;
    T q[PQ], d[PQ], l[PL];
    double g;
};

template <typename T, int CH>
__device__ inline void llbl_fetch(LlblRegs<T, CH>& x, int j, const T* q, const T* dy, const T* g, int has_g,
                                  const T* lam, int Tn, int H, int Dk, int Dv, int L, int b, int h, int k0, int v0,
                                  int emax) {
    constexpr int CB = Llc<T>::CBITS;
    const int tid = threadIdx.x, i0 = j * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
#pragma unroll
    for (int u = 0; u < LlblRegs<T, CH>::PQ; ++u) {
        const int idx = tid + 256 * u, r = idx / 16, cc = idx % 16;
        const long long row = row0 + (long long)r * H;
        x.q[u] = (r < n && k0 + cc < Dk) ? q[row * Dk + k0 + cc] : (T)0;
        x.d[u] = (r < n && v0 + cc < Dv) ? dy[row * Dv + v0 + cc] : (T)0;
    }
#pragma unroll
    for (int u = 0; u < LlblRegs<T, CH>::PL; ++u) {
        const int idx = tid + 256 * u, e = idx / CH + 1, r = idx % CH;
        x.l[u] = (e <= emax && r < n && ((j >> (e - 1)) & 1)) ? lam[(row0 + (long long)r * H) * L + CB + e] : (T)0;
    }
    x.g = (has_g && tid < n) ? (double)g[row0 + (long long)tid * H] : 0.0;
}

template <typename T>
__device__ void llbl_pass(const T* q, const T* dy, const T* g, int has_g, const T* lam, T* X, int Tn, int H, int Dk,
                          int Dv, int L, int nc, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH;
    using Regs = LlblRegs<T, CH>;
    __shared__ double gtmp[CH];
    __shared__ T ew[CH], Qs[CH * 17], Ds[CH * 17], Ls[LLBL_LMAX * CH];
    // The accumulators A^e of every thread, As[(e − 1)·256 + tid]: dynamic shared memory of
    // emax·256 entries (the host sizes it; f64 at 24 levels needs more than 48 KiB).
    LLBL_SMEM;
    T* As = reinterpret_cast<T*>(llbl_smem);
    __shared__ T da_s;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int nvt = (Dv + 15) / 16;
    const int k0 = (blockIdx.x / nvt) * 16, v0 = (blockIdx.x % nvt) * 16;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int kr = k0 + ty, vc = v0 + tx;
    const bool mine = kr < Dk && vc < Dv;
    const int emax = llc_bitlen((unsigned)(nc - 1));
    const long long DD = (long long)Dk * Dv;
    for (int e = 0; e < emax; ++e) As[e * 256 + tid] = (T)0;
    Regs nx;
    llbl_fetch<T, CH>(nx, nc - 1, q, dy, g, has_g, lam, Tn, H, Dk, Dv, L, b, h, k0, v0, emax);
    for (int j = nc - 1; j >= 0; --j) {
        // Chunk j's inputs into shared memory, σ e^{γ_r} and e^{a_j}.
#pragma unroll
        for (int u = 0; u < Regs::PQ; ++u) {
            const int idx = tid + 256 * u;
            Qs[(idx / 16) * 17 + idx % 16] = nx.q[u];
            Ds[(idx / 16) * 17 + idx % 16] = nx.d[u];
        }
#pragma unroll
        for (int u = 0; u < Regs::PL; ++u) Ls[tid + 256 * u] = nx.l[u];
        const double gp = llc_prefix<CH>(nx.g, gtmp);
        if (tid < CH) ew[tid] = (T)(scale * mx_exp(gp));
        if (tid == CH - 1) da_s = (T)mx_exp(gp);
        __syncthreads();
        if (j > 0) llbl_fetch<T, CH>(nx, j - 1, q, dy, g, has_g, lam, Tn, H, Dk, Dv, L, b, h, k0, v0, emax);
        T t[CH];
#pragma unroll
        for (int r = 0; r < CH; ++r) t[r] = ew[r] * Qs[r * 17 + ty] * Ds[r * 17 + tx];
        const T da = da_s;
        T xs = (T)0;
        for (int e = 1; e <= emax; ++e) {
            T a = As[(e - 1) * 256 + tid];
            if (((j + 1) & ((1 << e) - 1)) == 0) a = (T)0;  // j ends its 2^e block
            const bool set = (j >> (e - 1)) & 1;
            if (!set) xs += a;
            a *= da;
            if (set) {
                const T* lw = Ls + (e - 1) * CH;
                T r0 = (T)0, r1 = (T)0;
#pragma unroll
                for (int r = 0; r < CH; r += 2) {
                    r0 = fma(lw[r], t[r], r0);
                    r1 = fma(lw[r + 1], t[r + 1], r1);
                }
                a += r0 + r1;
            }
            As[(e - 1) * 256 + tid] = a;
        }
        if (mine) X[((long long)bh * nc + j) * DD + (long long)kr * Dv + vc] = xs;
        __syncthreads();
    }
}

// Stores a thread's tile of raw chunk scores (acc[a][b'] = row r · row s) into P [CH][CH + 1],
// row r first.
template <typename T, int CH>
__device__ inline void llbl_put(const T (&acc)[CH / 16][CH / 16], T* P, int ty, int tx) {
    LLC_TILE_EACH(CH / 16, CH / 16, a, bb, r, s, 0, 0) { P[r * (CH + 1) + s] = acc[a][bb]; }
}

template <typename T>
__device__ void llbl_kv(const T* q, const T* k, const T* v, const T* dy, const T* g, int has_g, const T* lam,
                        const T* X, T* dk, T* dv, T* dlam, int Tn, int H, int Dk, int Dv, int L, int nc,
                        double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T Pa[CH * (CH + 1)], Pb[CH * (CH + 1)];
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
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
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
    // Between chunks: dv_s += e^{a − γ_s} Σ_κ k_s[κ] X[κ][d], dk_s += e^{a − γ_s} Σ_κ v_s[κ] X[d][κ].
    if (i < nc - 1) {
        const T* Xj = X + ((long long)bh * nc + i) * DD;
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
                if (cc < Dc && d < D) x = for_v ? Xj[(long long)cc * Dv + d] : Xj[(long long)d * Dv + cc];
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
    if (tid == 0) nlev_s = llc_levels(i, bh, nc, 0, A, lev_ent, lev_d, lev_e);
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
        llbl_pass_##S(const T* q, const T* dy, const T* g, int has_g, const T* lam, T* X, int Tn, int H, int Dk,   \
                      int Dv, int L, int nc, double scale) {                                                      \
        llbl_pass<T>(q, dy, g, has_g, lam, X, Tn, H, Dk, Dv, L, nc, scale);                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_kv_##S(const T* q, const T* k, const T* v, const T* dy, const T* g, int has_g, const T* lam,          \
                    const T* X, T* dk, T* dv, T* dlam, int Tn, int H, int Dk, int Dv, int L, int nc, double scale) { \
        llbl_kv<T>(q, k, v, dy, g, has_g, lam, X, dk, dv, dlam, Tn, H, Dk, Dv, L, nc, scale);                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llbl_dlam_##S(const T* q, const T* dy, const T* g, int has_g, const T* F, const double* A, T* dlam,       \
                      int Tn, int H, int Dk, int Dv, int L, int nc, double scale) {                               \
        llbl_dlam<T>(q, dy, g, has_g, F, A, dlam, Tn, H, Dk, Dv, L, nc, scale);                                   \
    }

LLBL_EXPORT(float, f32)
LLBL_EXPORT(double, f64)
