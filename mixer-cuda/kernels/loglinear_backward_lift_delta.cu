// The lifted gated DeltaNet's chunked backward (docs/math.md §2.9), launched from
// src/loglinear/backward_lift_delta.rs after the forward's WY step (llc_wy: W, U, T⁻¹ per chunk).
// Per chunk j of n ≤ CH tokens, with γ, Γ, K̂ = diag(τ) K (τ_r = e^(a − γ_r), a = γ_{n−1}) and
// P = σ (QKᵀ ⊙ Γ) (lower, diagonal included) as in loglinear_backward_chunked.cu,
// N = T⁻¹ diag(β), Q̃ = σ diag(e^γ) Q − P W, w_e the λ weights of chunk level e (λ^(c + e),
// c = log₂ CH) and Λ_rs = λ_r^(bitlen(r ⊕ s)), the forward is
//   Y = Σ_e diag(w_e) Q̃ Z^e + (Λ ⊙ P N) V   (e over the levels present: bit e − 1 of j),
//   Z^e ← e^a Z^e − K̂ᵀ W Z^e (present e),   Z^0 = K̂ᵀ U (the chunk's own state),
// the levels 0 … m merged into m + 1 (m = ctz j) before chunk j ≥ 1. With X^e the adjoints of
// the level states after chunk j (level 0 and the present ones):
// - lgl_fwd:    the forward pass over chunks: the level states Z^e entering every chunk (the
//               forward's, written at slots popsum(j) + rank);
// - lgl_qt:     Q̃ (chunk-parallel), rows of a [B,T,H,Dk] tensor;
// - lgl_rev:    the reverse pass from the last chunk: X^e written per chunk (level 0 first, then
//               the present levels in ascending order, at slots popsum(j) + j + rank), then
//               X^e ← e^a X^e − Wᵀ (K̂ X^e) + Q̃ᵀ diag(w_e) dY for the present levels, and the
//               merge's adjoint: levels 0 … m take level m + 1's adjoint;
// - lgl_levels: chunk-parallel, dQ̃ = Σ_e diag(w_e) dY Z^eᵀ, dλ^(c+e)_r = q̃_r·(dY Z^eᵀ)_r and
//               Hxz = Σ_e X^e Z^eᵀ ([B·H][NC][Dk][Dk]);
// - lgl_grad:   chunk-parallel, every input gradient and dλ of the levels inside the chunk (below).
// The passes share one body (lgl_pass). Every sum runs in a fixed order (no atomics): the same
// inputs give the same bits. FMA in T.

#define LGL_NCOL 16  // state columns per block of the passes

// A matrix operand in global or shared memory: entry (i, κ) = p[i·si + κ·sk] for i < ni, 0 from
// ni on (and for κ ≥ K in lgl_prod).
template <typename T> struct LglM {
    const T* p;
    long long si, sk;
    int ni;
};

// A chunk's rows r < n of a [B,T,H,D] tensor from column c0 on: entry (r, κ) = x[(row0 + r·H)·D + c0 + κ].
template <typename T>
__device__ inline LglM<T> lgl_rows(const T* x, long long row0, int H, int D, int c0, int n) {
    return {x + row0 * D + c0, (long long)H * D, 1, n};
}

// acc[a][b] += Σ_{κ < K} A(ty + 16 a, κ) · B(tx + 16 b, κ), through slices of LLC_KT staged in
// Xs, Ys [LLC_KT][LLC_LD] (the κ-contiguous operand read along κ). The next slice is read from
// memory into registers while this one is multiplied. 256 threads; synchronises before and after
// staging each slice.
template <typename T, int RI, int RJ>
__device__ inline void lgl_prod(T (&acc)[RI][RJ], LglM<T> A, LglM<T> B, int K, T* Xs, T* Ys, int ty, int tx) {
    constexpr int PER = LLC_KT * LLC_NT / 256;  // entries of each operand per thread and slice
    T ra[PER], rb[PER];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int idx = threadIdx.x + 256 * u;
            const int ia = A.sk == 1 ? idx / LLC_KT : idx % LLC_NT, ka = A.sk == 1 ? idx % LLC_KT : idx / LLC_NT;
            const int ib = B.sk == 1 ? idx / LLC_KT : idx % LLC_NT, kb = B.sk == 1 ? idx % LLC_KT : idx / LLC_NT;
            ra[u] = (ia < A.ni && k0 + ka < K) ? A.p[ia * A.si + (k0 + ka) * A.sk] : (T)0;
            rb[u] = (ib < B.ni && k0 + kb < K) ? B.p[ib * B.si + (k0 + kb) * B.sk] : (T)0;
        }
    };
    if (K > 0) fetch(0);
    for (int k0 = 0; k0 < K; k0 += LLC_KT) {
        __syncthreads();
#pragma unroll
        for (int u = 0; u < PER; ++u) {
            const int idx = threadIdx.x + 256 * u;
            const int ia = A.sk == 1 ? idx / LLC_KT : idx % LLC_NT, ka = A.sk == 1 ? idx % LLC_KT : idx / LLC_NT;
            const int ib = B.sk == 1 ? idx / LLC_KT : idx % LLC_NT, kb = B.sk == 1 ? idx % LLC_KT : idx / LLC_NT;
            Xs[ka * LLC_LD + ia] = ra[u];
            Ys[kb * LLC_LD + ib] = rb[u];
        }
        __syncthreads();
        if (k0 + LLC_KT < K) fetch(k0 + LLC_KT);
        lgb_gemm2<T, RI, RJ>(acc, Xs, LLC_LD, 1, Ys, LLC_LD, 1, min(LLC_KT, K - k0), ty, tx);
    }
}

// The chunk's P = σ (QKᵀ ⊙ Γ) (lower, diagonal included; zero from row n on) into P [CH][CH + 1].
template <typename T, int CH>
__device__ inline void lgl_p(T* P, const T* q, const T* k, const double* gam, LlcChunk ck, int H, int Dk, T scale,
                             T* Xs, T* Ys) {
    constexpr int RI = CH / 16, LDN = CH + 1;
    T acc[RI][RI] = {};
    lgl_prod<T, RI, RI>(acc, lgl_rows(q, ck.row0, H, Dk, 0, ck.n), lgl_rows(k, ck.row0, H, Dk, 0, ck.n), Dk, Xs, Ys,
                        ck.ty, ck.tx);
    const int ty = ck.ty, tx = ck.tx;
    LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
        P[r * LDN + s] = (s <= r && r < ck.n) ? scale * acc[a][bb] * (T)mx_exp(gam[r] - gam[s]) : (T)0;
    }
    __syncthreads();
}

// Q̃ = σ diag(e^γ) Q − P W of chunk blockIdx.x, batch·head blockIdx.y, into qt (rows as q).
// Dynamic shared memory (lgl_qt_smem on the host): P [CH][CH + 1], the W tile [64][LLC_LD], Xs, Ys.
template <typename T>
__device__ void lgl_qt(const T* q, const T* k, const T* g, const T* W, T* qt, int Tn, int H, int Dk, int Dv, T scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDN = CH + 1;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    __shared__ double gam[CH], gtmp[1];
    __shared__ T wq[CH];
    T* P = reinterpret_cast<T*>(lgl_smem);
    T* Wt = P + CH * LDN;
    T *Xs = Wt + LLC_NT * LLC_LD, *Ys = Xs + LLC_KT * LLC_LD;
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, n = ck.n;
    llc_gamma<T, CH>(gam, gtmp, g, 1, ck.row0, H, n);
    if (threadIdx.x < CH) wq[threadIdx.x] = scale * (T)mx_exp(gam[threadIdx.x]);  // σ e^(γ_r), once per row
    lgl_p<T, CH>(P, q, k, gam, ck, H, Dk, scale, Xs, Ys);
    for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
        __syncthreads();
        lgb_tile<T, CH>(Wt, W, ck.row0, H, Dk, d0, n, [](int) { return (T)1; });
        __syncthreads();
        T acc[RI][4] = {};
        lgb_gemm2<T, RI, 4>(acc, P, 1, LDN, Wt, LLC_LD, 1, n, ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, d0) {
            if (r < n && d < Dk) {
                const long long off = (ck.row0 + (long long)r * H) * Dk + d;
                qt[off] = fma(wq[r], q[off], -acc[a][bb]);
            }
        }
    }
}

// The passes over chunks (module comment) for batch·head blockIdx.x and state columns
// c0 = LGL_NCOL·blockIdx.y onwards, 256 threads: thread (c = tid mod 16, r0 = tid / 16) keeps
// column c of rows r0 + 16 u. E levels (E ≥ 1); the level states [E][Dk][NCOL] in shared memory,
// or with has_gst in gst (that block's [E][Dk][NCOL] at gst + (blockIdx.x·gridDim.y +
// blockIdx.y)·E·Dk·NCOL). Per chunk (K̂ = diag(τ) K):
//   forward (REV = false, chunks 0 → NC − 1; src = U): merge levels 0 … m into m + 1 (m = ctz j),
//     write the present levels to out at slots popsum(j) + rank ([B·H][popsum(NC)][Dk][Dv]), take
//     each through the chunk, S ← e^a S − K̂ᵀ (W S), and set level 0 to K̂ᵀ U;
//   reverse (REV = true, from NC − 1; src = dY, lam the mapped weights [B,T,H,L], qt = Q̃): write
//     level 0 and the present levels to out at slots popsum(j) + j + rank ([B·H][popsum(NC) + NC]
//     [Dk][Dv]), take each present level back, S ← e^a S − Wᵀ (K̂ S) + Q̃ᵀ diag(w_e) dY, then give
//     levels 0 … m level m + 1's adjoint (the merge's).
// A chunk's rows come in by cp.async into one of `stages` stage buffers: with two, the next
// chunk's while this one computes. Dynamic shared memory (lgl_pass_smem on the host): the states
// unless in gst, `stages` stage buffers (the chunk's W, k and in reverse Q̃ rows [CH][Dk + 1], the
// src columns [CH][NCOL], in reverse the weights [CH][E], the log-decays [CH]), the new values
// [CH][NCOL].
template <typename T, bool REV>
__device__ void lgl_pass(const T* k, const T* g, const T* W, const T* qt, const T* src, const T* lam, T* out, T* gst,
                         int has_gst, int Tn, int H, int Dk, int Dv, int L, int NC, int E, int stages) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, NCOL = LGL_NCOL, NU = CH * NCOL / 256, CB = Llc<T>::CBITS, NR = REV ? 3 : 2;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    __shared__ double gam[CH], gtmp[1];
    __shared__ T tau[CH];
    const int ld = Dk + 1, SD = Dk * NCOL;
    const int ss = NR * CH * ld + CH * NCOL + (REV ? CH * E : 0) + CH;  // one stage buffer
    T* base = reinterpret_cast<T*>(lgl_smem);
    T* S = has_gst ? gst + ((long long)blockIdx.x * gridDim.y + blockIdx.y) * E * SD : base;
    T* st0 = has_gst ? base : base + E * SD;
    T* V = st0 + stages * ss;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, c0 = blockIdx.y * NCOL, tid = threadIdx.x;
    const int c = tid % NCOL, r0 = tid / NCOL;
    auto chunk = [&](int step) { return REV ? NC - 1 - step : step; };
    auto row_of = [&](int j) { return ((long long)b * Tn + (long long)j * CH) * H + h; };
    // Stage buffer of a step: W, K, Q̃ rows, the src columns, the weights, the log-decays.
    auto buf = [&](int step) { return st0 + (stages == 2 ? (step & 1) * ss : 0); };
    auto load = [&](int step) {
        const int j = chunk(step), n = min(CH, Tn - j * CH);
        const long long row0 = row_of(j);
        T* Wb = buf(step);
        T* Kb = Wb + CH * ld;
        T* Qb = Kb + CH * ld;
        T* Db = Wb + NR * CH * ld;
        T* Lb = Db + CH * NCOL;
        T* gb = Lb + (REV ? CH * E : 0);
        for (int idx = tid; idx < CH * Dk; idx += 256) {
            const int r = idx / Dk, d = idx % Dk;
            const bool in = r < n;
            const long long off = in ? (row0 + (long long)r * H) * Dk + d : 0;
            llc_cp_async(Wb + r * ld + d, W + off, sizeof(T), in);
            llc_cp_async(Kb + r * ld + d, k + off, sizeof(T), in);
            if (REV) llc_cp_async(Qb + r * ld + d, qt + off, sizeof(T), in);
        }
        for (int idx = tid; idx < CH * NCOL; idx += 256) {
            const int r = idx / NCOL, cc = c0 + idx % NCOL;
            const bool in = r < n && cc < Dv;
            llc_cp_async(Db + idx, src + (in ? (row0 + (long long)r * H) * Dv + cc : 0), sizeof(T), in);
        }
        if (REV)
            for (int idx = tid; idx < CH * E; idx += 256) {
                const int r = idx / E, e = idx % E;
                const bool in = r < n && e >= 1 && CB + e < L;
                llc_cp_async(Lb + idx, lam + (in ? (row0 + (long long)r * H) * L + CB + e : 0), sizeof(T), in);
            }
        if (tid < CH) {
            const bool in = tid < n;
            llc_cp_async(gb + tid, g + (in ? row0 + (long long)tid * H : 0), sizeof(T), in);
        }
    };
    for (int i = tid; i < E * SD; i += 256) S[i] = (T)0;
    const long long obase = (long long)bh * (llc_popsum(NC) + (REV ? NC : 0));
    load(0);
    lgb_commit();
    for (int step = 0; step < NC; ++step) {
        const int j = chunk(step), n = min(CH, Tn - j * CH);
        if (stages == 1 && step > 0) {
            load(step);
            lgb_commit();
        }
        if (stages == 2 && step + 1 < NC) {
            load(step + 1);
            lgb_commit();
            lgb_wait1();
        } else {
            lgb_wait0();
        }
        const T* Wb = buf(step);
        const T* Kb = Wb + CH * ld;
        const T* Qb = Kb + CH * ld;
        const T* Db = Wb + NR * CH * ld;
        const T* Lb = Db + CH * NCOL;
        const T* gb = Lb + (REV ? CH * E : 0);
        if (!REV && j >= 1) {
            const int m = __ffs(j) - 1;
            for (int i = tid; i < SD; i += 256) {
                T sum = (T)0;
                for (int e = 0; e <= m; ++e) {
                    sum += S[e * SD + i];
                    S[e * SD + i] = (T)0;
                }
                S[(m + 1) * SD + i] = sum;
            }
        }
        __syncthreads();
        const double x = llc_prefix<CH>(tid < CH ? (double)gb[tid] : 0.0, gtmp);
        if (tid < CH) gam[tid] = x;
        __syncthreads();
        const double a = gam[n - 1];
        if (tid < CH) tau[tid] = tid < n ? (T)mx_exp(a - gam[tid]) : (T)0;
        {
            long long slot = obase + llc_popsum(j) + (REV ? j : 0);
            for (int e = REV ? 0 : 1; e < E; ++e) {
                if (e >= 1 && !((j >> (e - 1)) & 1)) continue;
                T* oj = out + slot * Dk * Dv;
                for (int i = tid; i < SD; i += 256)
                    if (c0 + i % NCOL < Dv) oj[(long long)(i / NCOL) * Dv + c0 + i % NCOL] = S[e * SD + i];
                ++slot;
            }
        }
        __syncthreads();
        const T ea = (T)mx_exp(a);
        // V = K̂ S (reverse) or W S (forward), then S ← e^a S − Wᵀ V (+ the source) or − K̂ᵀ V.
        const T* L1 = REV ? Kb : Wb;
        const T* L2 = REV ? Wb : Kb;
        for (int e = 1; e < E; ++e) {
            if (!((j >> (e - 1)) & 1)) continue;
            T* Se = S + e * SD;
            {
                T acc[NU];
                lgb_rows_state<T, NU>(acc, L1, ld, Se, NCOL, Dk, r0, c);
#pragma unroll
                for (int u = 0; u < NU; ++u) {
                    const int r = r0 + 16 * u;
                    V[r * NCOL + c] = REV ? tau[r] * acc[u] : acc[u];
                }
            }
            __syncthreads();
            for (int d = r0; d < Dk; d += 16) {
                T acc = ea * Se[d * NCOL + c], acc2 = (T)0;
                for (int r = 0; r < n; ++r) {
                    const T l2 = REV ? L2[r * ld + d] : tau[r] * L2[r * ld + d];
                    acc = fma(-l2, V[r * NCOL + c], acc);
                    if (REV) acc2 = fma(Qb[r * ld + d], Lb[r * E + e] * Db[r * NCOL + c], acc2);
                }
                Se[d * NCOL + c] = acc + acc2;
            }
            __syncthreads();
        }
        if (REV && j >= 1) {
            // The merge's adjoint: levels 0 … m take level m + 1's, which is empty before chunk j.
            const int m = __ffs(j) - 1;
            for (int i = tid; i < SD; i += 256) {
                const T v = S[(m + 1) * SD + i];
                for (int e = 0; e <= m; ++e) S[e * SD + i] = v;
                S[(m + 1) * SD + i] = (T)0;
            }
        }
        if (!REV)
            // The chunk's own state at level 0: K̂ᵀ U (level 0 is empty: merged before this chunk).
            for (int d = r0; d < Dk; d += 16) {
                T acc = (T)0;
                for (int r = 0; r < n; ++r) acc = fma(tau[r] * Kb[r * ld + d], Db[r * NCOL + c], acc);
                S[d * NCOL + c] = acc;
            }
        __syncthreads();
    }
}

// The reverse pass's transition form, chunk-parallel part, for chunk blockIdx.x, batch·head
// blockIdx.y: the map Mᵀ_j = −Wᵀ K̂ ([B·H][NC][DKP][DKP], DKP = Dk rounded up to 16, zero past Dk;
// mt[d][d'] = −Σ_r W_rd τ_r k_rd'), e^{a_j} (ea [B·H][NC]) and the sources R^e_j = Q̃ᵀ diag(w_e) dY
// of the present levels (slots popsum(j) + rank, [B·H][popsum(NC)][Dk][Dv]). Dynamic shared memory
// (lgl_src_smem on the host): two tiles [CH][LLC_LD].
template <typename T>
__device__ void lgl_src(const T* k, const T* g, const T* W, const T* qt, const T* dy, const T* lam, T* mt, T* ea,
                        T* rs, int Tn, int H, int Dk, int Dv, int L, int NC, int E) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS;
    const int DKP = (Dk + 15) / 16 * 16;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    __shared__ double gam[CH], gtmp[1];
    __shared__ T tau[CH];
    T* A = reinterpret_cast<T*>(lgl_smem);
    T* Bt = A + CH * LLC_LD;
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, n = ck.n, j = ck.i;
    llc_gamma<T, CH>(gam, gtmp, g, 1, ck.row0, H, n);
    if (threadIdx.x == 0) ea[(long long)ck.bh * NC + j] = (T)mx_exp(gam[n - 1]);
    if (threadIdx.x < CH) tau[threadIdx.x] = -(T)mx_exp(gam[n - 1] - gam[threadIdx.x]);  // once per row
    // Mᵀ_j, 64 × 64 tiles: A = W tile (rows r, key columns d), Bt = τ-weighted k tile.
    T* mj = mt + ((long long)ck.bh * NC + j) * DKP * DKP;
    for (int d0 = 0; d0 < DKP; d0 += LLC_NT)
        for (int e0 = 0; e0 < DKP; e0 += LLC_NT) {
            __syncthreads();
            lgb_tile<T, CH>(A, W, ck.row0, H, Dk, d0, n, [](int) { return (T)1; });
            lgb_tile<T, CH>(Bt, k, ck.row0, H, Dk, e0, n,
                            [&](int r) { return tau[r]; });
            __syncthreads();
            T acc[4][4] = {};
            lgb_gemm2<T, 4, 4>(acc, A, LLC_LD, 1, Bt, LLC_LD, 1, n, ty, tx);
            LLC_TILE_EACH(4, 4, a, bb, d, d2, d0, e0) {
                if (d < DKP && d2 < DKP) mj[(long long)d * DKP + d2] = d < Dk && d2 < Dk ? acc[a][bb] : (T)0;
            }
        }
    // R^e_j, 64 × 64 tiles: A = Q̃ tile, Bt = w_e-weighted dY tile.
    long long slot = (long long)ck.bh * llc_popsum(NC) + llc_popsum(j);
    for (int e = 1; e < E; ++e) {
        if (!((j >> (e - 1)) & 1)) continue;
        T* rj = rs + slot * Dk * Dv;
        const bool has = CB + e < L;
        for (int d0 = 0; d0 < Dk; d0 += LLC_NT)
            for (int c0 = 0; c0 < Dv; c0 += LLC_NT) {
                __syncthreads();
                lgb_tile<T, CH>(A, qt, ck.row0, H, Dk, d0, n, [](int) { return (T)1; });
                lgb_tile<T, CH>(Bt, dy, ck.row0, H, Dv, c0, n, [&](int r) {
                    return has ? lam[(ck.row0 + (long long)r * H) * L + CB + e] : (T)0;
                });
                __syncthreads();
                T acc[4][4] = {};
                lgb_gemm2<T, 4, 4>(acc, A, LLC_LD, 1, Bt, LLC_LD, 1, n, ty, tx);
                LLC_TILE_EACH(4, 4, a, bb, d, cc, d0, c0) {
                    if (d < Dk && cc < Dv) rj[(long long)d * Dv + cc] = acc[a][bb];
                }
            }
        ++slot;
    }
}

// Four consecutive entries of shared memory (16-byte aligned), two (8- or 16-byte aligned).
__device__ __forceinline__ void lgl_ld4(const float* p, float (&x)[4]) {
#ifdef __CUDACC__
    const float4 v = *reinterpret_cast<const float4*>(p);
    x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
#else
    for (int i = 0; i < 4; ++i) x[i] = p[i];
#endif
}
__device__ __forceinline__ void lgl_ld4(const double* p, double (&x)[4]) {
#ifdef __CUDACC__
    const double2 v = *reinterpret_cast<const double2*>(p), w = *reinterpret_cast<const double2*>(p + 2);
    x[0] = v.x, x[1] = v.y, x[2] = w.x, x[3] = w.y;
#else
    for (int i = 0; i < 4; ++i) x[i] = p[i];
#endif
}
template <typename T> __device__ __forceinline__ void lgl_ld2(const T* p, T& a, T& b) {
#ifdef __CUDACC__
    if constexpr (sizeof(T) == 4) {
        const float2 v = *reinterpret_cast<const float2*>(p);
        a = v.x, b = v.y;
    } else {
        const double2 v = *reinterpret_cast<const double2*>(p);
        a = v.x, b = v.y;
    }
#else
    a = p[0], b = p[1];
#endif
}

// The reverse pass in the transition form, for batch·head blockIdx.x and state columns
// c0 = LGL_NCOL·blockIdx.y onwards, 256 threads, from the last chunk j = NC − 1 down: write level 0
// and the present levels to xs (slots as lgl_rev's), then take each present level e back,
// X^e ← e^{a_j} X^e + Mᵀ_j X^e + R^e_j, and apply the merge's adjoint (levels 0 … m, m = ctz j,
// take level m + 1's; level m + 1 is zero). The states are double-buffered (read one, write the
// other: one barrier per chunk); with ST = 2 stage buffers Mᵀ_{j−1} and e^{a_{j−1}} are copied
// (cp.async) while chunk j computes, with ST = 1 before it. Warp w owns the 16 × 8 tiles w, w + 8, … of a level's DKP × 16 state; lane (gi, tg)
// the entries at rows 16·(tile / 2) + gi (+ 8), columns 8·(tile mod 2) + 2 tg (+ 1), the layout of
// an mma accumulator (as llc_lift_h). Dynamic shared memory (lgl_rev_t_smem on the host): the
// states [2][E][DKP][16], Mᵀ [ST][DKP][DKP + 4], e^{a} [ST].
template <typename T>
__device__ void lgl_rev_t(const T* mt, const T* eas, const T* rs, T* xs, int Dk, int Dv, int NC, int E, int ST) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int NCOL = LGL_NCOL, NW = 8;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    const int DKP = (Dk + 15) / 16 * 16, LDK = DKP + 4, SD = DKP * NCOL, NTILE = DKP / 16 * 2;
    T* S = reinterpret_cast<T*>(lgl_smem);
    T* Mb = S + 2 * E * SD;
    T* tb = Mb + ST * DKP * LDK;
    const int bh = blockIdx.x, c0 = blockIdx.y * NCOL, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    for (int i = tid; i < 2 * E * SD; i += NW * 32) S[i] = (T)0;
    const long long xbase = (long long)bh * (llc_popsum(NC) + NC), rbase = (long long)bh * llc_popsum(NC);
    auto prefetch = [&](int j, int buf) {
        const T* m = mt + ((long long)bh * NC + j) * DKP * DKP;
        constexpr int V = 16 / sizeof(T);  // entries per 16-byte copy
        for (int idx = tid; idx < DKP * DKP / V; idx += NW * 32) {
            const int r = idx / (DKP / V), q = idx % (DKP / V) * V;
            llc_cp_async(Mb + buf * DKP * LDK + r * LDK + q, m + (long long)r * DKP + q, 16, 1);
        }
        if (tid == 0) llc_cp_async(tb + buf, eas + (long long)bh * NC + j, sizeof(T), 1);
        lgb_commit();
    };
    if (ST == 2) prefetch(NC - 1, 0);
    for (int jj = 0; jj < NC; ++jj) {
        const int j = NC - 1 - jj, buf = jj & 1, mbuf = ST == 2 ? buf : 0;
        if (ST == 2) {
            lgb_wait0();
            __syncthreads();  // chunk j's copies and the states of chunk j + 1 are in place
            if (j >= 1) prefetch(j - 1, buf ^ 1);  // that buffer was last read by chunk j + 1
        } else {
            __syncthreads();  // chunk j + 1 is done with the buffer
            prefetch(j, 0);
            lgb_wait0();
            __syncthreads();
        }
        const T* Sp = S + buf * E * SD;
        T* Sq = S + (buf ^ 1) * E * SD;
        {
            long long slot = xbase + llc_popsum(j) + j;
            for (int e = 0; e < E; ++e) {
                if (e >= 1 && !((j >> (e - 1)) & 1)) continue;
                T* oj = xs + slot * Dk * Dv;
                for (int i = tid; i < Dk * NCOL; i += NW * 32)
                    if (c0 + i % NCOL < Dv) oj[(long long)(i / NCOL) * Dv + c0 + i % NCOL] = Sp[e * SD + i];
                ++slot;
            }
        }
        if (j == 0) break;
        const T* Mc = Mb + mbuf * DKP * LDK;
        const T ea = tb[mbuf];
        const int m = __ffs(j) - 1;
        const long long rj0 = rbase + llc_popsum(j);  // chunk j's first source slot
        for (int tw = warp; tw < NTILE; tw += NW) {
            const int r0 = (tw >> 1) * 16 + gi, cl = (tw & 1) * 8 + 2 * tg;  // this lane's entries
            auto at = [&](int u) { return (r0 + (u < 2 ? 0 : 8)) * NCOL + cl + (u & 1); };
            // This lane's entries of the source of the present level of rank `rank` (ascending e) at
            // chunk j, read one present level ahead so that the load overlaps the level before's
            // product.
            auto source = [&](int rank, T (&x)[4]) {
                const T* rj = rs + (rj0 + rank) * Dk * Dv;
                for (int u = 0; u < 4; ++u) {
                    const int r = r0 + (u < 2 ? 0 : 8), c = c0 + cl + (u & 1);
                    x[u] = r < Dk && c < Dv ? rj[(long long)r * Dv + c] : (T)0;
                }
            };
            int rank = 0;  // level m + 1 is the lowest present level
            T rcur[4];
            source(rank, rcur);
            for (int e = m + 1; e < E; ++e) {
                T* sq = Sq + e * SD;
                const T* sp = Sp + e * SD;
                if (!((j >> (e - 1)) & 1)) {  // absent: carried over
                    for (int u = 0; u < 4; ++u) sq[at(u)] = sp[at(u)];
                    continue;
                }
                T rnext[4] = {(T)0, (T)0, (T)0, (T)0};
                if (rank + 1 < __popc((unsigned)j)) source(rank + 1, rnext);
                ++rank;
                T acc[4], acc2[4] = {(T)0, (T)0, (T)0, (T)0};
                for (int u = 0; u < 4; ++u) acc[u] = fma(ea, sp[at(u)], rcur[u]);
#pragma unroll 4
                for (int k4 = 0; k4 < DKP; k4 += 4) {
                    T x0[4], x1[4];
                    lgl_ld4(Mc + r0 * LDK + k4, x0);
                    lgl_ld4(Mc + (r0 + 8) * LDK + k4, x1);
#pragma unroll
                    for (int kk = 0; kk < 4; ++kk) {
                        T y0, y1;
                        lgl_ld2(sp + (k4 + kk) * NCOL + cl, y0, y1);
                        T* ac = kk & 1 ? acc2 : acc;
                        ac[0] = fma(x0[kk], y0, ac[0]);
                        ac[1] = fma(x0[kk], y1, ac[1]);
                        ac[2] = fma(x1[kk], y0, ac[2]);
                        ac[3] = fma(x1[kk], y1, ac[3]);
                    }
                }
                for (int u = 0; u < 4; ++u) acc[u] += acc2[u];
                if (e == m + 1) {  // the merge's adjoint: levels 0 … m take it, level m + 1 is zero
                    for (int u = 0; u < 4; ++u) {
                        for (int e2 = 0; e2 <= m; ++e2) Sq[e2 * SD + at(u)] = acc[u];
                        sq[at(u)] = (T)0;
                    }
                } else {
                    for (int u = 0; u < 4; ++u) sq[at(u)] = acc[u];
                }
                for (int u = 0; u < 4; ++u) rcur[u] = rnext[u];
            }
        }
    }
}

// The level terms of chunk blockIdx.x, batch·head blockIdx.y (module comment): dQ̃ into dqt (rows
// as q), dλ of the chunk levels into dlam (columns c + e), Hxz into hxz [B·H][NC][Dk][Dk]. zs: the
// forward's level states (slots popsum(j) + rank), xs: lgl_rev's adjoints. Dynamic shared memory
// (lgl_levels_smem on the host): Xs, Ys, the row sums [CH][E].
template <typename T>
__device__ void lgl_levels(const T* dy, const T* qt, const T* lam, const T* zs, const T* xs, T* dqt, T* dlam, T* hxz,
                           int Tn, int H, int Dk, int Dv, int L, int NC, int E) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, RI = CH / 16, CB = Llc<T>::CBITS;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    T* Xs = reinterpret_cast<T*>(lgl_smem);
    T* Ys = Xs + LLC_KT * LLC_LD;
    T* DL = Ys + LLC_KT * LLC_LD;
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, n = ck.n, j = ck.i;
    const long long DD = (long long)Dk * Dv;
    const long long zbase = ((long long)ck.bh * llc_popsum(NC) + llc_popsum(j)) * DD;
    const long long xbase = ((long long)ck.bh * (llc_popsum(NC) + NC) + llc_popsum(j) + j) * DD;
    for (int i = ck.tid; i < CH * E; i += 256) DL[i] = (T)0;
    for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
        T dq[RI][4] = {};
        int rank = 0;
        for (int e = 1; e < E; ++e) {
            if (!((j >> (e - 1)) & 1)) continue;
            T dz[RI][4] = {};
            const LglM<T> Z = {zs + zbase + rank * DD + (long long)d0 * Dv, Dv, 1, Dk - d0};
            lgl_prod<T, RI, 4>(dz, lgl_rows(dy, ck.row0, H, Dv, 0, n), Z, Dv, Xs, Ys, ty, tx);
            T part[RI] = {};
            LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, d0) {
                if (r < n && d < Dk) {
                    const long long row = ck.row0 + (long long)r * H;
                    dq[a][bb] = fma(lam[row * L + CB + e], dz[a][bb], dq[a][bb]);
                    part[a] = fma(qt[row * Dk + d], dz[a][bb], part[a]);
                }
            }
#pragma unroll
            for (int a = 0; a < RI; ++a) {
                const T x = lgb_row_sum(part[a]);
                if (tx == 0) DL[(ty + 16 * a) * E + e] += x;
            }
            ++rank;
        }
        LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, d0) {
            if (r < n && d < Dk) dqt[(ck.row0 + (long long)r * H) * Dk + d] = dq[a][bb];
        }
    }
    __syncthreads();
    for (int i = ck.tid; i < CH * E; i += 256) {
        const int r = i / E, e = i % E;
        if (r < n && e >= 1 && ((j >> (e - 1)) & 1)) dlam[(ck.row0 + (long long)r * H) * L + CB + e] = DL[i];
    }
    T* hj = hxz + ((long long)ck.bh * NC + j) * Dk * Dk;
    for (int r0 = 0; r0 < Dk; r0 += LLC_NT)
        for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
            T acc[4][4] = {};
            int rank = 0;
            for (int e = 1; e < E; ++e) {
                if (!((j >> (e - 1)) & 1)) continue;
                const LglM<T> X = {xs + xbase + (rank + 1) * DD + (long long)r0 * Dv, Dv, 1, Dk - r0};
                const LglM<T> Z = {zs + zbase + rank * DD + (long long)d0 * Dv, Dv, 1, Dk - d0};
                lgl_prod<T, 4, 4>(acc, X, Z, Dv, Xs, Ys, ty, tx);
                ++rank;
            }
            LLC_TILE_EACH(4, 4, a, bb, r, d, r0, d0) {
                if (r < Dk && d < Dk) hj[(long long)r * Dk + d] = acc[a][bb];
            }
        }
}

// Dynamic shared memory of lgl_grad, in T entries (the host's lgl_grad_smem agrees): six [CH][CH + 1]
// matrices, four tiles [64][LLC_LD] and the slices Xs, Ys [LLC_KT][LLC_LD].
template <typename T> struct LglGrad {
    static constexpr int CH = Llc<T>::CH, LDN = CH + 1, NN = CH * LDN, WT = LLC_NT * LLC_LD, SL = LLC_KT * LLC_LD;
    static constexpr int TOTAL = 6 * NN + 4 * WT + 2 * SL;
};

// Every input gradient of chunk blockIdx.x, batch·head blockIdx.y (docs/math.md §2.9), and dλ of
// the levels inside the chunk (0 … c), from T⁻¹ (ti [B·H][NC][CH][CH]), W and U (the forward's WY
// step), Q̃-side terms dQ̃ (dqt) and Hxz (hxz) of lgl_levels, and X^0 (level 0's adjoint after the
// chunk, xs). dk is written twice (the second pass adds (F + Fᵀ) K). 256 threads as a 16 × 16 grid:
// 1. P, N = T⁻¹ diag(β), A = P N, G = dY Vᵀ; dA = Λ ⊙ G (lower), dλ^(ℓ)_r += Σ_s A_rs G_rs over
//    the s with bitlen(r ⊕ s) = ℓ;
// 2. per 64 value columns: dU = K̂ X^0, dv = (Λ ⊙ A)ᵀ dY + Nᵀ dU, dN += dU Vᵀ; then dN += Pᵀ dA;
//    β̄_s += Σ_r dN_rs T⁻¹_rs; dP = dA Nᵀ − dQ̃ Wᵀ, F_P = σ dP ⊙ Γ (lower);
// 3. per 64 key columns: dW = −K̂ Hxz − Pᵀ dQ̃, ω = T⁻ᵀ dW, dK̂ = −W Hxzᵀ + U X^0ᵀ,
//    dq = F_P K + σ diag(e^γ) dQ̃, dk = F_Pᵀ Q + diag(β e^γ) ω + diag(τ) dK̂, and
//    dT⁻¹ += dW Kᵀ diag(β e^γ), with the row dots for γ̄ and β̄;
// 4. dT⁻¹ += dN diag(β); dT = −T⁻ᵀ dT⁻¹ T⁻ᵀ (strict lower), F = dT ⊙ diag(β) Γ, β̄_r += Σ_s dT_rs
//    Γ_rs (KKᵀ)_rs, the decay terms F_P ⊙ QKᵀ + F ⊙ KKᵀ (+ at r, − at s);
// 5. per 64 key columns dk += (F + Fᵀ) K; γ̄_{n−1} += e^a tr Hxz + Σ_r τ_r k_r·dK̂_r, dg = the
//    reverse cumulative sum of γ̄ inside the chunk, dβ.
template <typename T>
__device__ void lgl_grad(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* dy, const T* lam,
                         const T* ti, const T* W, const T* U, const T* dqt, const T* hxz, const T* xs, T* dq, T* dk,
                         T* dv, T* db, T* dg, T* dlam, int Tn, int H, int Dk, int Dv, int L, int NC, T scale) {
    LLC_FIX_DIMS(Dk, Dv);
    using G = LglGrad<T>;
    constexpr int CH = G::CH, RI = CH / 16, LDN = G::LDN, LD = LLC_LD;
    extern __shared__ __align__(16) unsigned char lgl_smem[];
    T* sm = reinterpret_cast<T*>(lgl_smem);
    T *Ti = sm, *P = Ti + G::NN, *N = P + G::NN, *M1 = N + G::NN, *M2 = M1 + G::NN, *M3 = M2 + G::NN;
    T *T1 = M3 + G::NN, *T2 = T1 + G::WT, *T3 = T2 + G::WT, *T4 = T3 + G::WT;
    T *Xs = T4 + G::WT, *Ys = Xs + G::SL;
    __shared__ double gam[CH], gtmp[1], dgs[CH];
    __shared__ T bet[CH], eg[CH], tau[CH], rq[CH], rk[CH], rkh[CH], rdb[CH], rdt[CH];
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, tid = ck.tid, n = ck.n;
    const long long row0 = ck.row0;
    const long long nbase = (long long)ck.bh * NC + ck.i;
    const T* x0 = xs + ((long long)ck.bh * (llc_popsum(NC) + NC) + llc_popsum(ck.i) + ck.i) * Dk * Dv;
    const T* hj = hxz + nbase * Dk * Dk;
    llc_gamma<T, CH>(gam, gtmp, g, 1, row0, H, n);
    if (tid < CH) {
        const bool in = tid < n;
        bet[tid] = in ? beta[row0 + (long long)tid * H] : (T)0;
        eg[tid] = in ? (T)mx_exp(gam[tid]) : (T)0;
        tau[tid] = in ? (T)mx_exp(gam[n - 1] - gam[tid]) : (T)0;
    }
    const T* tij = ti + nbase * CH * CH;
    __syncthreads();
    for (int idx = tid; idx < CH * CH; idx += 256) {
        const int r = idx / CH, s = idx % CH;
        const T t = (r < n && s < n) ? tij[idx] : (T)0;
        Ti[r * LDN + s] = t;
        N[r * LDN + s] = t * bet[s];
    }
    // 1. P, A = P N, G = dY Vᵀ, dA = Λ ⊙ G into M2, Λ ⊙ A into M1, dλ of the levels inside the chunk.
    lgl_p<T, CH>(P, q, k, gam, ck, H, Dk, scale, Xs, Ys);
    {
        T am[RI][RI] = {}, gm[RI][RI] = {};
        lgb_gemm2<T, RI, RI>(am, P, 1, LDN, N, LDN, 1, n, ty, tx);
        lgl_prod<T, RI, RI>(gm, lgl_rows(dy, row0, H, Dv, 0, n), lgl_rows(v, row0, H, Dv, 0, n), Dv, Xs, Ys, ty, tx);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
            const bool low = r < n && s <= r;
            const T lw = low ? lam[(row0 + (long long)r * H) * L + llc_bitlen((unsigned)(r ^ s))] : (T)0;
            M1[r * LDN + s] = lw * am[a][bb];
            M2[r * LDN + s] = lw * gm[a][bb];
            M3[r * LDN + s] = low ? am[a][bb] * gm[a][bb] : (T)0;
        }
        __syncthreads();
        if (tid < n) {
            T lev[Llc<T>::CBITS + 1] = {};
            for (int s = 0; s <= tid; ++s) lev[llc_bitlen((unsigned)(tid ^ s))] += M3[tid * LDN + s];
            for (int l = 0; l <= Llc<T>::CBITS && l < L; ++l) dlam[(row0 + (long long)tid * H) * L + l] = lev[l];
        }
    }
    // 2. The values side: dU = K̂ X^0 (T1), dv, dN in registers.
    T dn[RI][RI] = {};
    for (int c0 = 0; c0 < Dv; c0 += LLC_NT) {
        T du[RI][4] = {};
        const LglM<T> X0 = {x0 + c0, 1, Dv, Dv - c0};
        lgl_prod<T, RI, 4>(du, lgl_rows(k, row0, H, Dk, 0, n), X0, Dk, Xs, Ys, ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, r, c, 0, 0) { T1[r * LD + c] = tau[r] * du[a][bb]; }
        lgb_tile<T, CH>(T2, dy, row0, H, Dv, c0, n, [](int) { return (T)1; });
        for (int idx = tid; idx < CH * LLC_NT; idx += 256) {
            const int r = idx / LLC_NT, c = idx % LLC_NT;
            T3[c * LD + r] = (r < n && c0 + c < Dv) ? v[(row0 + (long long)r * H) * Dv + c0 + c] : (T)0;
        }
        __syncthreads();
        T dvv[RI][4] = {};
        lgb_gemm2<T, RI, 4>(dvv, M1, LDN, 1, T2, LD, 1, n, ty, tx);
        lgb_gemm2<T, RI, 4>(dvv, N, LDN, 1, T1, LD, 1, n, ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, s, c, 0, c0) {
            if (s < n && c < Dv) dv[(row0 + (long long)s * H) * Dv + c] = dvv[a][bb];
        }
        lgb_gemm2<T, RI, RI>(dn, T1, 1, LD, T3, LD, 1, min(LLC_NT, Dv - c0), ty, tx);
        __syncthreads();
    }
    lgb_gemm2<T, RI, RI>(dn, P, LDN, 1, M2, LDN, 1, n, ty, tx);
    {
        // dP = dA Nᵀ − dQ̃ Wᵀ; F_P = σ dP ⊙ Γ (lower) into M1 (Λ ⊙ A is no longer read);
        // dN ⊙ T⁻¹ into M3 for β̄, dN diag(β) kept in dn.
        T dp[RI][RI] = {}, qw[RI][RI] = {};
        lgb_gemm2<T, RI, RI>(dp, M2, 1, LDN, N, 1, LDN, n, ty, tx);
        lgl_prod<T, RI, RI>(qw, lgl_rows(dqt, row0, H, Dk, 0, n), lgl_rows(W, row0, H, Dk, 0, n), Dk, Xs, Ys, ty, tx);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
            const bool low = r < n && s <= r;
            M1[r * LDN + s] = low ? scale * (dp[a][bb] - qw[a][bb]) * (T)mx_exp(gam[r] - gam[s]) : (T)0;
            M3[r * LDN + s] = dn[a][bb] * Ti[r * LDN + s];
            dn[a][bb] *= bet[s];
        }
        __syncthreads();
        if (tid < CH) {
            T x = (T)0;
            for (int r = 0; r < n; ++r) x += M3[r * LDN + tid];
            rdb[tid] = x;
        }
    }
    // 3. The keys side: dW (T1), ω = T⁻ᵀ dW, dK̂, dq, the first dk; dT⁻¹ += dW Kᵀ diag(β e^γ).
    T dti[RI][RI] = {};
    T pq[RI] = {}, pk[RI] = {}, pkh[RI] = {};
    for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
        T kh[RI][4] = {}, wh[RI][4] = {};
        const LglM<T> Hc = {hj + d0, 1, Dk, Dk - d0}, Hr = {hj + (long long)d0 * Dk, Dk, 1, Dk - d0};
        lgl_prod<T, RI, 4>(kh, lgl_rows(k, row0, H, Dk, 0, n), Hc, Dk, Xs, Ys, ty, tx);
        lgl_prod<T, RI, 4>(wh, lgl_rows(W, row0, H, Dk, 0, n), Hr, Dk, Xs, Ys, ty, tx);
        const LglM<T> X0r = {x0 + (long long)d0 * Dv, Dv, 1, Dk - d0};
        T ux[RI][4] = {};
        lgl_prod<T, RI, 4>(ux, lgl_rows(U, row0, H, Dv, 0, n), X0r, Dv, Xs, Ys, ty, tx);
        lgb_tile<T, CH>(T2, dqt, row0, H, Dk, d0, n, [](int) { return (T)1; });
        lgb_tile<T, CH>(T3, k, row0, H, Dk, d0, n, [](int) { return (T)1; });
        lgb_tile<T, CH>(T4, q, row0, H, Dk, d0, n, [](int) { return (T)1; });
        __syncthreads();
        T ptq[RI][4] = {};
        lgb_gemm2<T, RI, 4>(ptq, P, LDN, 1, T2, LD, 1, n, ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, 0) { T1[r * LD + d] = -tau[r] * kh[a][bb] - ptq[a][bb]; }
        __syncthreads();
        T om[RI][4] = {}, fq[RI][4] = {}, fk[RI][4] = {};
        lgb_gemm2<T, RI, 4>(om, Ti, LDN, 1, T1, LD, 1, n, ty, tx);
        lgb_gemm2<T, RI, 4>(fq, M1, 1, LDN, T3, LD, 1, n, ty, tx);
        lgb_gemm2<T, RI, 4>(fk, M1, LDN, 1, T4, LD, 1, n, ty, tx);
        lgb_gemm2<T, RI, RI>(dti, T1, 1, LD, T3, 1, LD, min(LLC_NT, Dk - d0), ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, 0) {
            if (r < n && d0 + d < Dk) {
                const long long off = (row0 + (long long)r * H) * Dk + d0 + d;
                const T dqv = T2[r * LD + d], kv = T3[r * LD + d], qv = T4[r * LD + d];
                const T dkh = ux[a][bb] - wh[a][bb];
                const T sq = scale * eg[r];
                dq[off] = fma(sq, dqv, fq[a][bb]);
                dk[off] = fk[a][bb] + bet[r] * eg[r] * om[a][bb] + tau[r] * dkh;
                pq[a] = fma(qv, sq * dqv, pq[a]);
                pk[a] = fma(kv, om[a][bb], pk[a]);
                pkh[a] = fma(kv, tau[r] * dkh, pkh[a]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < RI; ++a) {
        const T x1 = lgb_row_sum(pq[a]), x2 = lgb_row_sum(pk[a]), x3 = lgb_row_sum(pkh[a]);
        if (tx == 0) {
            const int r = ty + 16 * a;
            rq[r] = x1, rk[r] = x2, rkh[r] = x3;
        }
    }
    // 4. dT⁻¹ (M2) = dN diag(β) + dW Kᵀ diag(β e^γ); M3 = dT⁻¹ T⁻ᵀ; dT = −T⁻ᵀ M3.
    LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) { M2[r * LDN + s] = fma(dti[a][bb], bet[s] * eg[s], dn[a][bb]); }
    __syncthreads();
    {
        T m3[RI][RI] = {};
        lgb_gemm2<T, RI, RI>(m3, M2, 1, LDN, Ti, 1, LDN, n, ty, tx);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) { M3[r * LDN + s] = m3[a][bb]; }
    }
    __syncthreads();
    {
        T dt[RI][RI] = {}, qk[RI][RI] = {}, kk[RI][RI] = {};
        lgb_gemm2<T, RI, RI>(dt, Ti, LDN, 1, M3, LDN, 1, n, ty, tx);
        lgl_prod<T, RI, RI>(qk, lgl_rows(q, row0, H, Dk, 0, n), lgl_rows(k, row0, H, Dk, 0, n), Dk, Xs, Ys, ty, tx);
        lgl_prod<T, RI, RI>(kk, lgl_rows(k, row0, H, Dk, 0, n), lgl_rows(k, row0, H, Dk, 0, n), Dk, Xs, Ys, ty, tx);
        // F + Fᵀ into M2, the decay terms into M3 (both read no more as dT⁻¹ and dT⁻¹ T⁻ᵀ).
        T dbr[RI] = {};
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
            const bool strict = r < n && s < r;
            const T gm = strict ? (T)mx_exp(gam[r] - gam[s]) : (T)0;
            const T d = strict ? -dt[a][bb] : (T)0;
            const T f = d * bet[r] * gm;
            dbr[a] = fma(d * gm, kk[a][bb], dbr[a]);
            M2[r * LDN + s] = f;  // F (strict lower); Fᵀ added below
            M3[r * LDN + s] = strict ? fma(M1[r * LDN + s], qk[a][bb], f * kk[a][bb]) : (T)0;
        }
#pragma unroll
        for (int a = 0; a < RI; ++a) {
            const T x = lgb_row_sum(dbr[a]);
            if (tx == 0) rdt[ty + 16 * a] = x;
        }
    }
    __syncthreads();
    {
        // F + Fᵀ: each thread reads its entries' mirror before any thread writes.
        T fs[RI][RI];
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) { fs[a][bb] = M2[r * LDN + s] + M2[s * LDN + r]; }
        __syncthreads();
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) { M2[r * LDN + s] = fs[a][bb]; }
    }
    if (tid < CH) {
        double x = 0.0;
        for (int s = 0; s < CH; ++s) x += (double)M3[tid * LDN + s];
        for (int r = 0; r < CH; ++r) x -= (double)M3[r * LDN + tid];
        dgs[tid] = x;
    }
    __syncthreads();
    // 5. dk += (F + Fᵀ) K.
    for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
        lgb_tile<T, CH>(T3, k, row0, H, Dk, d0, n, [](int) { return (T)1; });
        __syncthreads();
        T fk[RI][4] = {};
        lgb_gemm2<T, RI, 4>(fk, M2, 1, LDN, T3, LD, 1, n, ty, tx);
        LLC_TILE_EACH(RI, 4, a, bb, r, d, 0, d0) {
            if (r < n && d < Dk) dk[(row0 + (long long)r * H) * Dk + d] += fk[a][bb];
        }
        __syncthreads();
    }
    if (tid == 0) {
        double tr = 0.0;
        for (int d = 0; d < Dk; ++d) tr += (double)hj[(long long)d * Dk + d];
        double last = mx_exp(gam[n - 1]) * tr;
        for (int r = 0; r < n; ++r) last += (double)rkh[r];
        double acc = 0.0;
        for (int r = n - 1; r >= 0; --r) {
            acc += dgs[r] + (double)rq[r] + (double)(bet[r] * eg[r] * rk[r]) - (double)rkh[r] +
                   (r == n - 1 ? last : 0.0);
            const long long row = row0 + (long long)r * H;
            dg[row] = (T)acc;
            db[row] = rdb[r] + eg[r] * rk[r] + rdt[r];
        }
    }
}

#define LGL_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void lgl_qt_##S(const T* q, const T* k, const T* g, const T* W, T* qt, int Tn, int H,     \
                                          int Dk, int Dv, T scale) {                                            \
        lgl_qt<T>(q, k, g, W, qt, Tn, H, Dk, Dv, scale);                                                        \
    }                                                                                                           \
    extern "C" __global__ void lgl_fwd_##S(const T* k, const T* g, const T* W, const T* U, T* zs, T* gst,         \
                                           int has_gst, int Tn, int H, int Dk, int Dv, int NC, int E,            \
                                           int stages) {                                                        \
        lgl_pass<T, false>(k, g, W, nullptr, U, nullptr, zs, gst, has_gst, Tn, H, Dk, Dv, 0, NC, E, stages);    \
    }                                                                                                           \
    extern "C" __global__ void lgl_rev_##S(const T* k, const T* g, const T* W, const T* qt, const T* dy,         \
                                           const T* lam, T* xs, T* gst, int has_gst, int Tn, int H, int Dk,       \
                                           int Dv, int L, int NC, int E, int stages) {                          \
        lgl_pass<T, true>(k, g, W, qt, dy, lam, xs, gst, has_gst, Tn, H, Dk, Dv, L, NC, E, stages);             \
    }                                                                                                           \
    extern "C" __global__ void lgl_src_##S(const T* k, const T* g, const T* W, const T* qt, const T* dy,         \
                                           const T* lam, T* mt, T* ea, T* rs, int Tn, int H, int Dk, int Dv,     \
                                           int L, int NC, int E) {                                              \
        lgl_src<T>(k, g, W, qt, dy, lam, mt, ea, rs, Tn, H, Dk, Dv, L, NC, E);                                  \
    }                                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 1)                                                         \
        lgl_rev_t_##S(const T* mt, const T* ea, const T* rs, T* xs, int Dk, int Dv, int NC, int E, int ST) {      \
        lgl_rev_t<T>(mt, ea, rs, xs, Dk, Dv, NC, E, ST);                                                        \
    }                                                                                                           \
    extern "C" __global__ void lgl_levels_##S(const T* dy, const T* qt, const T* lam, const T* zs, const T* xs,  \
                                              T* dqt, T* dlam, T* hxz, int Tn, int H, int Dk, int Dv, int L,     \
                                              int NC, int E) {                                                  \
        lgl_levels<T>(dy, qt, lam, zs, xs, dqt, dlam, hxz, Tn, H, Dk, Dv, L, NC, E);                            \
    }                                                                                                           \
    extern "C" __global__ void lgl_grad_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,       \
                                            const T* dy, const T* lam, const T* ti, const T* W, const T* U,      \
                                            const T* dqt, const T* hxz, const T* xs, T* dq, T* dk, T* dv, T* db, \
                                            T* dg, T* dlam, int Tn, int H, int Dk, int Dv, int L, int NC,         \
                                            T scale) {                                                          \
        lgl_grad<T>(q, k, v, g, beta, dy, lam, ti, W, U, dqt, hxz, xs, dq, dk, dv, db, dg, dlam, Tn, H, Dk, Dv, L, \
                    NC, scale);                                                                                  \
    }

LGL_EXPORT(float, f32)
LGL_EXPORT(double, f64)
