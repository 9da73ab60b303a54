// Gated DeltaNet's WY/UT step (docs/math.md §2.6), parallel over chunks: per chunk, with the
// chunk-local prefix sums γ of the log-decays and the gates β, Lm = strict(diag(β)(KKᵀ ⊙ Γ)),
// T⁻¹ = (I + Lm)⁻¹, W = T⁻¹ diag(β e^γ) K and U = T⁻¹ diag(β) V, and for the lift's outputs T⁻¹
// itself: llc_wy (FMA, the exact mode), llc_wy_tc (tensor cores, the tf32 and bf16 modes) and
// llc_wy_tc_bf16 (the bf16 mode's bf16 operands, compiled only with -DDH_BF16=1). Launched by
// loglinear/wy.rs; chunks and helpers as in loglinear_common.cuh.

// T⁻¹ = (I + Lm)⁻¹ for a strictly lower triangular CH × CH Lm (rows of LDL), column by column:
// X[r][c] = 0 for r < c, X[c][c] = 1 and X[r][c] = −Σ_{c≤s<r} Lm[r][s] X[s][c] for r > c (the terms
// s < c vanish, so they are not computed: a third of the work of the full sums). Four lanes per
// column c split the sum and join it by shuffles; the rows r run from the warp's first column on,
// the same for its eight columns (the shuffles need the whole warp). Column c lives in row c of
// Tt (rows of LDX), read and written by its own warp only. Threads 0 .. 4·CH − 1 of the block
// take part (CH a multiple of 8).
template <typename T, int CH, int LDL, int LDX>
__device__ inline void llc_tri_inverse(const T* Lm, T* Tt) {
    const int tid = threadIdx.x, c = tid >> 2, part = tid & 3;
    if (c >= CH) return;
    T* x = Tt + c * LDX;
    for (int r = part; r < c; r += 4) x[r] = (T)0;
    if (part == 0) x[c] = (T)1;
    __syncwarp();
    for (int r = (c & ~7) + 1; r < CH; ++r) {
        T a0 = (T)0, a1 = (T)0;
        int s2 = c + part;
        for (; s2 + 4 < r; s2 += 8) {
            a0 = fma(Lm[r * LDL + s2], x[s2], a0);
            a1 = fma(Lm[r * LDL + s2 + 4], x[s2 + 4], a1);
        }
        if (s2 < r) a0 = fma(Lm[r * LDL + s2], x[s2], a0);
        T acc = a0 + a1;
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (part == 0 && r > c) x[r] = -acc;
        __syncwarp();
    }
}

// acc += A B for one m16n8k8 step from f32 fragments (a0..a3, b0, b1 as mx_mma_tf32's), in three
// tf32 products: a_lo b_hi + a_hi b_lo + a_hi b_hi, hi = tf32(x), lo = tf32(x − hi).
__device__ __forceinline__ void llc_mma3_tf32(float (&acc)[4], float a0, float a1, float a2, float a3, float b0,
                                              float b1) {
    const unsigned ah0 = mx_tf32(a0), ah1 = mx_tf32(a1), ah2 = mx_tf32(a2), ah3 = mx_tf32(a3), bh0 = mx_tf32(b0),
                   bh1 = mx_tf32(b1);
    const unsigned al0 = mx_tf32(a0 - __uint_as_float(ah0)), al1 = mx_tf32(a1 - __uint_as_float(ah1)),
                   al2 = mx_tf32(a2 - __uint_as_float(ah2)), al3 = mx_tf32(a3 - __uint_as_float(ah3)),
                   bl0 = mx_tf32(b0 - __uint_as_float(bh0)), bl1 = mx_tf32(b1 - __uint_as_float(bh1));
    mx_mma_tf32(acc, al0, al1, al2, al3, bh0, bh1);
    mx_mma_tf32(acc, ah0, ah1, ah2, ah3, bl0, bl1);
    mx_mma_tf32(acc, ah0, ah1, ah2, ah3, bh0, bh1);
}

// The same T⁻¹ = (I + Lm)⁻¹ by 16 × 16 blocks (CH = 64; 256 threads), balanced over the warps:
// 1. each diagonal block X_ii = (I + L_ii)⁻¹ by the forward substitution above, restricted to
//    the block (at most 15 steps per column instead of 63);
// 2. the blocks below the diagonal, one block diagonal d = i − j at a time (d = 1, 2, 3), from
//    (I + L) X = I: X_ij = −X_ii Y_ij with Y_ij = Σ_{j ≤ k < i} L_ik X_kj, as tensor-core products
//    (llc_mma3_tf32), Y staged in Ys (6 · 16 × 8 floats, one slice per working warp). These
//    products took most of the inverse's instructions as FMA loops (WY kernel 0.295 → 0.21 ms,
//    docs/gpu-report.md).
// Same layout: column c of X in row c of Tt (rows of LDX), zero above the diagonal.
template <int LDL, int LDX>
__device__ inline void llc_tri_inverse_blocked(const float* Lm, float* Tt, float* Ys) {
    constexpr int CH = 64, NB = 16;
    const int tid = threadIdx.x, c = tid >> 2, part = tid & 3, c0 = c & ~(NB - 1);
    float* x = Tt + c * LDX;
    for (int r = part; r < CH; r += 4) x[r] = r == c ? 1.f : 0.f;
    __syncwarp();
    for (int r = (c & ~7) + 1; r < c0 + NB; ++r) {
        float acc = 0.f;
        for (int s = c + part; s < r; s += 4) acc = fmaf(Lm[r * LDL + s], x[s], acc);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        if (part == 0 && r > c) x[r] = -acc;
        __syncwarp();
    }
    // Step 2 on tensor cores: warp w < 2 (4 − d) takes block (i, j) = (⌊w/2⌋ + d, ⌊w/2⌋) and its
    // 8 columns 16j + 8 (w mod 2) ..: Y (16 × 8) = L_i,[16j,16i) X_[16j,16i),cols, staged in the
    // warp's 16 × 8 floats of Ys, then X_ij = −X_ii Y; m16n8k8 products in three tf32 terms
    // (a_hi b_hi + a_hi b_lo + a_lo b_hi, hi = tf32(x), lo = tf32(x − hi)): f32-like accuracy.
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    float* ys = Ys + warp * 128;
    for (int d = 1; d < CH / NB; ++d) {
        __syncthreads();  // the blocks of diagonals < d are in place
        if (warp >= 2 * (CH / NB - d)) continue;
        // rows r0 .. r0 + 15 of T⁻¹, its columns cb .. cb + 7
        const int j = warp >> 1, i = j + d, r0 = i * NB, cb = j * NB + (warp & 1) * 8;
        float y[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k8 = j * NB; k8 < i * NB; k8 += 8) {
            const float* ap = Lm + (r0 + g) * LDL + k8 + t;
            const float* bp = Tt + (cb + g) * LDX + k8 + t;
            llc_mma3_tf32(y, ap[0], ap[8 * LDL], ap[4], ap[8 * LDL + 4], bp[0], bp[4]);
        }
        // Y[g][2t], Y[g][2t + 1], Y[g + 8][2t], Y[g + 8][2t + 1] → ys[row][col] (rows of 8)
        ys[g * 8 + 2 * t] = y[0], ys[g * 8 + 2 * t + 1] = y[1];
        ys[(g + 8) * 8 + 2 * t] = y[2], ys[(g + 8) * 8 + 2 * t + 1] = y[3];
        __syncwarp();
        float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k8 = 0; k8 < NB; k8 += 8) {
            // A = X_ii[g][k8 + t] = Tt[r0 + k8 + t][r0 + g]; B = Y[k8 + t][g]
            const float* ap = Tt + (r0 + k8 + t) * LDX + r0 + g;
            llc_mma3_tf32(x, ap[0], ap[8], ap[4 * LDX], ap[4 * LDX + 8], ys[(k8 + t) * 8 + g], ys[(k8 + t + 4) * 8 + g]);
        }
        // X_ij[g (+8)][2t (+1)] = −x → Tt[cb + 2t (+1)][r0 + g (+8)]
        float* dst = Tt + (cb + 2 * t) * LDX + r0 + g;
        dst[0] = -x[0], dst[LDX] = -x[1], dst[8] = -x[2], dst[LDX + 8] = -x[3];
        __syncwarp();  // ys is read before the next diagonal's stores (also ordered by the barrier)
    }
}

// The chunk's T⁻¹ (column c in row c of Tt, rows of LDX) written row-major [CH][CH] at chunk j
// of batch·head bh, for the lift's intra-chunk coefficients. 256 threads.
template <typename T, int CH, int LDX>
__device__ inline void llc_store_ti(T* Ti, const T* Tt, int bh, int j) {
    T* dst = Ti + ((long long)bh * gridDim.x + j) * CH * CH;
    for (int idx = threadIdx.x; idx < CH * CH; idx += 256) dst[idx] = Tt[(idx % CH) * LDX + idx / CH];
}

// 4. Gated DeltaNet (no lift), chunk-parallel WY/UT pieces (docs/math.md §2.6). Per chunk, with
// γ and β: Lm = strict(diag(β)(KKᵀ ⊙ Γ)), T⁻¹ = (I + Lm)⁻¹ by forward substitution (four lanes per
// column), W = T⁻¹ diag(β e^γ) K, U = T⁻¹ diag(β) V, written as W [B,T,H,Dk], U [B,T,H,Dv].
// Grid (NC, BH), 256 threads.
template <typename T>
__device__ void llc_wy(const T* k, const T* v, const T* g, int has_g, const T* beta, T* W, T* U, T* Ti, int want_ti,
                       int Tn, int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDT = CH + 1;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Lm[CH * LDT];  // Lm[r][s]
    __shared__ T Tt[CH * LDT];  // Tt[s][r] = T⁻¹[r][s]
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T bet[CH];
    const int j = blockIdx.x, bh = blockIdx.y;
    const int b = bh / H, h = bh % H;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const LlcSpan sp = llc_span(tab, has_tab, j, nc, Tn, CH);  // chunk j, or a packed batch's
    const int i0 = sp.i0, n = sp.n;
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
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
            Lm[r * LDT + s] = (s < r && r < n) ? bet[r] * acc[a][bb] * mx_exp((T)(gam[r] - gam[s])) : (T)0;
        }
    }
    __syncthreads();
    llc_tri_inverse<T, CH, LDT, LDT>(Lm, Tt);
    __syncthreads();
    if (want_ti) llc_store_ti<T, CH, LDT>(Ti, Tt, bh, j);
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

// 4'. llc_wy on tensor cores (tf32 / bf16 modes, f32 data): the products KKᵀ,
// W = T⁻¹ diag(β e^γ) K and U = T⁻¹ diag(β) V as m16n8k8 tf32 mma with f32 accumulation, over
// 64-column tiles of K and V staged (rounded to tf32) in X [64][68]; T⁻¹ = (I + Lm)⁻¹ by 16 × 16
// blocks (llc_tri_inverse_blocked: f32 substitution in the diagonal blocks, three-term tf32
// products below them), X serving as its scratch. Eight warps: warp w takes rows
// 16 (w mod 4) .. + 15 and columns 32 ⌊w / 4⌋ .. + 31 of each 64 × 64 product (tiles of KKᵀ above
// the diagonal are skipped). Row strides ≡ 4 (mod 32) so that fragment loads hit 32 banks.
// Grid (NC, BH), 256 threads; dynamic shared memory: X [64][68] | Lm [64][68] | Tt [64][68]
// floats (WY_TC_SMEM in loglinear/wy.rs).
// llc_wy_tc's outputs: f32 (W rounded to tf32 when w), or bf16 (rounded to nearest even).
__device__ __forceinline__ void lwt_store(float* p, float x, bool w) { *p = w ? __uint_as_float(mx_tf32(x)) : x; }
__device__ __forceinline__ void lwt_store(mx_bf16* p, float x, bool) { *p = mx_f32_bf16(x); }
#define LWT_LD 68
template <typename TI, typename TO>
__device__ void llc_wy_tc(const TI* k, const TI* v, const float* g, int has_g, const float* beta, TO* W, TO* U,
                          float* Ti, int want_ti, int Tn, int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, LDL = LWT_LD;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float bet[CH];
    extern __shared__ unsigned char llc_dyn[];
    float* X = reinterpret_cast<float*>(llc_dyn);  // a 64-column tile of K or V, [64][LWT_LD]
    float* Lm = X + CH * LWT_LD;                    // [64][LDL]
    float* Tt = Lm + CH * LDL;                      // Tt[s][r] = T⁻¹[r][s], [64][LWT_LD]
    const int j = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32;  // this warp's first row and column
    const LlcSpan sp = llc_span(tab, has_tab, j, nc, Tn, CH);  // chunk j, or a packed batch's
    const int i0 = sp.i0, n = sp.n;
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : 0.f;
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    // Columns c0 .. c0 + 63 of rows r < n of src (D columns), times the row weight w(r), rounded,
    // into X; w = 1 (wmode 0), βᵣ·exp(γᵣ) (wmode 1) or βᵣ (wmode 2). (No generic lambdas: some
    // NVRTC versions take a lambda with an `auto` parameter for a host function.)
    auto wrow = [&](int wmode, int r) {
        return wmode == 0 ? 1.f : wmode == 1 ? (r < n ? bet[r] * __expf((float)gam[r]) : 0.f) : bet[r];
    };
    auto stage = [&](const TI* src, int D, bool vec, int c0, int wmode) {
        llc_stage_tile<LWT_LD>(X, src, row0, H, D, c0, n, vec, true, [&](int r) { return wrow(wmode, r); });
    };
    // KKᵀ, then Lm = strict(diag(β)(KKᵀ ⊙ Γ)).
    {
        float acc[4][4] = {};
        const bool live = nb <= mr + 15;  // some column of this warp's tiles is left of the diagonal
        for (int c0 = 0; c0 < Dk; c0 += 64) {
            stage(k, Dk, Dk % 4 == 0 && llc_al16(k), c0, 0);
            __syncthreads();
            const int kend = min(64, (Dk - c0 + 7) & ~7);
            if (live) llc_mma_rows<LWT_LD>(acc, X, X, kend, true, mr, nb, gi, tg);
            __syncthreads();
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = mr + gi + (u < 2 ? 0 : 8), s = nb + nt * 8 + 2 * tg + (u & 1);
                Lm[r * LDL + s] = (s < r && r < n) ? bet[r] * acc[nt][u] * __expf((float)(gam[r] - gam[s])) : 0.f;
            }
    }
    __syncthreads();
    llc_tri_inverse_blocked<LDL, LWT_LD>(Lm, Tt, X);  // X is free until the W tiles are staged
    __syncthreads();
    if (want_ti) llc_store_ti<float, CH, LWT_LD>(Ti, Tt, bh, j);
    // W (over key tiles), then U (over value tiles): out[r][col] = Σ_s T⁻¹[r][s] Y[s][col].
    // T⁻¹ is lower triangular: rows mr .. mr + 15 take s ≤ mr + 15 only.
    const int send = min((n + 7) & ~7, mr + 16);
    for (int pass = 0; pass < 2; ++pass) {
        const int D = pass == 0 ? Dk : Dv;
        const TI* src = pass == 0 ? k : v;
        TO* dst = pass == 0 ? W : U;
        const bool vec = D % 4 == 0 && llc_al16(src);
        for (int c0 = 0; c0 < D; c0 += 64) {
            if (pass == 0)
                stage(src, D, vec, c0, 1);  // K times βᵣe^γᵣ
            else
                stage(src, D, vec, c0, 2);  // V times βᵣ
            __syncthreads();
            float o[4][4] = {};
            for (int k8 = 0; k8 < send; k8 += 8) {
                const float* a = Tt + (k8 + tg) * LWT_LD + mr + gi;
                const unsigned a0 = mx_tf32(a[0]), a1 = mx_tf32(a[8]), a2 = mx_tf32(a[4 * LWT_LD]),
                               a3 = mx_tf32(a[4 * LWT_LD + 8]);
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const float* bq = X + (k8 + tg) * LWT_LD + nb + nt * 8 + gi;
                    mx_mma_tf32(o[nt], a0, a1, a2, a3, __float_as_uint(bq[0]), __float_as_uint(bq[4 * LWT_LD]));
                }
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int r = mr + gi + (u < 2 ? 0 : 8), col = c0 + nb + nt * 8 + 2 * tg + (u & 1);
                    // f32 W is stored rounded to tf32: its readers (the sequential pass, the lift's
                    // outputs) take it as a tensor-core operand only, and skip the rounding.
                    if (r < n && col < D) lwt_store(dst + (row0 + (long long)r * H) * D + col, o[nt][u], pass == 0);
                }
            __syncthreads();
        }
    }
}

// With head dims ≤ 64 at most 64 registers, so that four blocks fit an SM as their shared memory
// does (the tensor-core inverse would take 73); larger head dims need more (no minimum then).
#if defined(LLC_DK) && defined(LLC_DV) && LLC_DK <= 64 && LLC_DV <= 64
#define LWT_MIN_BLOCKS 4
#else
#define LWT_MIN_BLOCKS 1
#endif
extern "C" __global__ void __launch_bounds__(256, LWT_MIN_BLOCKS)
    llc_wy_tc_f32(const float* k, const float* v, const float* g, int has_g, const float* beta, float* W, float* U,
                  float* Ti, int want_ti, int Tn, int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {
    llc_wy_tc<float, float>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv, nc, tab, has_tab);
}
#if DH_BF16
// The bf16 mode without a lift: k and v read as stored, W and U written rounded to bf16 (the
// operands of llc_delta_h_rb); g and β f32.
extern "C" __global__ void __launch_bounds__(256, LWT_MIN_BLOCKS)
    llc_wy_tc_bf16(const mx_bf16* k, const mx_bf16* v, const float* g, int has_g, const float* beta, mx_bf16* W,
                   mx_bf16* U, float* Ti, int want_ti, int Tn, int H, int Dk, int Dv, int nc, const int* tab,
                   int has_tab) {
    llc_wy_tc<mx_bf16, mx_bf16>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv, nc, tab, has_tab);
}
#endif

#define LLW_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_wy_##S(const T* k, const T* v, const T* g, int has_g, const T* beta, T* W, T* U, T* Ti, int want_ti,   \
                   int Tn, int H, int Dk, int Dv, int nc, const int* tab, int has_tab) {                          \
        llc_wy<T>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv, nc, tab, has_tab);                      \
    }

LLW_EXPORT(float, f32)
LLW_EXPORT(double, f64)
