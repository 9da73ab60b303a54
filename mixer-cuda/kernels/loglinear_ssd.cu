// The scalar-decay members of the log-linear family (linear attention and Mamba-2, and their
// Fenwick lifts), their chunk states (docs/math.md §2.1–§2.6): every pass parallel over (chunk,
// batch·head, tile); only a tree of log₂(#chunks) short elementwise launches joins the chunks.
// Launched by loglinear/ssd.rs; the outputs that read these states are loglinear_output.cu's.
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
//    are summed first (λ ≡ 1): one product with H_i = Σ_e e^{d_e} F_{e−1}(m_e); the host runs
//    llc_scan (2') instead of the tree then, which leaves exactly H_i in place of Z_i.
// Tree entries: level e has ⌊NC / 2^e⌋ complete blocks; entries of level e start at
// BH·DD·Σ_{e'<e} ⌊NC/2^{e'}⌋ (DD = Dk·Dv) and are laid out [bh][m][Dk][Dv]; the log-decays A
// likewise without DD. A block that is not complete is never read.

// 1. Chunk states Z_j [Dk×Dv] (tile of 64 key rows × 64 value columns) and chunk log-decays.
// Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 256 threads.
template <typename T>
__device__ void llc_states(const T* k, const T* v, const T* g, int has_g, T* F, double* A, int Tn, int H, int Dk, int Dv,
                           int nc, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[CH * LLC_LD], Ys[CH * LLC_LD];  // K̂ [s][64 key columns], V [s][64 value columns]
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int ntd = (Dv + LLC_NT - 1) / LLC_NT;
    const int c0 = (blockIdx.z / ntd) * LLC_NT, d0 = (blockIdx.z % ntd) * LLC_NT;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const LlcSpan ck = llc_span(tab, has_tab, j, nc, Tn, CH);
    const int i0 = ck.i0, n = ck.n;
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
    LLC_TILE_EACH(4, 4, i, jj, c, d, c0, d0) {
        if (c < Dk && d < Dv) Z[(long long)c * Dv + d] = acc[i][jj];
    }
    if (blockIdx.z == 0 && tid == 0) A[(long long)bh * nc + j] = alast;
}

// 2. One tree level e ≥ 1. Grid (⌊NC/2^e⌋, BH), 256 threads.
template <typename T>
__device__ void llc_tree(T* __restrict__ F, double* A, int e, int BH, int Dk, int Dv, int nc) {
    LLC_FIX_DIMS(Dk, Dv);
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

// 2'. Without a lift, instead of the tree: the state entering every chunk, in place over the
// level-0 entries. For each (batch·head) and each of the Dk·Dv entries independently,
//   H_0 = 0 (or the initial state S_0ᵀ: has_s0, S0 [BH][Dv][Dk]),  H_{j+1} = e^{a_j} H_j + Z_j,
// and entry j is overwritten by H_j (Z_j is read first), so that pass 3 runs with direct = 1 and
// reads one state per chunk. Each thread walks one entry over the chunks, loading LLC_SCAN_P
// chunks' values before storing any (the loads do not wait on the recurrence; 32 in flight
// rather than 16 took mamba2's whole call from 0.34 to 0.30 ms at T = 16k on the H200).
// With has_st, the final state H_nc is written transposed as ST [BH][Dv][Dk] (docs/math.md §7).
// With a chunk table (llc_span; B = 1) a block row is a (sequence, head) that walks its
// sequence's chunks from its own row of S0 and writes its own row of ST.
// HB (llc_scan_hb, the bf16 mode's forward): H_j goes rounded to bf16 into Hb [BH][NC][Dk][Dv]
// instead of over Z_j (the output kernel's operand as it would round it; F is only read).
// Grid (⌈Dk·Dv/256⌉, BH, or NS·H with a table), 256 threads.
#define LLC_SCAN_P 32
template <typename T, bool HB>
__device__ void llc_scan(T* __restrict__ F, mx_bf16* __restrict__ Hb, const double* __restrict__ A, int Dk, int Dv,
                         int nc, const T* S0, int has_s0, T* ST, int has_st, const int* tab, int has_tab, int H) {
    LLC_FIX_DIMS(Dk, Dv);
    const long long DD = (long long)Dk * Dv;
    const long long idx = (long long)blockIdx.x * 256 + threadIdx.x;
    const LlcRange rg = llc_range(tab, has_tab, blockIdx.y, H, nc, gridDim.y / H);
    if (idx >= DD) return;
    T* f = F + (long long)rg.bh * nc * DD + idx;
    mx_bf16* hb = HB ? Hb + (long long)rg.bh * nc * DD + idx : nullptr;
    // H_j into entry j: over Z_j, or rounded to bf16 into Hb.
    auto put = [&](int j, T x) {
        if constexpr (HB)
            hb[(long long)j * DD] = mx_f32_bf16(x);
        else
            f[(long long)j * DD] = x;
    };
    const double* a = A + (long long)rg.bh * nc;
    // Entry idx = (key c, value d) of H is entry (d, c) of the state S = Hᵀ (row rg.row of S0, ST).
    const long long sidx = (long long)rg.row * DD + (idx % Dv) * Dk + idx / Dv;
    T hcur = has_s0 ? S0[sidx] : (T)0;
    // Groups of LLC_SCAN_P chunks: every load of a group (states and decays) is issued before its
    // first store, since a load after a store that the compiler cannot tell apart waits for it,
    // and each step would then wait a full memory latency. The full groups and the short last
    // one are separate loops: with the full groups' loads and stores predicated on the group's
    // length too, a whole Mamba-2 call at B = 1 took 2.5× as long on the H200; stepping the short
    // group one chunk at a time made a packed batch's scan, a short group per sequence, 5× slower,
    // and so did its loads predicated on the group's length (H200, tf32, 16 heads of 64: 194 µs
    // for four sequences of 63 chunks against 36.5 µs for four of 64).
    int j0 = rg.jb;
    for (; j0 + LLC_SCAN_P <= rg.je; j0 += LLC_SCAN_P) {
        T z[LLC_SCAN_P], w[LLC_SCAN_P];
#pragma unroll
        for (int p = 0; p < LLC_SCAN_P; ++p) {
            z[p] = f[(long long)(j0 + p) * DD];
            w[p] = mx_exp((T)a[j0 + p]);
        }
        asm volatile("" ::: "memory");
#pragma unroll
        for (int p = 0; p < LLC_SCAN_P; ++p) {
            put(j0 + p, hcur);
            hcur = fma(w[p], hcur, z[p]);
        }
    }
    const int m = rg.je - j0;  // the short last group, 0 ≤ m < LLC_SCAN_P
    if (m > 0) {
        // As a full group, its loads unconditional at indices clamped into the group (chunk
        // j0 + min(p, m − 1)); only the stores and the recurrence stop at m.
        T z[LLC_SCAN_P], w[LLC_SCAN_P];
#pragma unroll
        for (int p = 0; p < LLC_SCAN_P; ++p) {
            const int j = j0 + min(p, m - 1);
            z[p] = f[(long long)j * DD];
            w[p] = mx_exp((T)a[j]);
        }
        asm volatile("" ::: "memory");
#pragma unroll
        for (int p = 0; p < LLC_SCAN_P; ++p) {
            if (p < m) put(j0 + p, hcur);
            hcur = p < m ? fma(w[p], hcur, z[p]) : hcur;
        }
    }
    if (has_st) ST[sidx] = hcur;
}

// The end of llc_states_tc and llc_states_tc_bf16: a warp's accumulators (key rows cr, cr + 8 of
// the tile at c0, value columns d0 + 8nt + 2tg, + 1) as Z_j's entries (Z_j [Dk][Dv] at
// F[bh·NC + j]) and, once per chunk, a_j.
__device__ __forceinline__ void llc_put_z(const float (&acc)[8][4], float* F, double* A, int bh, int nc, int j,
                                          int c0, int d0, int cr, int tg, int Dk, int Dv, double alast) {
    const long long DD = (long long)Dk * Dv;
    float* Z = F + ((long long)bh * nc + j) * DD;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = c0 + cr + (u < 2 ? 0 : 8), d = d0 + nt * 8 + 2 * tg + (u & 1);
            if (c < Dk && d < Dv) Z[(long long)c * Dv + d] = acc[nt][u];
        }
    if (blockIdx.z == 0 && threadIdx.x == 0) A[(long long)bh * nc + j] = alast;
}

// 1'. llc_states on tensor cores, the tf32 mode (k and v f32): Z_j = K̂ᵀ V as m16n8k8 tf32 mma,
// a 64 × 64 tile of (key rows, value columns) per block, 4 warps of 16 key rows. Ks, Vs [64][72]
// (padded: fragment loads hit 32 banks). Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 128 threads.
__device__ void llc_states_tc(const float* k, const float* v, const float* g, int has_g, float* F, double* A, int Tn,
                              int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float Ks[CH * LLT_LDV], Vs[CH * LLT_LDV];
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int ntd = (Dv + 63) / 64;
    const int c0 = (blockIdx.z / ntd) * 64, d0 = (blockIdx.z % ntd) * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const LlcSpan ck = llc_span(tab, has_tab, j, nc, Tn, CH);
    const int i0 = ck.i0, n = ck.n;
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    const double alast = gam[CH - 1];
    // Four entries per load (one 16-byte load when the rows allow it); K and V loads are all issued
    // before the first store.
    const bool vk = Dk % 4 == 0 && llc_al16(k), vv = Dv % 4 == 0 && llc_al16(v);
    llc_stage<float4, 2 * CH * 16 / 128, 128>(
        2 * CH * 16,
        [&](int idx) {
            const int s = (idx >> 4) & (CH - 1), c = (idx & 15) * 4;
            if (s >= n) return float4{0.f, 0.f, 0.f, 0.f};
            return idx < CH * 16 ? llc_ld4(k, (row0 + (long long)s * H) * Dk + c0, c, Dk - c0, vk)
                                 : llc_ld4(v, (row0 + (long long)s * H) * Dv + d0, c, Dv - d0, vv);
        },
        [&](int idx, float4 x) {
            const int s = (idx >> 4) & (CH - 1), c = (idx & 15) * 4;
            if (idx < CH * 16)
                llc_put4_tf32(Ks + s * LLT_LDV + c, x, __expf((float)(alast - gam[s])));
            else
                llc_put4_tf32(Vs + s * LLT_LDV + c, x, 1.f);
        });
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
    llc_put_z(acc, F, A, bh, nc, j, c0, d0, cr, tg, Dk, Dv, alast);
}

extern "C" __global__ void __launch_bounds__(128)
    llc_states_tc_f32(const float* k, const float* v, const float* g, int has_g, float* F, double* A, int Tn, int H,
                      int Dk, int Dv, int nc, const int* tab, int has_tab) {
    llc_states_tc(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc, tab, has_tab);
}

// Z += K̂ᵀ V for a warp's 16 key rows (kb .. kb + 15 of the tiles) and NT·8 value columns on
// m16n8k16 bf16 tensor cores (f32 accumulation), over the chunk's tokens s < n in steps of 16 in
// order: K̂_s = e^{a − γ_s} k_s with each product rounded to bf16 (the bf16 mode's rounding of the
// decayed keys), V as stored. Ks (tokens × key columns, rows of KLD elements) and Vs (tokens ×
// value columns, rows of VLD) hold the raw bf16 tiles, zero from token n on; both operands come by
// ldmatrix.trans (rows of KLD, VLD elements a multiple of 16 bytes, ≡ 16 mod 128 or 80: the eight
// rows an ldmatrix reads fall in distinct banks). llc_states_tc_bf16 and the bf16 walk take their
// chunk states from here: the same operands and order, so the same bits.
template <int NT, int KLD, int VLD>
__device__ __forceinline__ void llc_z_bf16(float (&acc)[NT][4], const mx_bf16* Ks, const mx_bf16* Vs,
                                           const double* gam, double alast, int n, int kb, int lane) {
    const int tg = lane & 3, q = lane >> 3, r = lane & 7;
    // A register's two bf16 (tokens s, s + 1 of one key row) times their decays, rounded to bf16.
    auto decayed = [](unsigned x, float w_lo, float w_hi) {
        return mx_pack_bf16(w_lo * __uint_as_float(x << 16), w_hi * __uint_as_float(x & 0xffff0000u));
    };
    for (int s0 = 0; s0 < n; s0 += 16) {
        unsigned a[4];
        mx_ldsm_x4_t(a, smem_u32(Ks + (s0 + (q >> 1) * 8 + r) * KLD + kb + (q & 1) * 8));
        const int s = s0 + 2 * tg;
        const float w0 = __expf((float)(alast - gam[s])), w1 = __expf((float)(alast - gam[s + 1])),
                    w8 = __expf((float)(alast - gam[s + 8])), w9 = __expf((float)(alast - gam[s + 9]));
        const unsigned a0 = decayed(a[0], w0, w1), a1 = decayed(a[1], w0, w1), a2 = decayed(a[2], w8, w9),
                       a3 = decayed(a[3], w8, w9);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            unsigned b[4];
            mx_ldsm_x4_t(b, smem_u32(Vs + (s0 + (q & 1) * 8 + r) * VLD + (nt + (q >> 1)) * 8));
            mx_mma_bf16(acc[nt], a0, a1, a2, a3, b[0], b[1]);
            mx_mma_bf16(acc[nt + 1], a0, a1, a2, a3, b[2], b[3]);
        }
    }
}

// 1''. llc_states in the bf16 mode (k and v bf16 as stored; g f32): the same Z_j and a_j as
// llc_states_tc, the product by llc_z_bf16 on the raw tiles copied by cp.async (K, V [64][72]
// bf16). Grid (NC, BH, ⌈Dk/64⌉·⌈Dv/64⌉), 128 threads.
extern "C" __global__ void __launch_bounds__(128)
    llc_states_tc_bf16(const mx_bf16* k, const mx_bf16* v, const float* g, int has_g, float* F, double* A, int Tn,
                       int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, LD = 72;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ __align__(16) mx_bf16 Ks[CH * LD], Vs[CH * LD];
    const int j = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int ntd = (Dv + 63) / 64;
    const int c0 = (blockIdx.z / ntd) * 64, d0 = (blockIdx.z % ntd) * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const LlcSpan ck = llc_span(tab, has_tab, j, nc, Tn, CH);
    const int n = ck.n;
    const long long row0 = ((long long)b * Tn + ck.i0) * H + h;
    auto at = [](int r, int c) { return r * LD + c; };
    lld_tile<CH, 64>(Ks, k + row0 * Dk + c0, (long long)H * Dk, n, Dk - c0, Dk % 8 == 0 && llc_al16(k), at);
    lld_tile<CH, 64>(Vs, v + row0 * Dv + d0, (long long)H * Dv, n, Dv - d0, Dv % 8 == 0 && llc_al16(v), at);
    asm volatile("cp.async.commit_group;\n" ::);
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    const double alast = gam[CH - 1];
    float acc[8][4] = {};
    llc_z_bf16<8, LD, LD>(acc, Ks, Vs, gam, alast, n, warp * 16, lane);
    llc_put_z(acc, F, A, bh, nc, j, c0, d0, warp * 16 + gi, tg, Dk, Dv, alast);
}

// 1'+2'. Without a lift, in the tensor-core modes: the chunk states and the scan in one pass that
// walks the chunks of a (batch·head, tile) in order, the state in registers — so the chunk states
// Z_j are never written to memory and read back:
//   F[bh·NC + j] = H_j,   H_{j+1} = e^{a_j} H_j + Z_j   (H_0 = S_0ᵀ or 0; ST = H_NC transposed).
// Z_j is the product of llc_states_tc (f32: the same tf32 operands, fragments and order) or of
// llc_states_tc_bf16 (bf16: llc_z_bf16 itself) and the update the fma of llc_scan, so F, A and ST
// are bit for bit those of the states kernel + llc_scan. A tile is
// 64 key rows × LLW_VT value columns (warp w owns key rows 16w..16w+15); K, V and g of the next
// LLW_STAGES − 1 chunks are in flight (cp.async) while a chunk is multiplied, so a step exposes no
// memory latency. K̂ = e^{a_j − γ_s} k_s is formed from the raw tile when the fragment is loaded
// (tf32 mma on f32 tiles; bf16 m16n8k16 mma on bf16 tiles, llc_z_bf16).
// Shared tiles (TI as stored: f32, or bf16 bits) are padded by 8 elements a row: fragment loads hit
// distinct banks. With a chunk table (llc_span; B = 1) a block row is a (sequence, head) that walks
// its sequence's chunks from its own row of S0 and writes its own row of ST.
// F holds f32 states, or (llc_walk_tc_hb, the bf16 mode's forward) the states rounded to bf16 as
// llc_scan_hb writes them. Grid (⌈Dk/64⌉·⌈Dv/LLW_VT⌉, BH, or NS·H with a table), 128 threads,
// dynamic shared memory LLW_STAGES · 64 · (72 + LLW_VT + 8) · sizeof(TI) bytes.
#ifndef LLW_VT
#define LLW_VT 64
#endif
#ifndef LLW_STAGES
#define LLW_STAGES 3
#endif
template <typename TI, typename TF>
__device__ void llc_walk_tc(const TI* k, const TI* v, const float* g, int has_g, TF* F, double* A, int Tn, int H,
                            int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST, int has_st, const int* tab,
                            int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, VT = LLW_VT, NT = VT / 8, E = 16 / (int)sizeof(TI), KLD = 64 + 8, VLD = VT + 8;
    constexpr int STAGE = CH * KLD + CH * VLD;  // elements of one stage's K and V tiles
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float gs[LLW_STAGES][CH];
    extern __shared__ __align__(16) unsigned char llw_dyn[];
    TI* tiles = reinterpret_cast<TI*>(llw_dyn);
    const LlcRange rg = llc_range(tab, has_tab, blockIdx.y, H, nc, gridDim.y / H);
    const int bh = rg.bh, b = bh / H, h = bh % H, row = rg.row;  // row: S0's and ST's
    const int ntd = (Dv + VT - 1) / VT;
    const int c0 = (blockIdx.x / ntd) * 64, d0 = (blockIdx.x % ntd) * VT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int cr = warp * 16 + gi;
    const long long DD = (long long)Dk * Dv;
    const bool vk = Dk % E == 0 && llc_al16(k), vv = Dv % E == 0 && llc_al16(v);
    auto atk = [](int r, int c) { return r * KLD + c; };
    auto atv = [](int r, int c) { return r * VLD + c; };
    // The copies of the block's p-th chunk into stage p mod LLW_STAGES (one commit group, empty past
    // the last chunk).
    auto issue = [&](int p) {
        if (rg.jb + p < rg.je) {
            TI* Ks = tiles + (p % LLW_STAGES) * STAGE;
            const LlcSpan ck = llc_span(tab, has_tab, rg.jb + p, nc, Tn, CH);
            const int n = ck.n;
            const long long row0 = ((long long)b * Tn + ck.i0) * H + h;
            lld_tile<CH, 64>(Ks, k + row0 * Dk + c0, (long long)H * Dk, n, Dk - c0, vk, atk);
            lld_tile<CH, VT>(Ks + CH * KLD, v + row0 * Dv + d0, (long long)H * Dv, n, Dv - d0, vv, atv);
            if (tid < CH) {
                const bool ok = has_g && tid < n;
                llc_cp_async(&gs[p % LLW_STAGES][tid], ok ? g + row0 + (long long)tid * H : g, 4, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    // The state entering chunk 0, in the accumulator layout: entry (c, d) is S_0's (d, c).
    float hc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = c0 + cr + (u < 2 ? 0 : 8), d = d0 + nt * 8 + 2 * tg + (u & 1);
            hc[nt][u] = has_s0 && c < Dk && d < Dv ? S0[(long long)row * DD + (long long)d * Dk + c] : 0.f;
        }
#pragma unroll
    for (int p = 0; p < LLW_STAGES - 1; ++p) issue(p);
    for (int p = 0; rg.jb + p < rg.je; ++p) {
        const int j = rg.jb + p;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(LLW_STAGES - 2) : "memory");
        __syncthreads();
        issue(p + LLW_STAGES - 1);  // into the stage read by step p − 1, which every thread has left
        const TI* Ks = tiles + (p % LLW_STAGES) * STAGE;
        const TI* Vs = Ks + CH * KLD;
        const int n = llc_span(tab, has_tab, j, nc, Tn, CH).n;
        const double pre = llc_prefix<CH>(tid < CH ? (double)gs[p % LLW_STAGES][tid] : 0.0, gtmp);
        if (tid < CH) gam[tid] = pre;
        __syncthreads();
        const double alast = gam[CH - 1];
        float acc[NT][4] = {};
        if constexpr (sizeof(TI) == 2) {
            llc_z_bf16<NT, KLD, VLD>(acc, Ks, Vs, gam, alast, n, warp * 16, lane);
        } else {
            for (int k8 = 0; k8 < (n + 7) / 8; ++k8) {
                const int s = k8 * 8 + tg;
                const float w0 = __expf((float)(alast - gam[s])), w1 = __expf((float)(alast - gam[s + 4]));
                const unsigned a0 = mx_tf32(w0 * llc_f(Ks[atk(s, cr)])), a1 = mx_tf32(w0 * llc_f(Ks[atk(s, cr + 8)]));
                const unsigned a2 = mx_tf32(w1 * llc_f(Ks[atk(s + 4, cr)])),
                               a3 = mx_tf32(w1 * llc_f(Ks[atk(s + 4, cr + 8)]));
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    mx_mma_tf32(acc[nt], a0, a1, a2, a3, mx_tf32(llc_f(Vs[atv(s, nt * 8 + gi)])),
                                mx_tf32(llc_f(Vs[atv(s + 4, nt * 8 + gi)])));
            }
        }
        TF* Fj = F + ((long long)bh * nc + j) * DD;
        const float w = mx_exp((float)alast);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = c0 + cr + (u < 2 ? 0 : 8), d = d0 + nt * 8 + 2 * tg + (u & 1);
                if (c < Dk && d < Dv) Fj[(long long)c * Dv + d] = llc_as<TF>(hc[nt][u]);
                hc[nt][u] = fma(w, hc[nt][u], acc[nt][u]);
            }
        if (blockIdx.x == 0 && tid == 0) A[(long long)bh * nc + j] = alast;
    }
    if (has_st) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = c0 + cr + (u < 2 ? 0 : 8), d = d0 + nt * 8 + 2 * tg + (u & 1);
                if (c < Dk && d < Dv) ST[(long long)row * DD + (long long)d * Dk + c] = hc[nt][u];
            }
    }
}

extern "C" __global__ void __launch_bounds__(128)
    llc_walk_tc_f32(const float* k, const float* v, const float* g, int has_g, float* F, double* A, int Tn, int H,
                    int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST, int has_st, const int* tab,
                    int has_tab) {
    llc_walk_tc<float, float>(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc, S0, has_s0, ST, has_st, tab, has_tab);
}
extern "C" __global__ void __launch_bounds__(128)
    llc_walk_tc_bf16(const mx_bf16* k, const mx_bf16* v, const float* g, int has_g, float* F, double* A, int Tn,
                     int H, int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST, int has_st,
                     const int* tab, int has_tab) {
    llc_walk_tc<mx_bf16, float>(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc, S0, has_s0, ST, has_st, tab, has_tab);
}
// The bf16 mode's forward: the entering states written rounded to bf16 (as llc_scan_hb).
extern "C" __global__ void __launch_bounds__(128)
    llc_walk_tc_hb(const mx_bf16* k, const mx_bf16* v, const float* g, int has_g, mx_bf16* F, double* A, int Tn,
                   int H, int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST, int has_st, const int* tab,
                   int has_tab) {
    llc_walk_tc<mx_bf16, mx_bf16>(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc, S0, has_s0, ST, has_st, tab, has_tab);
}

#define LLS_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_states_##S(const T* k, const T* v, const T* g, int has_g, T* F, double* A, int Tn, int H, int Dk,      \
                       int Dv, int nc, const int* tab, int has_tab) {                                             \
        llc_states<T>(k, v, g, has_g, F, A, Tn, H, Dk, Dv, nc, tab, has_tab);                                     \
    }                                                                                                             \
    extern "C" __global__ void llc_tree_##S(T* F, double* A, int e, int BH, int Dk, int Dv, int nc) {             \
        llc_tree<T>(F, A, e, BH, Dk, Dv, nc);                                                                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_scan_##S(T* F, const double* A, int Dk, int Dv, int nc, const T* S0, int has_s0, T* ST, int has_st,    \
                     const int* tab, int has_tab, int H) {                                                        \
        llc_scan<T, false>(F, nullptr, A, Dk, Dv, nc, S0, has_s0, ST, has_st, tab, has_tab, H);                   \
    }

LLS_EXPORT(float, f32)
LLS_EXPORT(double, f64)
extern "C" __global__ void __launch_bounds__(256)
    llc_scan_hb(float* F, mx_bf16* Hb, const double* A, int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST,
                int has_st, const int* tab, int has_tab, int H) {
    llc_scan<float, true>(F, Hb, A, Dk, Dv, nc, S0, has_s0, ST, has_st, tab, has_tab, H);
}
