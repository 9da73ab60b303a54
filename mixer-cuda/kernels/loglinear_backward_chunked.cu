// Gated DeltaNet's chunked backward through the WY/UT form (docs/math.md §2.7 "Gated DeltaNet, the
// chunked backward"), launched from src/loglinear/backward_chunked.rs after the forward's WY step
// (llc_wy: W, U and T⁻¹ per chunk). Per chunk of n ≤ CH tokens, with γ the chunk-local prefix sums
// of g, Γ_rs = e^(γ_r − γ_s), K̂ = diag(e^(γ_{n−1} − γ)) K, P = σ (QKᵀ ⊙ Γ) (lower, diagonal
// included), Z the state entering the chunk (Dk × Dv) and X the adjoint of the state after it:
// - lgb_pass_fwd: the forward state pass, chunk by chunk: U' = U − W Z (written over U) and Z
//   stored per chunk (zs [B·H, NC, Dk, Dv]); Z ← e^(γ_{n−1}) Z + K̂ᵀ U' (Z = S_0ᵀ before chunk 0
//   from an initial state S_0, else 0);
// - lgb_pre:      chunk-parallel, A = Pᵀ dY ([B,T,H,Dv]) and B = σ Qᵀ diag(e^γ) dY (into xs);
// - lgb_pass_rev: the reverse pass from the last chunk: dU' = A + K̂ X (written over A), X stored
//   over B once B is read; X ← e^(γ_{n−1}) X + B − Wᵀ dU' (X = S̄_Tᵀ after the last chunk with
//   the final state's cotangent S̄_T, else 0; the X left after chunk 0 is S̄_0ᵀ);
// - lgb_grad:     chunk-parallel, every input gradient of the chunk's tokens (below).
// The passes share one body (lgb_pass, REV = the reverse pass): the state's columns are
// independent, so a block takes LGB_NCOL of them for one batch·head. Every sum runs in a fixed
// order (no atomics): the same inputs give the same bits. FMA in T (the exact mode, f32 or f64).
// In the tf32 and bf16 modes the host runs the forward's tensor-core WY step and state pass and
// the reverse pass llc_delta_h_rg_rev_f32 (loglinear_state_pass.cu) in place of the passes here,
// lgb_pre_tc_f32 in place of lgb_pre, and with Dv > 32 lgb_state_tc_f32 + lgb_grad_tc_f32 (below)
// in place of lgb_grad.

#define LGB_NCOL 16  // state columns per block of the passes

// A pass's stage buffers for one chunk: Wb, Kb [CH][ld] (the chunk's W and k rows), Ub [CH][NCOL]
// (columns c0 .. c0 + NCOL − 1 of U), gb [CH] (log-decays).
template <typename T> struct LgbStage {
    T *W, *K, *U, *g;
};
template <typename T, int CH>
__device__ inline LgbStage<T> lgb_stage(T* base, int ld) {
    return {base, base + CH * ld, base + 2 * CH * ld, base + 2 * CH * ld + CH * LGB_NCOL};
}
// Stage size in T: 2·CH·ld + CH·NCOL + CH (lgb_pass_smem on the host agrees).
template <int CH> __device__ inline int lgb_stage_size(int ld) { return 2 * CH * ld + CH * LGB_NCOL + CH; }

// Issues the asynchronous copies of a chunk (first row row0, n rows) into b; rows from n on and
// columns from Dv on are zero-filled. 256 threads.
template <typename T, int CH>
__device__ inline void lgb_pass_load(LgbStage<T> b, const T* W, const T* k, const T* U, const T* g, long long row0,
                                     int H, int Dk, int Dv, int c0, int n, int ld) {
    for (int idx = threadIdx.x; idx < CH * Dk; idx += 256) {
        const int r = idx / Dk, d = idx % Dk;
        const bool in = r < n;
        const long long off = in ? (row0 + (long long)r * H) * Dk + d : 0;
        llc_cp_async(b.W + r * ld + d, W + off, sizeof(T), in);
        llc_cp_async(b.K + r * ld + d, k + off, sizeof(T), in);
    }
    for (int idx = threadIdx.x; idx < CH * LGB_NCOL; idx += 256) {
        const int r = idx / LGB_NCOL, c = c0 + idx % LGB_NCOL;
        const bool in = r < n && c < Dv;
        llc_cp_async(b.U + idx, U + (in ? (row0 + (long long)r * H) * Dv + c : 0), sizeof(T), in);
    }
    if (threadIdx.x < CH) {
        const bool in = (int)threadIdx.x < n;
        llc_cp_async(b.g + threadIdx.x, g + (in ? row0 + (long long)threadIdx.x * H : 0), sizeof(T), in);
    }
}

// The passes over chunks (forward: REV = false, chunks 0 → NC − 1; reverse: from NC − 1), for
// batch·head blockIdx.x and state columns c0 = LGB_NCOL·blockIdx.y onwards, 256 threads. With
// K̂ = diag(τ) K, τ_r = e^(γ_{n−1} − γ_r), per chunk: st[j] ← S (the reverse pass reads B_j
// there first), then
//   forward: N = U − W S (stored over U), S ← e^(γ_{n−1}) S + Kᵀ (diag(τ) N);
//   reverse: N = U + diag(τ) K S (stored over U), S ← e^(γ_{n−1}) S + B_j − Wᵀ N;
// (τ applied to the rows of N, so that K is copied as it is). S starts as init[bh]ᵀ where has_init
// (init [B·H, Dv, Dk], a state's layout: S_0 forward, S̄_T reverse), else 0; where has_out the S
// left after the last step is written to out[bh]ᵀ (out [B·H, Dv, Dk]). With stages = 2 the next
// chunk's W, k, U and g are copied (cp.async) while this one computes. Dynamic shared memory
// (lgb_pass_smem on the host): `stages` stage buffers (LgbStage), S [Dk][NCOL], N [CH][NCOL].
template <typename T, bool REV>
__device__ void lgb_pass(const T* k, const T* g, const T* W, T* U, T* st, const T* init, int has_init, T* out,
                         int has_out, int Tn, int H, int Dk, int Dv, int NC, int stages) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, NCOL = LGB_NCOL, MAXE = 16;  // Dk·NCOL/256 ≤ 16 state entries a thread
    constexpr int NU = CH * NCOL / 256;                            // rows of N a thread
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    __shared__ double gam[CH], gtmp[1];
    __shared__ T tau[CH];
    const int ld = Dk + 1, ss = lgb_stage_size<CH>(ld);
    T* base = reinterpret_cast<T*>(lgb_smem);
    T* S = base + stages * ss;
    T* N = S + Dk * NCOL;
    const int bh = blockIdx.x, b = bh / H, h = bh % H, c0 = blockIdx.y * NCOL, tid = threadIdx.x;
    // A thread's entries: rows r0 + 16 u of N and rows d = r0 + 16 u of S, all in column c, so that
    // each shared load feeds every one of its products; S entry e = tid + 256 u.
    const int c = tid % NCOL, r0 = (tid / NCOL) & 15, ents = Dk * NCOL;  // r0 < 16 (256 threads), known
    // S entry e is state row d = e / NCOL, column c0 + e % NCOL (e % NCOL = c for this thread's e).
    const long long sbase = (long long)bh * Dv * Dk;
    for (int e = tid; e < ents; e += 256)
        S[e] = (has_init && c0 + c < Dv) ? init[sbase + (long long)(c0 + c) * Dk + e / NCOL] : (T)0;
    auto chunk = [&](int step) { return REV ? NC - 1 - step : step; };
    auto row_of = [&](int j) { return ((long long)b * Tn + (long long)j * CH) * H + h; };
    auto rows = [&](int j) { return min(CH, Tn - j * CH); };
    lgb_pass_load<T, CH>(lgb_stage<T, CH>(base, ld), W, k, U, g, row_of(chunk(0)), H, Dk, Dv, c0, rows(chunk(0)), ld);
    lgb_commit();
    for (int step = 0; step < NC; ++step) {
        const int j = chunk(step), n = rows(j);
        const long long row0 = row_of(j);
        const LgbStage<T> bf = lgb_stage<T, CH>(base + (stages == 2 ? (step & 1) * ss : 0), ld);
        T* sj = st + ((long long)bh * NC + j) * Dk * Dv;
        T bj[MAXE];
#pragma unroll
        for (int u = 0; u < MAXE; ++u) {
            const int e = tid + 256 * u;
            bj[u] = (REV && e < ents && c0 + c < Dv) ? sj[(long long)(e / NCOL) * Dv + c0 + c] : (T)0;
        }
        if (stages == 1 && step > 0) {
            lgb_pass_load<T, CH>(bf, W, k, U, g, row0, H, Dk, Dv, c0, n, ld);
            lgb_commit();
        }
        if (stages == 2 && step + 1 < NC) {
            const int jn = chunk(step + 1);
            lgb_pass_load<T, CH>(lgb_stage<T, CH>(base + ((step + 1) & 1) * ss, ld), W, k, U, g, row_of(jn), H, Dk,
                                 Dv, c0, rows(jn), ld);
            lgb_commit();
            lgb_wait1();
        } else {
            lgb_wait0();
        }
        __syncthreads();
        const double x = llc_prefix<CH>(tid < CH ? (double)bf.g[tid] : 0.0, gtmp);
        if (tid < CH) gam[tid] = x;
        __syncthreads();
        const double a = gam[n - 1];
        if (tid < CH) tau[tid] = tid < n ? (T)mx_exp(a - gam[tid]) : (T)0;
#pragma unroll
        for (int u = 0; u < MAXE; ++u) {
            const int e = tid + 256 * u;
            if (e < ents && c0 + c < Dv) sj[(long long)(e / NCOL) * Dv + c0 + c] = S[e];
        }
        __syncthreads();
        {
            T acc[NU];
            lgb_rows_state<T, NU>(acc, REV ? bf.K : bf.W, ld, S, NCOL, Dk, r0, c);
#pragma unroll
            for (int u = 0; u < NU; ++u) {
                const int r = r0 + 16 * u;
                if (r < n) {
                    const T uv = bf.U[r * NCOL + c];
                    const T x = REV ? fma(tau[r], acc[u], uv) : uv - acc[u];
                    N[r * NCOL + c] = REV ? x : tau[r] * x;
                    if (c0 + c < Dv) U[(row0 + (long long)r * H) * Dv + c0 + c] = x;
                }
            }
        }
        __syncthreads();
        {
            const T* R = REV ? bf.W : bf.K;
            const T ea = (T)mx_exp(a);
            T acc[MAXE] = {};
            for (int r = 0; r < n; ++r) {
                const T nv = N[r * NCOL + c];
#pragma unroll
                for (int u = 0; u < MAXE; ++u)
                    if (r0 + 16 * u < Dk) acc[u] = fma(R[r * ld + r0 + 16 * u], nv, acc[u]);
            }
#pragma unroll
            for (int u = 0; u < MAXE; ++u) {
                const int e = tid + 256 * u;
                if (e < ents) S[e] = (REV ? fma((T)-1, acc[u], ea * S[e]) + bj[u] : fma(ea, S[e], acc[u]));
            }
        }
        __syncthreads();
    }
    if (has_out)
        for (int e = tid; e < ents; e += 256)
            if (c0 + c < Dv) out[sbase + (long long)(c0 + c) * Dk + e / NCOL] = S[e];
}

// A = Pᵀ dY and B = σ Qᵀ diag(e^γ) dY of chunk blockIdx.x, batch·head blockIdx.y: A over rows
// of a [B,T,H,Dv] tensor, B into bs [B·H, NC, Dk, Dv]. 256 threads. Dynamic shared memory
// (lgb_pre_smem on the host): P [CH][CH + 1], the dY and Q tiles [64][LLC_LD], the scores'
// staging Xs, Ys [LLC_KT][LLC_LD] over the Q tile.
template <typename T>
__device__ void lgb_pre(const T* q, const T* k, const T* g, const T* dy, T* A, T* bs, int Tn, int H, int Dk, int Dv,
                        int NC, T scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDN = CH + 1;
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    __shared__ double gam[CH], gtmp[1];
    __shared__ T wq[CH];  // σ e^(γ_r), once per row
    T* P = reinterpret_cast<T*>(lgb_smem);
    T* Dt = P + CH * LDN;
    T* Qt = Dt + LLC_NT * LLC_LD;
    T *Xs = Qt, *Ys = Qt + LLC_KT * LLC_LD;
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, n = ck.n;
    llc_gamma<T, CH>(gam, gtmp, g, 1, ck.row0, H, n);
    if (threadIdx.x < CH) wq[threadIdx.x] = scale * (T)mx_exp(gam[threadIdx.x]);
    {
        LgbAcc<T, RI, RI> qk;
        for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
            lgb_slice<T, CH>(Xs, q, ck.row0, H, Dk, c0, n);
            lgb_slice<T, CH>(Ys, k, ck.row0, H, Dk, c0, n);
            __syncthreads();
            qk.add(Xs, LLC_LD, 1, Ys, LLC_LD, LLC_KT);
            __syncthreads();
        }
        T acc[RI][RI];
        qk.get(acc);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
            P[r * LDN + s] = (s <= r && r < n) ? scale * acc[a][bb] * (T)mx_exp(gam[r] - gam[s]) : (T)0;
        }
    }
    T* bj = bs + ((long long)ck.bh * NC + ck.i) * Dk * Dv;
    for (int c0 = 0; c0 < Dv; c0 += LLC_NT) {
        __syncthreads();
        lgb_tile<T, CH>(Dt, dy, ck.row0, H, Dv, c0, n, [](int) { return (T)1; });
        __syncthreads();
        {
            LgbAcc<T, RI, 4> aa;
            aa.add(P, LDN, 1, Dt, LLC_LD, n);
            T acc[RI][4];
            aa.get(acc);
            llc_store<T, RI>(acc, A, ck.row0, H, Dv, n, c0, ty, tx);
        }
        for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
            __syncthreads();
            lgb_tile<T, CH>(Qt, q, ck.row0, H, Dk, d0, n, [&](int r) { return wq[r]; });
            __syncthreads();
            LgbAcc<T, 4, 4> ba;
            ba.add(Qt, LLC_LD, 1, Dt, LLC_LD, n);
            T bq[4][4];
            ba.get(bq);
            LLC_TILE_EACH(4, 4, a, bb, d, c, d0, c0) {
                if (d < Dk && c < Dv) bj[(long long)d * Dv + c] = bq[a][bb];
            }
        }
    }
}

// Dynamic shared memory of lgb_grad, in T entries (the host's lgb_grad_smem agrees): Ti, Mp,
// F + Fᵀ, PG [CH][CH + 1]; W1 [64][LLC_LD]; five slices [LLC_KT][LLC_LD]; W2 [64][LLC_LD] over Ti and PG
// where they are large enough (f32), else after the slices.
template <typename T> struct LgbGrad {
    static constexpr int CH = Llc<T>::CH, LDN = CH + 1, NN = CH * LDN, WT = LLC_NT * LLC_LD,
                         SL = LLC_KT * LLC_LD;
    static constexpr int TI = 0, PG = NN, MP = 2 * NN, F = 3 * NN, W1 = 4 * NN, SLICES = W1 + WT,
                         END = SLICES + 5 * SL;
    static constexpr bool W2_OVER = 2 * NN >= WT;
    static constexpr int W2 = W2_OVER ? 0 : END, TOTAL = W2_OVER ? END : END + WT;
};

// The decay terms of γ̄ for rows r < ch of a chunk, by thread r: Σ_s PG_rs − Σ_s PG_sr, in f64 and
// in a fixed order (PG in shared memory, rows of ld entries).
template <typename T> __device__ inline void lgb_decay_sums(const T* PG, int ld, int ch, double* dgs) {
    const int r = threadIdx.x;
    if (r < ch) {
        double x = 0.0;
        for (int s = 0; s < ch; ++s) x += (double)PG[r * ld + s];
        for (int s = 0; s < ch; ++s) x -= (double)PG[s * ld + r];
        dgs[r] = x;
    }
}

// A chunk row's sums that dg and dβ read (lgb_dg_db).
template <typename T> struct LgbRowSums {
    T rq, rk2, rkez, rve, rdb;
};

// Step 5's end, by one thread: γ̄_r = dgs_r + rq_r − rk2_r − β_r e^(γ_r) rkez_r, plus at the last
// row e^(γ_{n−1}) ⟨X, Z⟩ (xz) + Σ_r rk2_r; dg = the reverse cumulative sum of γ̄ inside the chunk
// (f64) and dβ_r = rdb_r + rve_r − e^(γ_r) rkez_r, at the chunk's rows. sums(r): row r's LgbRowSums.
template <typename T, typename Sums>
__device__ inline void lgb_dg_db(Sums sums, const double* dgs, const double* gam, const T* bet, const T* eg,
                                 double xz, int n, long long row0, int H, T* dg, T* db) {
    double last = mx_exp(gam[n - 1]) * xz;
    for (int r = 0; r < n; ++r) last += (double)sums(r).rk2;
    double acc = 0.0;
    for (int r = n - 1; r >= 0; --r) {
        const LgbRowSums<T> x = sums(r);
        acc += dgs[r] + (double)x.rq - (double)x.rk2 - (double)(bet[r] * eg[r] * x.rkez) + (r == n - 1 ? last : 0.0);
        const long long row = row0 + (long long)r * H;
        dg[row] = (T)acc;
        db[row] = x.rdb + x.rve - eg[r] * x.rkez;
    }
}

// Every input gradient of chunk blockIdx.x, batch·head blockIdx.y (docs/math.md §2.7), from the
// chunk's T⁻¹ (ti [B·H, NC, CH, CH], row-major), its entering state Z (zs), the adjoint X of the
// state after it (xs), its new values U' (un) and their adjoint dU' (e, overwritten with
// E = T⁻ᵀ dU'). 256 threads as a 16 × 16 grid; rows of the chunk r = ty + 16 a, columns tx + 16 b.
// 1. values: per 64 value columns, E = T⁻ᵀ dU', dv = diag(β) E, Σ v·E per row; the n × n products
//    dY U'ᵀ and E U'ᵀ (dT = −E U'ᵀ below the diagonal) accumulate in registers;
// 2. QKᵀ and KKᵀ in registers;
// 3. Mp = σ (dY U'ᵀ) ⊙ Γ (lower with the diagonal), F = dT ⊙ diag(β) Γ (strict; F + Fᵀ kept), the β-gradient of
//    T (Σ_s dT_rs Γ_rs (KKᵀ)_rs) and the decay terms pg_rs = Mp_rs (QKᵀ)_rs + F_rs (KKᵀ)_rs, which
//    add to γ̄_r and subtract from γ̄_s;
// 4. per 64 key columns: dq = σ diag(e^γ) dY Zᵀ + Mp K, dk = Mpᵀ Q + (F + Fᵀ) K +
//    diag(e^(γ_{n−1} − γ)) U' Xᵀ − diag(β e^γ) E Zᵀ (three products over the values, three over
//    the chunk), with their row dots for γ̄ and β̄;
// 5. γ̄_{n−1} += e^(γ_{n−1}) ⟨X, Z⟩ + Σ_r k_r·(K̂-term)_r, dg = the reverse cumulative sum of γ̄
//    inside the chunk, dβ.
template <typename T>
__device__ void lgb_grad(const T* q, const T* k, const T* v, const T* g, const T* beta, const T* dy, const T* ti,
                         const T* zs, const T* xs, const T* un, T* e, T* dq, T* dk, T* dv, T* db, T* dg, int Tn, int H,
                         int Dk, int Dv, int NC, T scale) {
    LLC_FIX_DIMS(Dk, Dv);
    using L = LgbGrad<T>;
    constexpr int CH = L::CH, RI = CH / 16, LDN = L::LDN;
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    T* sm = reinterpret_cast<T*>(lgb_smem);
    T *Ti = sm + L::TI, *PG = sm + L::PG, *Mp = sm + L::MP, *F = sm + L::F, *W1 = sm + L::W1, *W2 = sm + L::W2;
    T* sl[5];
#pragma unroll
    for (int i = 0; i < 5; ++i) sl[i] = sm + L::SLICES + i * L::SL;
    __shared__ double gam[CH], gtmp[1], dgs[CH], red[8];
    __shared__ T bet[CH], rq[CH], rk2[CH], rkez[CH], rve[CH], rdb[CH], eg[CH], tl[CH];
    const LlcChunk ck = llc_chunk<CH>(Tn, H);
    const int ty = ck.ty, tx = ck.tx, tid = ck.tid, n = ck.n;
    const long long row0 = ck.row0;
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : (T)0;
    llc_gamma<T, CH>(gam, gtmp, g, 1, row0, H, n);
    // Per row: e^(γ_r) and e^(γ_{n−1} − γ_r) (read by steps 4 and 5 after a barrier).
    if (tid < CH) eg[tid] = (T)mx_exp(gam[tid]), tl[tid] = (T)mx_exp(gam[n - 1] - gam[tid]);
    const T* tij = ti + ((long long)ck.bh * NC + ck.i) * CH * CH;
    for (int idx = tid; idx < CH * CH; idx += 256) Ti[(idx / CH) * LDN + idx % CH] = tij[idx];
    const long long sidx = ((long long)ck.bh * NC + ck.i) * Dk * Dv;
    const T *zj = zs + sidx, *xj = xs + sidx;
    // e^(γ_{n−1}) ⟨X, Z⟩, reduced in a fixed order.
    {
        double x = 0.0;
        for (long long i = tid; i < (long long)Dk * Dv; i += 256) x += (double)xj[i] * (double)zj[i];
        for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        if ((tid & 31) == 0) red[tid >> 5] = x;
    }
    // 1. The values side.
    LgbAcc<T, RI, RI> dyua, eta;
    T ve[RI] = {};
    for (int c0 = 0; c0 < Dv; c0 += LLC_NT) {
        __syncthreads();
        lgb_tile<T, CH>(W1, e, row0, H, Dv, c0, n, [](int) { return (T)1; });
        __syncthreads();
        T acc[RI][4];
        {
            LgbAcc<T, RI, 4> ea;
            ea.add(Ti, LDN, 1, W1, LLC_LD, n);
            ea.get(acc);
        }
        LLC_TILE_EACH(RI, 4, a, bb, r, c, 0, c0) {
            if (r < n && c < Dv) {
                const long long off = (row0 + (long long)r * H) * Dv + c;
                e[off] = acc[a][bb];
                dv[off] = bet[r] * acc[a][bb];
                ve[a] = fma(v[off], acc[a][bb], ve[a]);
            }
        }
        __syncthreads();
        LLC_TILE_EACH(RI, 4, a, bb, r, c, 0, 0) { W1[c * LLC_LD + r] = acc[a][bb]; }  // Eᵀ
        for (int c1 = 0; c1 < LLC_NT; c1 += LLC_KT) {
            lgb_slice<T, CH>(sl[0], un, row0, H, Dv, c0 + c1, n);
            lgb_slice<T, CH>(sl[1], dy, row0, H, Dv, c0 + c1, n);
            __syncthreads();
            dyua.add(sl[1], LLC_LD, 1, sl[0], LLC_LD, LLC_KT);
            eta.add(W1 + c1 * LLC_LD, LLC_LD, 1, sl[0], LLC_LD, LLC_KT);
            __syncthreads();
        }
    }
    // 2. QKᵀ and KKᵀ.
    LgbAcc<T, RI, RI> qka, kka;
    for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
        lgb_slice<T, CH>(sl[0], q, row0, H, Dk, c0, n);
        lgb_slice<T, CH>(sl[1], k, row0, H, Dk, c0, n);
        __syncthreads();
        qka.add(sl[0], LLC_LD, 1, sl[1], LLC_LD, LLC_KT);
        kka.add(sl[1], LLC_LD, 1, sl[1], LLC_LD, LLC_KT);
        __syncthreads();
    }
    T dyu[RI][RI], et[RI][RI], qk[RI][RI], kk[RI][RI];
    dyua.get(dyu);
    eta.get(et);
    qka.get(qk);
    kka.get(kk);
    // 3. Mp, F, the β-gradient of T and the decay terms.
    T dbr[RI] = {};
    LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
        const bool low = r < n && s <= r, strict = low && s < r;
        const T gm = low ? (T)mx_exp(gam[r] - gam[s]) : (T)0;
        const T mp = scale * dyu[a][bb] * gm;
        const T dt = strict ? -et[a][bb] : (T)0;
        const T f = dt * bet[r] * gm;
        Mp[r * LDN + s] = mp;
        if (s < r) F[r * LDN + s] = F[s * LDN + r] = f;  // F + Fᵀ (F strictly lower)
        if (s == r) F[r * LDN + r] = (T)0;
        dbr[a] = fma(dt * gm, kk[a][bb], dbr[a]);
        PG[r * LDN + s] = strict ? fma(mp, qk[a][bb], f * kk[a][bb]) : (T)0;
    }
    __syncthreads();
    lgb_decay_sums(PG, LDN, CH, dgs);
    // 4. The keys side.
    T r1[RI] = {}, r2[RI] = {}, r3[RI] = {};
    for (int d0 = 0; d0 < Dk; d0 += LLC_NT) {
        __syncthreads();
        lgb_tile<T, CH>(W1, q, row0, H, Dk, d0, n, [](int) { return (T)1; });
        lgb_tile<T, CH>(W2, k, row0, H, Dk, d0, n, [](int) { return (T)1; });
        __syncthreads();
        LgbAcc<T, RI, 4> a1a, a2a, a3a, aqa, aka;
        for (int c0 = 0; c0 < Dv; c0 += LLC_KT) {
            lgb_slice<T, CH>(sl[0], dy, row0, H, Dv, c0, n);
            lgb_slice<T, CH>(sl[1], un, row0, H, Dv, c0, n);
            lgb_slice<T, CH>(sl[2], e, row0, H, Dv, c0, n);
            for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                const int d = idx / LLC_KT, c = idx % LLC_KT;
                const bool in = d0 + d < Dk && c0 + c < Dv;
                const long long off = (long long)(d0 + d) * Dv + c0 + c;
                sl[3][c * LLC_LD + d] = in ? zj[off] : (T)0;
                sl[4][c * LLC_LD + d] = in ? xj[off] : (T)0;
            }
            __syncthreads();
            a1a.add(sl[0], LLC_LD, 1, sl[3], LLC_LD, LLC_KT);
            a2a.add(sl[1], LLC_LD, 1, sl[4], LLC_LD, LLC_KT);
            a3a.add(sl[2], LLC_LD, 1, sl[3], LLC_LD, LLC_KT);
            __syncthreads();
        }
        aqa.add(Mp, 1, LDN, W2, LLC_LD, n);
        aka.add(Mp, LDN, 1, W1, LLC_LD, n);
        aka.add(F, 1, LDN, W2, LLC_LD, n);
        T a1[RI][4], a2[RI][4], a3[RI][4], aq[RI][4], ak[RI][4];
        a1a.get(a1);
        a2a.get(a2);
        a3a.get(a3);
        aqa.get(aq);
        aka.get(ak);
        LLC_TILE_EACH(RI, 4, a, bb, r, c, 0, 0) {
            if (r < n) {
                const T q1 = scale * eg[r] * a1[a][bb], k2 = tl[r] * a2[a][bb];
                const T qv = W1[r * LLC_LD + c], kv = W2[r * LLC_LD + c];
                r1[a] = fma(qv, q1, r1[a]);
                r2[a] = fma(kv, k2, r2[a]);
                r3[a] = fma(kv, a3[a][bb], r3[a]);
                if (d0 + c < Dk) {
                    const long long off = (row0 + (long long)r * H) * Dk + d0 + c;
                    dq[off] = q1 + aq[a][bb];
                    dk[off] = ak[a][bb] + k2 - bet[r] * eg[r] * a3[a][bb];
                }
            }
        }
    }
    // 5. Per row, then the decay gradient's reverse sum inside the chunk.
#pragma unroll
    for (int a = 0; a < RI; ++a) {
        const T x1 = lgb_row_sum(r1[a]), x2 = lgb_row_sum(r2[a]), x3 = lgb_row_sum(r3[a]);
        const T x4 = lgb_row_sum(ve[a]), x5 = lgb_row_sum(dbr[a]);
        if (tx == 0) {
            const int r = ty + 16 * a;
            rq[r] = x1, rk2[r] = x2, rkez[r] = x3, rve[r] = x4, rdb[r] = x5;
        }
    }
    __syncthreads();
    if (tid == 0) {
        double xz = 0.0;
        for (int w = 0; w < 8; ++w) xz += red[w];
        lgb_dg_db(
            [&](int r) { return LgbRowSums<T>{rq[r], rk2[r], rkez[r], rve[r], rdb[r]}; }, dgs, gam, bet, eg, xz, n,
            row0, H, dg, db);
    }
}

#define LGB_EXPORT(T, S)                                                                                        \
    extern "C" __global__ void lgb_pass_fwd_##S(const T* k, const T* g, const T* W, T* U, T* st, const T* init,    \
                                                int has_init, T* out, int has_out, int Tn, int H, int Dk,     \
                                                int Dv, int NC, int stages) {                                  \
        lgb_pass<T, false>(k, g, W, U, st, init, has_init, out, has_out, Tn, H, Dk, Dv, NC, stages);            \
    }                                                                                                         \
    extern "C" __global__ void lgb_pass_rev_##S(const T* k, const T* g, const T* W, T* U, T* st, const T* init,    \
                                                int has_init, T* out, int has_out, int Tn, int H, int Dk,     \
                                                int Dv, int NC, int stages) {                                  \
        lgb_pass<T, true>(k, g, W, U, st, init, has_init, out, has_out, Tn, H, Dk, Dv, NC, stages);             \
    }                                                                                                         \
    extern "C" __global__ void lgb_pre_##S(const T* q, const T* k, const T* g, const T* dy, T* A, T* bs, int Tn,   \
                                           int H, int Dk, int Dv, int NC, T scale) {                           \
        lgb_pre<T>(q, k, g, dy, A, bs, Tn, H, Dk, Dv, NC, scale);                                        \
    }                                                                                                         \
    extern "C" __global__ void lgb_grad_##S(const T* q, const T* k, const T* v, const T* g, const T* beta,         \
                                            const T* dy, const T* ti, const T* zs, const T* xs, const T* un, T* e, \
                                            T* dq, T* dk, T* dv, T* db, T* dg, int Tn, int H, int Dk, int Dv,       \
                                            int NC, T scale) {                                                  \
        lgb_grad<T>(q, k, v, g, beta, dy, ti, zs, xs, un, e, dq, dk, dv, db, dg, Tn, H, Dk, Dv, NC, scale); \
    }

LGB_EXPORT(float, f32)
LGB_EXPORT(double, f64)

// The products of lgb_grad that read a state, on tensor cores (the tf32 and bf16 modes with f32
// data): for chunk blockIdx.x, batch·head blockIdx.y and key columns c0 = 64·blockIdx.z … c0 + 63,
// A1 = dY Zᵀ, A2 = U' Xᵀ and A3 = dU' Zᵀ (rows of [B,T,H,Dk] tensors, the chunk's tokens), each
// summed over 64-column tiles of the values: the chunk's dY, U' and dU' rows (llc_stage_tile) and
// rows c0 … c0 + 63 of Z and X ([Dk][Dv] per chunk) staged rounded to tf32, then m16n8k8 tf32 mma
// with f32 accumulation (llc_mma_rows; warp w owns rows 16 (w mod 4) … + 15 and columns
// 32 ⌊w / 4⌋ … + 31); and ⟨X, Z⟩ over those rows into xzp [B·H, NC, ⌈Dk/64⌉] (double, from the
// unrounded states). lgb_grad_tc_f32 reads them. Grid (NC, BH, ⌈Dk/64⌉), 256 threads, dynamic
// shared memory five [64][LGS_LD] float tiles (lgb_state_smem on the host).
#define LGS_LD 68
extern "C" __global__ void __launch_bounds__(256)
    lgb_state_tc_f32(const float* dy, const float* un, const float* du, const float* zs, const float* xs, float* A1,
                     float* A2, float* A3, double* xzp, int Tn, int H, int Dk, int Dv, int NC) {
    LLC_FIX_DIMS(Dk, Dv);
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    float* R1 = reinterpret_cast<float*>(lgb_smem);
    float *R2 = R1 + 64 * LGS_LD, *R3 = R2 + 64 * LGS_LD, *S1 = R3 + 64 * LGS_LD, *S2 = S1 + 64 * LGS_LD;
    const LlcChunk ck = llc_chunk<64>(Tn, H);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32, c0 = blockIdx.z * 64;
    const long long sidx = ((long long)ck.bh * NC + ck.i) * Dk * Dv;
    const float *zj = zs + sidx, *xj = xs + sidx;
    const bool vec = Dv % 4 == 0 && llc_al16(dy) && llc_al16(un) && llc_al16(du);
    float a1[4][4] = {}, a2[4][4] = {}, a3[4][4] = {};
    double xz = 0.0;  // this thread's part of Σ X ⊙ Z over the block's rows
    for (int d0 = 0; d0 < Dv; d0 += 64) {
        llc_stage_tile<LGS_LD>(R1, dy, ck.row0, H, Dv, d0, ck.n, vec, true, [](int) { return 1.f; });
        llc_stage_tile<LGS_LD>(R2, un, ck.row0, H, Dv, d0, ck.n, vec, true, [](int) { return 1.f; });
        llc_stage_tile<LGS_LD>(R3, du, ck.row0, H, Dv, d0, ck.n, vec, true, [](int) { return 1.f; });
        for (int idx = tid; idx < 64 * 64; idx += 256) {
            const int r = idx >> 6, c = idx & 63;
            const bool in = c0 + r < Dk && d0 + c < Dv;
            const long long off = (long long)(c0 + r) * Dv + d0 + c;
            const float z = in ? zj[off] : 0.f, x = in ? xj[off] : 0.f;
            xz += (double)x * (double)z;
            S1[r * LGS_LD + c] = __uint_as_float(mx_tf32(z));
            S2[r * LGS_LD + c] = __uint_as_float(mx_tf32(x));
        }
        __syncthreads();
        const int kend = min(64, (Dv - d0 + 7) & ~7);
        llc_mma_rows<LGS_LD>(a1, R1, S1, kend, true, mr, nb, gi, tg);
        llc_mma_rows<LGS_LD>(a2, R2, S2, kend, true, mr, nb, gi, tg);
        llc_mma_rows<LGS_LD>(a3, R3, S1, kend, true, mr, nb, gi, tg);
        __syncthreads();
    }
    LLC_MMA_EACH(nt, u, r, c, 0, c0) {
        if (r < ck.n && c < Dk) {
            const long long off = (ck.row0 + (long long)r * H) * Dk + c;
            A1[off] = a1[nt][u];
            A2[off] = a2[nt][u];
            A3[off] = a3[nt][u];
        }
    }
    // ⟨X, Z⟩ over the block's 64 keys, reduced in a fixed order, for lgb_grad_tc.
    __shared__ double red[8];
    for (int o = 16; o > 0; o >>= 1) xz += __shfl_xor_sync(0xffffffffu, xz, o);
    if (lane == 0) red[warp] = xz;
    __syncthreads();
    if (tid == 0) {
        double x = 0.0;
        for (int w = 0; w < 8; ++w) x += red[w];
        xzp[((long long)ck.bh * NC + ck.i) * gridDim.z + blockIdx.z] = x;
    }
}
// lgb_pre on tensor cores (the tf32 and bf16 modes, f32 data): for chunk blockIdx.x and
// batch·head blockIdx.y, P = σ (QKᵀ ⊙ Γ) (lower, diagonal included; QKᵀ over 64-column key tiles),
// stored transposed and rounded to tf32, then per 64-column tile of the values A = Pᵀ dY (rows of
// a [B,T,H,Dv] tensor) and, per 64-column key tile, B = (σ diag(e^γ) Q)ᵀ dY into bs
// [B·H, NC, Dk, Dv] — every product m16n8k8 tf32 mma with f32 accumulation (llc_mma_rows, eight
// warps of 16 × 32 outputs). Grid (NC, BH), 256 threads, dynamic shared memory three [64][LGS_LD]
// float tiles (Q or σ e^γ Qᵀ, K or dY, Pᵀ).
extern "C" __global__ void __launch_bounds__(256)
    lgb_pre_tc_f32(const float* q, const float* k, const float* g, const float* dy, float* A, float* bs, int Tn,
                   int H, int Dk, int Dv, int NC, float scale) {
    LLC_FIX_DIMS(Dk, Dv);
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    float* X1 = reinterpret_cast<float*>(lgb_smem);
    float *X2 = X1 + 64 * LGS_LD, *Pt = X2 + 64 * LGS_LD;
    __shared__ double gam[64], gtmp[64];
    __shared__ float wq[64];
    const LlcChunk ck = llc_chunk<64>(Tn, H);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32, n = ck.n;
    const long long row0 = ck.row0;
    llc_gamma<float, 64>(gam, gtmp, g, 1, row0, H, n);
    if (tid < 64) wq[tid] = tid < n ? scale * (float)mx_exp(gam[tid]) : 0.f;
    const bool vq = Dk % 4 == 0 && llc_al16(q) && llc_al16(k), vd = Dv % 4 == 0 && llc_al16(dy);
    const int ks = (n + 7) & ~7;  // the chunk's rows, in steps of 8 (rows from n on are zero)
    {
        float acc[4][4] = {};
        for (int c0 = 0; c0 < Dk; c0 += 64) {
            llc_stage_tile<LGS_LD>(X1, q, row0, H, Dk, c0, n, vq, true, [](int) { return 1.f; });
            llc_stage_tile<LGS_LD>(X2, k, row0, H, Dk, c0, n, vq, true, [](int) { return 1.f; });
            __syncthreads();
            llc_mma_rows<LGS_LD>(acc, X1, X2, min(64, (Dk - c0 + 7) & ~7), true, mr, nb, gi, tg);
            __syncthreads();
        }
        LLC_MMA_EACH(nt, u, r, c, 0, 0) {
            const float p = (c <= r && r < n) ? scale * acc[nt][u] * (float)mx_exp(gam[r] - gam[c]) : 0.f;
            Pt[c * LGS_LD + r] = __uint_as_float(mx_tf32(p));
        }
    }
    for (int d0 = 0; d0 < Dv; d0 += 64) {
        llc_stage_tile<LGS_LD>(X2, dy, row0, H, Dv, d0, n, vd, true, [](int) { return 1.f; });
        __syncthreads();
        {
            float a[4][4] = {};
            llc_mma_rows<LGS_LD>(a, Pt, X2, ks, false, mr, nb, gi, tg);
            LLC_MMA_EACH(nt, u, r, c, 0, d0) {
                if (r < n && c < Dv) A[(row0 + (long long)r * H) * Dv + c] = a[nt][u];
            }
        }
        float* bj = bs + ((long long)ck.bh * NC + ck.i) * Dk * Dv;
        for (int c0 = 0; c0 < Dk; c0 += 64) {
            // (σ e^γ Q)ᵀ: row c of the tile is key c0 + c, column s the token.
            for (int idx = tid; idx < 64 * 64; idx += 256) {
                const int s = idx >> 6, c = idx & 63;
                const bool in = s < n && c0 + c < Dk;
                X1[c * LGS_LD + s] = in ? __uint_as_float(mx_tf32(wq[s] * q[(row0 + (long long)s * H) * Dk + c0 + c])) : 0.f;
            }
            __syncthreads();
            float b[4][4] = {};
            llc_mma_rows<LGS_LD>(b, X1, X2, ks, false, mr, nb, gi, tg);
            LLC_MMA_EACH(nt, u, c, d, c0, d0) {
                if (c < Dk && d < Dv) bj[(long long)c * Dv + d] = b[nt][u];
            }
            __syncthreads();
        }
    }
}
// Every input gradient of lgb_grad on tensor cores (the tf32 and bf16 modes, f32 data, Dv > 32),
// after lgb_state_tc (A1 = dY Zᵀ, A2 = U' Xᵀ, A3 = dU' Zᵀ and the partial sums xzp of ⟨X, Z⟩): for
// chunk blockIdx.x and batch·head blockIdx.y, lgb_grad's steps with its products on tensor cores:
// 1. per 64-column tile of the values, E = T⁻ᵀ dU' (dU' from du, read only), dv = diag(β) E and
//    Σ v·E per row, and the 64 × 64 products dY U'ᵀ and E U'ᵀ;
// 2. QKᵀ and KKᵀ over 64-column key tiles;
// 3. Mp = σ (dY U'ᵀ) ⊙ Γ (lower with the diagonal) and F + Fᵀ with F = −(E U'ᵀ) ⊙ diag(β) Γ
//    (strictly lower) into shared tiles (Mp, Mpᵀ, F + Fᵀ), the β-gradient of T per row, and the
//    decay terms PG (staged in X4), reduced into dgs;
// 4. per 64 key columns: Mp K, Mpᵀ Q + (F + Fᵀ) K and E Zᵀ = T⁻ᵀ A3 on tensor cores, then dq =
//    σ diag(e^γ) A1 + Mp K and dk = Mpᵀ Q + (F + Fᵀ) K + diag(e^(γ_{n−1} − γ)) A2 −
//    diag(β e^γ) E Zᵀ element-wise, with the row dots the decay gradient needs;
// 5. the row sums (each over the four lanes of a quad, then the two warps that share the rows),
//    γ̄_{n−1} += e^(γ_{n−1}) ⟨X, Z⟩ + Σ_r k_r·(K̂-term)_r, dg = the reverse cumulative sum of γ̄
//    inside the chunk, dβ.
// Every product m16n8k8 tf32 mma with f32 accumulation on operands staged rounded to tf32
// (llc_mma_rows, eight warps of 16 × 32 outputs). Every sum in a fixed order. Grid (NC, BH), 256
// threads, dynamic shared memory five [64][LGS_LD] float tiles; two blocks a multiprocessor (at most
// 128 registers: at Dk = 64, Dv = 96 it took 164 without the bound).
extern "C" __global__ void __launch_bounds__(256, 2)
    lgb_grad_tc_f32(const float* q, const float* k, const float* v, const float* g, const float* beta,
                    const float* dy, const float* un, const float* ti, const float* du, const float* A1,
                    const float* A2, const float* A3, const double* xzp, float* dq, float* dk, float* dv, float* db,
                    float* dg, int Tn, int H, int Dk, int Dv, int NC, float scale) {
    LLC_FIX_DIMS(Dk, Dv);
    extern __shared__ __align__(16) unsigned char lgb_smem[];
    float* Tt = reinterpret_cast<float*>(lgb_smem);  // T⁻ᵀ
    float *X1 = Tt + 64 * LGS_LD, *X2 = X1 + 64 * LGS_LD, *X3 = X2 + 64 * LGS_LD, *X4 = X3 + 64 * LGS_LD;
    __shared__ double gam[64], gtmp[64], dgs[64];
    __shared__ float bet[64], eg[64], tl[64];
    // Row sums of the two warps that share a row (wh = nb / 32): Σ v·E, the β-gradient of T,
    // Σ q·(σ e^γ A1), Σ k·(e^(γ_{n−1} − γ) A2), Σ k·(E Zᵀ).
    __shared__ float part[5][2][64];
    const LlcChunk ck = llc_chunk<64>(Tn, H);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32, wh = warp >> 2, n = ck.n;
    const long long row0 = ck.row0;
    if (tid < 64) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : 0.f;
    llc_gamma<float, 64>(gam, gtmp, g, 1, row0, H, n);
    // Per row, after llc_gamma's barrier (read after the next one): e^(γ_r), e^(γ_{n−1} − γ_r).
    if (tid < 64) eg[tid] = (float)mx_exp(gam[tid]), tl[tid] = (float)mx_exp(gam[n - 1] - gam[tid]);
    const float* tij = ti + ((long long)ck.bh * NC + ck.i) * 64 * 64;
    for (int idx = tid; idx < 64 * 64; idx += 256) Tt[(idx & 63) * LGS_LD + (idx >> 6)] = __uint_as_float(mx_tf32(tij[idx]));
    const bool vv = Dv % 4 == 0 && llc_al16(dy) && llc_al16(un) && llc_al16(du);
    const bool vk = Dk % 4 == 0 && llc_al16(q) && llc_al16(k) && llc_al16(A3);
    const int ks = (n + 7) & ~7;
    float rs[5][2] = {};  // this thread's parts of the row sums of part, rows mr + gi and mr + gi + 8
    // 1.
    float dyu[4][4] = {}, et[4][4] = {};
    for (int d0 = 0; d0 < Dv; d0 += 64) {
        llc_stage_tile<LGS_LD>(X1, du, row0, H, Dv, d0, n, vv, true, [](int) { return 1.f; });
        llc_stage_tile<LGS_LD>(X3, un, row0, H, Dv, d0, n, vv, true, [](int) { return 1.f; });
        llc_stage_tile<LGS_LD>(X4, dy, row0, H, Dv, d0, n, vv, true, [](int) { return 1.f; });
        __syncthreads();
        float ea[4][4] = {};
        llc_mma_rows<LGS_LD>(ea, Tt, X1, ks, false, mr, nb, gi, tg);
        LLC_MMA_EACH(nt, u, r, c, 0, 0) {
            if (r < n && d0 + c < Dv) {
                const long long off = (row0 + (long long)r * H) * Dv + d0 + c;
                dv[off] = bet[r] * ea[nt][u];
                rs[0][u >> 1] = fma(v[off], ea[nt][u], rs[0][u >> 1]);
            }
            X2[r * LGS_LD + c] = __uint_as_float(mx_tf32(ea[nt][u]));
        }
        __syncthreads();
        const int kv = min(64, (Dv - d0 + 7) & ~7);
        llc_mma_rows<LGS_LD>(dyu, X4, X3, kv, true, mr, nb, gi, tg);
        llc_mma_rows<LGS_LD>(et, X2, X3, kv, true, mr, nb, gi, tg);
        __syncthreads();
    }
    // 2.
    float qk[4][4] = {}, kk[4][4] = {};
    for (int c0 = 0; c0 < Dk; c0 += 64) {
        llc_stage_tile<LGS_LD>(X1, q, row0, H, Dk, c0, n, vk, true, [](int) { return 1.f; });
        llc_stage_tile<LGS_LD>(X2, k, row0, H, Dk, c0, n, vk, true, [](int) { return 1.f; });
        __syncthreads();
        const int kq = min(64, (Dk - c0 + 7) & ~7);
        llc_mma_rows<LGS_LD>(qk, X1, X2, kq, true, mr, nb, gi, tg);
        llc_mma_rows<LGS_LD>(kk, X2, X2, kq, true, mr, nb, gi, tg);
        __syncthreads();
    }
    // 3. (X1 = Mp, X2 = Mpᵀ, X3 = F + Fᵀ, X4 = PG; each entry below the diagonal also writes its
    // mirror.)
    LLC_MMA_EACH(nt, u, r, c, 0, 0) {
        const bool low = r < n && c <= r, strict = low && c < r;
        const float gm = low ? (float)mx_exp(gam[r] - gam[c]) : 0.f;
        const float mp = scale * dyu[nt][u] * gm, dt = strict ? -et[nt][u] : 0.f, f = dt * bet[r] * gm;
        X1[r * LGS_LD + c] = X2[c * LGS_LD + r] = __uint_as_float(mx_tf32(mp));
        if (c < r) X3[r * LGS_LD + c] = X3[c * LGS_LD + r] = __uint_as_float(mx_tf32(f));
        if (c == r) X3[r * LGS_LD + r] = 0.f;
        rs[1][u >> 1] = fma(dt * gm, kk[nt][u], rs[1][u >> 1]);
        X4[r * LGS_LD + c] = strict ? fma(mp, qk[nt][u], f * kk[nt][u]) : 0.f;
    }
    __syncthreads();
    // The decay terms add to γ̄_r and subtract from γ̄_s.
    lgb_decay_sums(X4, LGS_LD, 64, dgs);
    __syncthreads();
    // 4. X4 holds k's tile, then q's, then A3's.
    for (int c0 = 0; c0 < Dk; c0 += 64) {
        float aq[4][4] = {}, ak[4][4] = {}, a3[4][4] = {};
        llc_stage_tile<LGS_LD>(X4, k, row0, H, Dk, c0, n, vk, true, [](int) { return 1.f; });
        __syncthreads();
        llc_mma_rows<LGS_LD>(aq, X1, X4, ks, false, mr, nb, gi, tg);
        llc_mma_rows<LGS_LD>(ak, X3, X4, ks, false, mr, nb, gi, tg);
        __syncthreads();
        llc_stage_tile<LGS_LD>(X4, q, row0, H, Dk, c0, n, vk, true, [](int) { return 1.f; });
        __syncthreads();
        llc_mma_rows<LGS_LD>(ak, X2, X4, ks, false, mr, nb, gi, tg);
        __syncthreads();
        llc_stage_tile<LGS_LD>(X4, A3, row0, H, Dk, c0, n, vk, true, [](int) { return 1.f; });
        __syncthreads();
        llc_mma_rows<LGS_LD>(a3, Tt, X4, ks, false, mr, nb, gi, tg);
        LLC_MMA_EACH(nt, u, r, c, 0, c0) {
            if (r < n && c < Dk) {
                const long long off = (row0 + (long long)r * H) * Dk + c;
                const float q1 = scale * eg[r] * A1[off], k2 = tl[r] * A2[off], kv = k[off];
                rs[2][u >> 1] = fma(q[off], q1, rs[2][u >> 1]);
                rs[3][u >> 1] = fma(kv, k2, rs[3][u >> 1]);
                rs[4][u >> 1] = fma(kv, a3[nt][u], rs[4][u >> 1]);
                dq[off] = q1 + aq[nt][u];
                dk[off] = ak[nt][u] + k2 - bet[r] * eg[r] * a3[nt][u];
            }
        }
        __syncthreads();
    }
    // 5.
#pragma unroll
    for (int i = 0; i < 5; ++i)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            float x = rs[i][h2];
            x += __shfl_xor_sync(0xffffffffu, x, 1);
            x += __shfl_xor_sync(0xffffffffu, x, 2);
            if (tg == 0) part[i][wh][mr + gi + 8 * h2] = x;
        }
    __syncthreads();
    if (tid == 0) {
        const int nkt = (Dk + 63) / 64;
        double xz = 0.0;
        for (int z = 0; z < nkt; ++z) xz += xzp[((long long)ck.bh * NC + ck.i) * nkt + z];
        // Each row's sum over the two warps that share it.
        auto sum = [&](int i, int r) { return part[i][0][r] + part[i][1][r]; };
        lgb_dg_db(
            [&](int r) { return LgbRowSums<float>{sum(2, r), sum(3, r), sum(4, r), sum(0, r), sum(1, r)}; }, dgs,
            gam, bet, eg, xz, n, row0, H, dg, db);
    }
}
