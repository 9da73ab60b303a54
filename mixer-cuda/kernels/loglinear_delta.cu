// Gated DeltaNet and its Fenwick lift, chunk-parallel except one pass (docs/math.md §2.6): per
// chunk the WY/UT pieces (llc_wy, llc_wy on tensor cores), one sequential pass over chunks that
// carries the state or the chunk-level Fenwick states (llc_delta_h, llc_delta_h_tc), and the lift's
// own output kernel (llc_out_dl; without a lift the outputs are loglinear_chunked.cu's llc_out with
// the entering states). Chunks as in loglinear_chunked.cu; helpers in loglinear_chunk.cuh. The
// lift with f32 data runs its pass in the transition form instead (loglinear_lift.cu); the lifted
// passes here serve f64, heads too wide for that form and T above 2²² (or 2²⁰ at Dk = 64).

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
                       int Tn, int H, int Dk, int Dv) {
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
// floats (TC_TILES_SMEM on the host).
// llc_wy_tc's outputs: f32 (W rounded to tf32 when w), or bf16 (rounded to nearest even).
__device__ __forceinline__ void lwt_store(float* p, float x, bool w) { *p = w ? __uint_as_float(mx_tf32(x)) : x; }
__device__ __forceinline__ void lwt_store(mx_bf16* p, float x, bool) { *p = mx_f32_bf16(x); }
#define LWT_LD 68
#ifndef LWT_BLOCKED_INV
#define LWT_BLOCKED_INV 1  // 0: T⁻¹ by the column-by-column substitution (llc_tri_inverse)
#endif
template <typename TI, typename TO>
__device__ void llc_wy_tc(const TI* k, const TI* v, const float* g, int has_g, const float* beta, TO* W, TO* U,
                          float* Ti, int want_ti, int Tn, int H, int Dk, int Dv) {
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
    const int i0 = j * CH, n = min(CH, Tn - i0);
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
#if LWT_BLOCKED_INV
    llc_tri_inverse_blocked<LDL, LWT_LD>(Lm, Tt, X);  // X is free until the W tiles are staged
#else
    llc_tri_inverse<float, CH, LDL, LWT_LD>(Lm, Tt);
#endif
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
                  float* Ti, int want_ti, int Tn, int H, int Dk, int Dv) {
    llc_wy_tc<float, float>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv);
}
#if DH_BF16
// The bf16 mode without a lift: k and v read as stored, W and U written rounded to bf16 (the
// operands of llc_delta_h_rb); g and β f32.
extern "C" __global__ void __launch_bounds__(256, LWT_MIN_BLOCKS)
    llc_wy_tc_bf16(const mx_bf16* k, const mx_bf16* v, const float* g, int has_g, const float* beta, mx_bf16* W,
                   mx_bf16* U, float* Ti, int want_ti, int Tn, int H, int Dk, int Dv) {
    llc_wy_tc<mx_bf16, mx_bf16>(k, v, g, has_g, beta, W, U, Ti, want_ti, Tn, H, Dk, Dv);
}
#endif

// cp.async copies of rows 0..CH−1 of one chunk of a matrix with D columns (row s at
// src + (row0 + s·H)·D), columns c0 .. c0 + width − 1, into dst (rows of ld entries); entries in
// rows at or past n or in columns at or past D are zero-filled. NT threads from thread 0; 16-byte
// copies when vec (D, c0 and width multiples of 16 bytes' entries, src 16-byte aligned), else
// 4-byte copies (f32 only: bf16 always takes vec).
template <int CH, int NT, typename T>
__device__ __forceinline__ void ldt_copy_rows(T* dst, int ld, const T* src, long long row0, int H, int D, int c0,
                                              int width, int n, bool vec) {
    constexpr int E = 16 / sizeof(T);  // entries per 16-byte copy
    const int tid = threadIdx.x;
    if (vec || sizeof(T) != 4) {
        const int q = width / E;
        for (int idx = tid; idx < CH * q; idx += NT) {
            const int s = idx / q, c = idx % q * E, ok = s < n && c0 + c < D;
            llc_cp_async16(dst + s * ld + c, ok ? src + (row0 + (long long)s * H) * D + c0 + c : src, ok);
        }
    } else {
        for (int idx = tid; idx < CH * width; idx += NT) {
            const int s = idx / width, c = idx % width, ok = s < n && c0 + c < D;
            llc_cp_async(dst + s * ld + c, src + (ok ? (row0 + (long long)s * H) * D + c0 + c : 0), 4, ok);
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
// The chunk copies are 16-byte cp.async where f32 sizes and pointers allow (rows of W and K then
// padded to Dk + 4; H200, T = 16k, gated-deltanet exact: 3.22–3.24 → 2.42–2.43 ms against
// 4-byte copies), else 4-byte (f64, or odd sizes; rows of Dk + 1).
// Grid (BH, ⌈Dv/16⌉), 256 threads; dynamic shared memory: see delta_h_smem on the host.
#define LLC_DVT 16
template <typename T>
__device__ void llc_delta_h(const T* k, const T* g, int has_g, const T* W, const T* U, T* Vn, T* Hs, int Tn, int H,
                            int Dk, int Dv, int nc, int lifted, int E, long long slots) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, RI = CH / 16, LDU = LLC_DVT + 1;
    // f32 rows of W and K whole 16-byte pieces long where Dk allows (16-byte copies), else Dk + 1.
    const bool vk = sizeof(T) == 4 && Dk % 4 == 0;
    const int LDW = vk ? Dk + 4 : Dk + 1;
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
    const bool vw = vk && llc_al16(W) && llc_al16(k), vu = sizeof(T) == 4 && Dv % 4 == 0 && llc_al16(U);
    auto prefetch = [&](int j, int buf) {
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        if constexpr (sizeof(T) == 4) {  // 16-byte copies where the sizes and pointers allow
            ldt_copy_rows<CH, 256>(Wb + buf * CH * LDW, LDW, W, row0, H, Dk, 0, Dk, n, vw);
            ldt_copy_rows<CH, 256>(Kb + buf * CH * LDW, LDW, k, row0, H, Dk, 0, Dk, n, vw);
            ldt_copy_rows<CH, 256>(Ub + buf * CH * LLC_DVT, LLC_DVT, U, row0, H, Dv, d0, LLC_DVT, n, vu);
        } else {
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
// bytes where Dk, Dv and the pointers allow) into ST buffers. A ninth warp does nothing but the
// decays: while the eight others compute chunk j it takes the prefix sums of chunk j + 1's
// log-decays (f32, two tokens per lane, loaded a chunk earlier) into the other of two decay
// buffers, so that the decays are off the chunk's critical path and one barrier per chunk
// publishes the loaded tiles and the decays. With the lift, the chunk's levels go through the
// products in groups of up to DH_LG (compile time): one barrier after product 1 and one after
// product 2 per group rather than per level, each warp's W or K fragments loaded once per k-step
// for the group, and the group's levels as independent mma chains (Un has DH_LG buffers).
// Grid (BH, ⌈Dv/16⌉), 288 threads (LDT_THREADS); dynamic shared memory: see delta_h_tc_smem on the host.
#define LDT_LDS 24
#ifndef DH_LG
#define DH_LG 1  // levels per group (the host passes -DDH_LG for the lift; 1 without it)
#endif
#ifndef DH_NB2
#define DH_NB2 1  // 0: the prefetch before the first barrier and a barrier after each level, lift or not
#endif
// k as the tensor cores' operand: rounded to tf32, or (-DDH_K_TF32=1, the bf16 mode, where k holds
// bf16 values, which tf32 represents exactly) its bits as they are.
#ifdef DH_K_TF32
#define DH_KOP(x) __float_as_uint(x)
#else
#define DH_KOP(x) mx_tf32(x)
#endif
// Whether ldt_copy_tile takes rows of Q pieces with NT threads (every thread the same rows' count).
template <int CH, int NT, int Q>
__device__ constexpr bool ldt_tiles() {
    return NT % Q == 0 && CH % (NT / Q) == 0;
}
// 16-byte cp.async copies of rows 0..CH−1 of one chunk into dst (rows of LD entries), when a
// row's Q 16-byte pieces divide the NT threads: thread t keeps piece t mod Q and walks rows t / Q,
// t / Q + NT / Q, … with one pointer step per row (no index arithmetic per copy). src points at
// the chunk's row 0 at the tile's first column, rows rs entries apart; pieces at or past `left`
// columns and rows at or past n are zero-filled. Threads from NT on copy nothing.
template <int CH, int NT, int Q, int LD, typename T>
__device__ __forceinline__ void ldt_copy_tile(T* dst, const T* src, long long rs, int left, int n) {
    static_assert(ldt_tiles<CH, NT, Q>(), "a row's pieces must divide the threads");
    constexpr int E = 16 / sizeof(T), RS = NT / Q;
    const int tid = threadIdx.x, c = tid % Q * E, s0 = tid / Q;
    if (tid >= NT) return;
    const bool cok = c < left;
    const T* p = src + s0 * rs + c;
    T* d = dst + s0 * LD + c;
#pragma unroll
    for (int i = 0; i < CH / RS; ++i) {
        const int ok = cok && s0 + i * RS < n;
        llc_cp_async16(d + i * RS * LD, ok ? p : src, ok);
        p += RS * rs;
    }
}
// 4-byte cp.async copies of a chunk's log-decays g[row0 + s·H] into gs[s], s < CH (zero at or
// past n, or everywhere without g). NT threads from thread 0.
template <int CH, int NT>
__device__ __forceinline__ void ldt_copy_g(float* gs, const float* g, int has_g, long long row0, int H, int n) {
    for (int s = threadIdx.x; s < CH; s += NT) {
        const int ok = has_g && s < n;
        llc_cp_async(gs + s, g + (ok ? row0 + (long long)s * H : 0), 4, ok);
    }
}
// A chunk's decays from its log-decays, two tokens per lane of a warp (x0, x1: tokens 2·lane and
// 2·lane + 1, 0 past the chunk's n tokens): γ (chunk-local prefix sums) by a warp scan, then
// d0, d1 = e^{a − γ_s} for those tokens (0 from n on); returns e^{a} (a = γ of the last token).
__device__ __forceinline__ float ldt_decays(int lane, int n, float x0, float x1, float& d0, float& d1) {
    float inc = x0 + x1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
    }
    const float alast = __shfl_sync(0xffffffffu, inc, 31);
    d0 = 2 * lane < n ? __expf(alast - (inc - x1)) : 0.f;
    d1 = 2 * lane + 1 < n ? __expf(alast - inc) : 0.f;
    return __expf(alast);
}
__device__ void llc_delta_h_tc(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn,
                               float* Hs, int Tn, int H, int Dk, int Dv, int nc, int lifted, int E, long long slots,
                               int ST) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NW = 8, NT = NW * 32;  // NW warps compute; warp NW takes the decays
#ifdef DH_DKP
    // The host compiles the pass for each Dk rounded up to 16 (-DDH_DKP=…): compile-time trip
    // counts let the W·S loop unroll fully.
    constexpr int DKP = DH_DKP, LDK = (DKP + 31) / 32 * 32 + 4;
#else
    const int DKP = (Dk + 15) / 16 * 16, LDK = (DKP + 31) / 32 * 32 + 4;
#endif
    const int SD = DKP * LDT_LDS;  // one state tile
    extern __shared__ unsigned char llc_dyn[];
    // Layout (floats): S [E][SD] | Wb [ST][CH·LDK] | Kb [ST][CH·LDK] | Ub [ST][CH·16] |
    // Un [DH_LG][CH·24] (one per level of a group) | dec2 [2][CH + 1] (chunk j's decays in
    // dec2[j mod 2]; the last entry: e^{a_j}).
    float* S = reinterpret_cast<float*>(llc_dyn);
    float* Wb = S + E * SD;
    float* Kb = Wb + ST * CH * LDK;
    float* Ub = Kb + ST * CH * LDK;
    float* Un = Ub + ST * CH * LLC_DVT;
    float* dec2 = Un + DH_LG * CH * LDT_LDS;
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int d0 = blockIdx.y * LLC_DVT;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const long long DD = (long long)Dk * Dv;
    const bool vk = Dk % 4 == 0 && llc_al16(k) && llc_al16(W);
    const bool vu = Dv % 4 == 0 && llc_al16(U);
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
            ldt_copy_rows<CH, NT>(Wd, LDK, W, row0, H, Dk, 0, DKP, n, false);
            ldt_copy_rows<CH, NT>(Kd, LDK, k, row0, H, Dk, 0, DKP, n, false);
        }
        if (vu)
            ldt_copy_tile<CH, NT, LLC_DVT / 4, LLC_DVT>(Ub + buf * CH * LLC_DVT, U + row0 * Dv + d0, (long long)H * Dv,
                                                       Dv - d0, n);
        else
            ldt_copy_rows<CH, NT>(Ub + buf * CH * LLC_DVT, LLC_DVT, U, row0, H, Dv, d0, LLC_DVT, n, false);
        asm volatile("cp.async.commit_group;\n" ::);
    };
    // The decay warp: the log-decays of chunk j as two per lane (0 past the chunk or without g), and
    // from them γ (chunk-local prefix sums), the decays e^{a_j − γ_s} (0 past the chunk's end) and
    // e^{a_j} into dst.
    const bool dwarp = warp == NW;
    auto load_g = [&](int j, float& x0, float& x1) {
        x0 = x1 = 0.f;
        if (!has_g || j >= nc) return;
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        if (2 * lane < n) x0 = g[row0 + (long long)(2 * lane) * H];
        if (2 * lane + 1 < n) x1 = g[row0 + (long long)(2 * lane + 1) * H];
    };
    auto decays = [&](int j, float x0, float x1, float* dst) {
        float d0, d1;
        const float tot = ldt_decays(lane, min(CH, Tn - j * CH), x0, x1, d0, d1);
        dst[2 * lane] = d0;
        dst[2 * lane + 1] = d1;
        if (lane == 0) dst[CH] = tot;
    };
    // Without a lift (one level, late = 1): the next chunks are prefetched after the chunk's first
    // barrier (their buffer was read last by chunk j − 1, before that barrier), so no barrier is
    // needed after the state update: the next chunk's first barrier orders it. With levels, the
    // merge before that barrier touches the states, so each level ends with a barrier.
    const bool late = DH_NB2 && !lifted;
    float gx0 = 0.f, gx1 = 0.f;  // the decay warp: chunk j + 1's log-decays during chunk j
    if (dwarp) {
        load_g(0, gx0, gx1);
        decays(0, gx0, gx1, dec2);
        load_g(1, gx0, gx1);
    } else {
        for (int idx = tid; idx < E * SD; idx += NT) S[idx] = 0.f;
        for (int jj = 0; jj < ST - 1 && jj < nc; ++jj) prefetch(jj, jj);
    }
    for (int j = 0; j < nc; ++j) {
        const int buf = j % ST;
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        if (lifted && j >= 1 && !dwarp) {  // merge levels 0..m into m + 1 (S is idle since the last barrier)
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
        if (!dwarp) {
            // Chunk j's group is complete once at most (chunks issued after it) groups are pending.
            if (!late && j + ST - 1 < nc) prefetch(j + ST - 1, (j + ST - 1) % ST);
            const int after = min(late ? ST - 2 : ST - 1, nc - 1 - j);
            if (after >= 3) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
            else if (after >= 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
            else if (after == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
            else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        __syncthreads();  // chunk j's tiles and decays (dec2[j mod 2]) are in place
        if (late && !dwarp && j + ST - 1 < nc) prefetch(j + ST - 1, (j + ST - 1) % ST);
        const float* dec = dec2 + (j & 1) * (CH + 1);
        if (dwarp) {  // chunk j + 1's decays into the other buffer (read last by chunk j − 1)
            if (j + 1 < nc) decays(j + 1, gx0, gx1, dec2 + ((j + 1) & 1) * (CH + 1));
            load_g(j + 2, gx0, gx1);
        }
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
        if (dwarp) {
        } else if (lifted) {
            long long slot = llc_popsum(j);
            for (int e = 1; e < E; ++e) {
                if (!((j >> (e - 1)) & 1)) continue;
                write_state(S + e * SD, Hs + ((long long)bh * slots + slot) * DD);
                ++slot;
            }
        } else {
            write_state(S, Hs + ((long long)bh * nc + j) * DD);
        }
        // The chunk's levels (the lift: every non-empty level e ≥ 1, highest first, then level 0;
        // without it level 0 alone), in groups of up to DH_LG: product 1 of each level of the
        // group, a barrier, product 2 of each level, and with levels a barrier. A warp loads its W
        // or K fragments once per k-step for all the group's levels, whose products are
        // independent chains.
        unsigned live = lifted ? (((unsigned)j << 1) | 1u) : 1u;  // bit e: level e takes part
        while (live) {
            int lv[DH_LG], gl = 0;  // the group's levels, its size
#pragma unroll
            for (int q = 0; q < DH_LG; ++q) {
                lv[q] = 0;
                if (live) {
                    lv[q] = 31 - __clz(live);
                    live &= ~(1u << lv[q]);
                    gl = q + 1;
                }
            }
            // Whether level e takes W (all but the lift's level 0, whose Un is U), and its sign.
            auto from_w = [&](int e) { return !lifted || e >= 1; };
            // Product 1: the warp's (m-tile, n-tile) of the 64 × 16 Un, for each level of the group.
            for (int pr = dwarp ? 8 : warp; pr < 8; pr += NW) {
                const int mw = pr & 3, nt = pr >> 2;
                float acc[DH_LG][4] = {}, acc2[DH_LG][4] = {};
                if (from_w(lv[0])) {  // levels come highest first: the group's first takes W if any does
                    const float* wr = Wc + (mw * 16 + gi) * LDK + tg;
                    const int so = tg * LDT_LDS + nt * 8 + gi;
                    int c8 = 0;
#ifdef DH_DKP
#pragma unroll
#else
#pragma unroll 2
#endif
                    // W arrives rounded to tf32 (llc_wy_tc stores it so): its bits go to the
                    // tensor cores as they are; S is kept in f32 and rounded here.
                    for (; c8 + 16 <= DKP; c8 += 16) {
                        const unsigned a0 = __float_as_uint(wr[c8]), a1 = __float_as_uint(wr[8 * LDK + c8]),
                                       a2 = __float_as_uint(wr[c8 + 4]), a3 = __float_as_uint(wr[8 * LDK + c8 + 4]);
                        const unsigned b0 = __float_as_uint(wr[c8 + 8]), b1 = __float_as_uint(wr[8 * LDK + c8 + 8]),
                                       b2 = __float_as_uint(wr[c8 + 12]), b3 = __float_as_uint(wr[8 * LDK + c8 + 12]);
#pragma unroll
                        for (int q = 0; q < DH_LG; ++q)
                            if (q < gl && from_w(lv[q])) {
                                const float* sr = S + lv[q] * SD + so;
                                mx_mma_tf32(acc[q], a0, a1, a2, a3, mx_tf32(sr[c8 * LDT_LDS]),
                                            mx_tf32(sr[(c8 + 4) * LDT_LDS]));
                                mx_mma_tf32(acc2[q], b0, b1, b2, b3, mx_tf32(sr[(c8 + 8) * LDT_LDS]),
                                            mx_tf32(sr[(c8 + 12) * LDT_LDS]));
                            }
                    }
                }
#pragma unroll
                for (int q = 0; q < DH_LG; ++q) {
                    if (q >= gl) break;
                    const bool up = lifted && lv[q] >= 1;  // a level's own update (no U), sign −1
                    float* Unq = Un + q * CH * LDT_LDS;
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const int s = mw * 16 + gi + (u < 2 ? 0 : 8), dd = nt * 8 + 2 * tg + (u & 1), d = d0 + dd;
                        const float ws = acc[q][u] + acc2[q][u];
                        float un = 0.f;
                        if (s < n && d < Dv) {
                            un = up ? ws : Uc[s * LLC_DVT + dd] - ws;
                            if (!lifted) Vn[(row0 + (long long)s * H) * Dv + d] = un;
                        }
                        // Rounded once here rather than at each of its DKP / 16 reads in product 2.
                        Unq[s * LDT_LDS + dd] = __uint_as_float(mx_tf32((up ? -1.f : 1.f) * dec[s] * un));
                    }
                }
            }
            __syncthreads();
            // Product 2: S ← e^{a_j} S + K̂ᵀ (sign·dec·Un), the warp's (m-tile, n-tile) for each level.
            for (int pr = dwarp ? (DKP / 16) * 2 : warp; pr < (DKP / 16) * 2; pr += NW) {
                const int mt = pr >> 1, nt = pr & 1;
                const int so = (mt * 16 + gi) * LDT_LDS + nt * 8 + 2 * tg;  // this lane's first state entry
                float st[DH_LG][4], st2[DH_LG][4];
#pragma unroll
                for (int q = 0; q < DH_LG; ++q)
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        st[q][u] = q < gl ? tot * S[lv[q] * SD + so + (u < 2 ? 0 : 8 * LDT_LDS) + (u & 1)] : 0.f;
                        st2[q][u] = 0.f;
                    }
                const float* kr = Kc + tg * LDK + mt * 16 + gi;
                const int uo = tg * LDT_LDS + nt * 8 + gi;
                // Rows n..63 of K̂ and Un are zero (zero-filled copies, un = 0), so the whole chunk
                // is taken: a compile-time trip count, fully unrolled (a fifth faster than stopping
                // at n, measured on the H200).
#pragma unroll
                for (int s8 = 0; s8 + 16 <= CH; s8 += 16) {
                    const unsigned a0 = DH_KOP(kr[s8 * LDK]), a1 = DH_KOP(kr[s8 * LDK + 8]),
                                   a2 = DH_KOP(kr[(s8 + 4) * LDK]), a3 = DH_KOP(kr[(s8 + 4) * LDK + 8]);
                    const unsigned b0 = DH_KOP(kr[(s8 + 8) * LDK]), b1 = DH_KOP(kr[(s8 + 8) * LDK + 8]),
                                   b2 = DH_KOP(kr[(s8 + 12) * LDK]), b3 = DH_KOP(kr[(s8 + 12) * LDK + 8]);
#pragma unroll
                    for (int q = 0; q < DH_LG; ++q)
                        if (q < gl) {
                            const float* ur = Un + q * CH * LDT_LDS + uo;
                            mx_mma_tf32(st[q], a0, a1, a2, a3, __float_as_uint(ur[s8 * LDT_LDS]),
                                        __float_as_uint(ur[(s8 + 4) * LDT_LDS]));
                            mx_mma_tf32(st2[q], b0, b1, b2, b3, __float_as_uint(ur[(s8 + 8) * LDT_LDS]),
                                        __float_as_uint(ur[(s8 + 12) * LDT_LDS]));
                        }
                }
#pragma unroll
                for (int q = 0; q < DH_LG; ++q)
                    if (q < gl)
#pragma unroll
                        for (int u = 0; u < 4; ++u)
                            S[lv[q] * SD + so + (u < 2 ? 0 : 8 * LDT_LDS) + (u & 1)] = st[q][u] + st2[q][u];
            }
            if (!late) __syncthreads();
        }
    }
}

#define LDT_THREADS 288  // 8 computing warps and the decay warp
extern "C" __global__ void __launch_bounds__(LDT_THREADS, 1)
    llc_delta_h_tc_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn, float* Hs,
                       int Tn, int H, int Dk, int Dv, int nc, int lifted, int E, long long slots, int stages) {
    llc_delta_h_tc(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, lifted, E, slots, stages);
}

// 5''. Gated DeltaNet's sequential pass without a lift, the state in registers (tf32 / bf16 modes,
// f32 data): the same pass as llc_delta_h_tc with lifted = 0, the same operand roundings, and no
// barrier inside a chunk. Each warp owns 16 value columns of the state for all keys, held
// transposed (Sᵀ, 16 × DKP) as the accumulators of DKP/8 m16n8k8 tf32 tiles, and per chunk j
//   Hs_j = S (the entering state),
//   U'ᵀ = Uᵀ − Sᵀ Wᵀ (the new values, written to Vn; 8 tiles of 8 tokens, DKP/8 k-steps),
//   Sᵀ ← e^{a_j} Sᵀ + (U'ᵀ diag(e^{a_j − γ_s})) K (DKP/8 tiles, 8 k-steps over the tokens).
// No value crosses lanes between the products: an mma's k index may be relabelled as long as both
// operands use the same relabelling, and with k = t ↔ 2t, k = t + 4 ↔ 2t + 1 (t = lane mod 4)
// an accumulator tile (c0, c1, c2, c3) = (C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1])
// (g = lane / 4) is the A fragment (c0, c2, c1, c3) of the next product, whose B fragment then
// reads rows (or columns) 2t and 2t + 1 of W or K. The chunk's W, K, U and log-decays are loaded
// ST − 1 chunks ahead (cp.async) into ST buffers shared by the block's NWV warps, one barrier per
// chunk; each warp takes the decays itself (ldt_decays) and hands them to the lanes by shuffles.
// Each warp issues both products of every chunk alone (128 mma at Dk = 64), so this kernel pays off
// with many blocks only: the host takes it when llc_delta_h_tc's blocks would need more than one
// wave (H200, T = 16k, Dk = Dv = 64, four warps: 0.80 ms against 0.68 at B·H = 16, 0.77 against
// 1.27 at B·H = 64).
// Grid (BH, ⌈Dv / (16·NWV)⌉), 32·NWV threads; dynamic shared memory ST · delta_h_rg_stage floats
// (delta_h_rg_smem on the host).
template <int DKP, int NWV, int ST>
__device__ void llc_delta_h_rg(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn,
                               float* Hs, int Tn, int H, int Dk, int Dv, int nc) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NT = 32 * NWV, KT = DKP / 8, VB = 16 * NWV;
    // Row strides: W ≡ 8 (mod 32) floats for its float2 fragment loads, K ≡ 4 and U ≡ 4 (mod 16)
    // for scalar loads from rows 2t and 2t + 1: every fragment load hits 32 distinct banks.
    constexpr int LDW = (DKP + 31) / 32 * 32 + 8, LDK = (DKP + 31) / 32 * 32 + 4, LDU = VB + 4;
    constexpr int STAGE = CH * (LDW + LDK + LDU + 1);
    extern __shared__ unsigned char llc_dyn[];
    float* smem = reinterpret_cast<float*>(llc_dyn);
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int v0 = blockIdx.y * VB, dw = warp * 16;  // the block's first value column, the warp's within it
    const long long DD = (long long)Dk * Dv;
    const bool vk = Dk % 4 == 0 && llc_al16(k) && llc_al16(W);
    const bool vu = Dv % 4 == 0 && llc_al16(U);
    // Chunk j's W, K (rows padded to LDW, LDK; columns Dk..DKP zero), U (the block's VB columns) and
    // log-decays into buffer j mod ST; rows past the chunk's end are zero. One commit group per
    // call, empty past the last chunk.
    auto prefetch = [&](int j) {
        if (j < nc) {
            float* Ws = smem + (j % ST) * STAGE;
            float* Ks = Ws + CH * LDW;
            float* Us = Ks + CH * LDK;
            float* gs = Us + CH * LDU;
            const int i0 = j * CH, n = min(CH, Tn - i0);
            const long long row0 = ((long long)b * Tn + i0) * H + h;
            constexpr bool tiles = ldt_tiles<CH, NT, DKP / 4>();
            if constexpr (tiles) {
                if (vk) {
                    ldt_copy_tile<CH, NT, DKP / 4, LDW>(Ws, W + row0 * Dk, (long long)H * Dk, Dk, n);
                    ldt_copy_tile<CH, NT, DKP / 4, LDK>(Ks, k + row0 * Dk, (long long)H * Dk, Dk, n);
                }
            }
            if (!vk || !tiles) {
                ldt_copy_rows<CH, NT>(Ws, LDW, W, row0, H, Dk, 0, DKP, n, vk);
                ldt_copy_rows<CH, NT>(Ks, LDK, k, row0, H, Dk, 0, DKP, n, vk);
            }
            if (vu)
                ldt_copy_tile<CH, NT, VB / 4, LDU>(Us, U + row0 * Dv + v0, (long long)H * Dv, Dv - v0, n);
            else
                ldt_copy_rows<CH, NT>(Us, LDU, U, row0, H, Dv, v0, VB, n, false);
            ldt_copy_g<CH, NT>(gs, g, has_g, row0, H, n);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int j = 0; j < ST - 1; ++j) prefetch(j);
    float S[KT][4];  // Sᵀ: tile kk holds keys 8kk .. 8kk + 7 as (k = 2t, 2t + 1) × (values g, g + 8)
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int u = 0; u < 4; ++u) S[kk][u] = 0.f;
    const int dg = v0 + dw + gi;  // this lane's value columns dg and dg + 8
    for (int j = 0; j < nc; ++j) {
        // Chunk j's group is complete once at most ST − 2 younger ones are pending; the barrier
        // publishes it and frees chunk j − 1's buffer, which the prefetch below overwrites.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
        __syncthreads();
        prefetch(j + ST - 1);
        const float* Ws = smem + (j % ST) * STAGE;
        const float* Ks = Ws + CH * LDW;
        const float* Us = Ks + CH * LDK;
        const float* gs = Us + CH * LDU;
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        float* Hj = Hs + ((long long)bh * nc + j) * DD;
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = 8 * kk + 2 * tg + (u & 1), d = dg + (u < 2 ? 0 : 8);
                if (c < Dk && d < Dv) Hj[(long long)c * Dv + d] = S[kk][u];
            }
        float d0, d1;
        const float tot = ldt_decays(lane, n, gs[2 * lane], gs[2 * lane + 1], d0, d1);
        // U'ᵀ = Uᵀ − Sᵀ Wᵀ: tile nt holds tokens 8nt + 2t, 8nt + 2t + 1 (columns) of values g, g + 8.
        float P[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float* ur = Us + (8 * nt + 2 * tg) * LDU + dw + gi;
            P[nt][0] = ur[0];
            P[nt][1] = ur[LDU];
            P[nt][2] = ur[8];
            P[nt][3] = ur[LDU + 8];
        }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            // −S rounded to tf32 (the rounding is odd, so this is −tf32(S)); W arrives rounded.
            const unsigned a0 = mx_tf32(-S[kk][0]), a1 = mx_tf32(-S[kk][2]), a2 = mx_tf32(-S[kk][1]),
                           a3 = mx_tf32(-S[kk][3]);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const float2 w = *reinterpret_cast<const float2*>(Ws + (8 * nt + gi) * LDW + 8 * kk + 2 * tg);
                mx_mma_tf32(P[nt], a0, a1, a2, a3, __float_as_uint(w.x), __float_as_uint(w.y));
            }
        }
        // The new values out (tokens before n, columns before Dv), then scaled by their decays
        // (0 from n on) and rounded once for the state update.
        unsigned A[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float e0 = __shfl_sync(0xffffffffu, d0, 4 * nt + tg), e1 = __shfl_sync(0xffffffffu, d1, 4 * nt + tg);
            const int s = 8 * nt + 2 * tg;
            if (s < n && dg < Dv) Vn[(row0 + (long long)s * H) * Dv + dg] = P[nt][0];
            if (s + 1 < n && dg < Dv) Vn[(row0 + (long long)(s + 1) * H) * Dv + dg] = P[nt][1];
            if (s < n && dg + 8 < Dv) Vn[(row0 + (long long)s * H) * Dv + dg + 8] = P[nt][2];
            if (s + 1 < n && dg + 8 < Dv) Vn[(row0 + (long long)(s + 1) * H) * Dv + dg + 8] = P[nt][3];
            A[nt][0] = mx_tf32(e0 * P[nt][0]);
            A[nt][1] = mx_tf32(e0 * P[nt][2]);
            A[nt][2] = mx_tf32(e1 * P[nt][1]);
            A[nt][3] = mx_tf32(e1 * P[nt][3]);
        }
        // Sᵀ ← e^{a_j} Sᵀ + (scaled U'ᵀ) K: k-steps over the chunk's tokens (rows n..63 of K and of
        // the scaled values are zero).
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
#pragma unroll
            for (int u = 0; u < 4; ++u) S[kk][u] *= tot;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float* kr = Ks + (8 * nt + 2 * tg) * LDK + gi;
#pragma unroll
            for (int kk = 0; kk < KT; ++kk)
                mx_mma_tf32(S[kk], A[nt][0], A[nt][1], A[nt][2], A[nt][3], DH_KOP(kr[8 * kk]), DH_KOP(kr[LDK + 8 * kk]));
        }
    }
}

#ifndef DHR_WARPS
#define DHR_WARPS 1  // warps per block of llc_delta_h_rg (16 value columns each)
#endif
#ifndef DHR_ST
#define DHR_ST 3  // its buffers (chunks loaded ST − 1 ahead)
#endif
#ifdef DH_DKP
#define DHR_DKP DH_DKP
#else
#define DHR_DKP 64  // the host always passes Dk (LLC_DK); this lets the file compile alone
#endif
extern "C" __global__ void __launch_bounds__(32 * DHR_WARPS)
    llc_delta_h_rg_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn,
                       float* Hs, int Tn, int H, int Dk, int Dv, int nc) {
    llc_delta_h_rg<DHR_DKP, DHR_WARPS, DHR_ST>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc);
}

// 5'''. Gated DeltaNet's sequential pass in the bf16 mode without a lift: llc_delta_h_rg's scheme
// (each warp owns 16 value columns of the state for all keys, Sᵀ held as f32 mma accumulators, no
// barrier inside a chunk) on bf16 operands: k, W and U bf16 as stored (W and U rounded by
// llc_wy_tc_bf16), m16n8k16 bf16 mma (half the mma and k-steps of tf32) with f32 accumulation,
// W's and K's fragments by ldmatrix from rows padded by 16 bytes (no bank conflicts). Per chunk j
//   Hs_j = S (f32),
//   U'ᵀ = Uᵀ − Sᵀ Wᵀ (Sᵀ rounded to bf16; U' written to Vn rounded to bf16),
//   Sᵀ ← e^{a_j} Sᵀ + (U'ᵀ diag(e^{a_j − γ_s})) K (the scaled values rounded to bf16).
// Two accumulator tiles (keys, or tokens, 16kk .. 16kk + 15) make one A fragment of the next
// product as they are: the first gives k = 2t, 2t + 1, the second 2t + 8, 2t + 9. The new values
// leave transposed by movmatrix (two adjacent values of one token per lane). Needs Dk and Dv
// multiples of 8 and 16-byte aligned k, W, U (the host checks).
template <int DKP, int NWV, int ST>
__device__ void llc_delta_h_rb(const mx_bf16* k, const float* g, int has_g, const mx_bf16* W, const mx_bf16* U,
                               mx_bf16* Vn, float* Hs, int Tn, int H, int Dk, int Dv, int nc) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NT = 32 * NWV, KT = DKP / 8, K16 = DKP / 16, VB = 16 * NWV;
    constexpr int DKW = (DKP + 31) / 32 * 32;    // W, K columns copied (zero from Dk on): whole x4 loads
    // Row strides (bf16) 16 bytes longer than the rows: an ldmatrix's eight rows fall in distinct
    // 16-byte bank groups.
    constexpr int LDW = DKW + 8, LDU = VB + 8;
    constexpr int STAGE = CH * (2 * LDW + LDU) * 2 + CH * 4;  // bytes: W, K, U, log-decays
    extern __shared__ unsigned char llc_dyn[];
    const int bh = blockIdx.x, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int lr = lane & 7, lm = lane >> 3;   // the row and the matrix this lane addresses in ldmatrix
    const int v0 = blockIdx.y * VB, dw = warp * 16;  // the block's first value column, the warp's within it
    const long long DD = (long long)Dk * Dv;
    auto prefetch = [&](int j) {
        if (j < nc) {
            mx_bf16* Ws = reinterpret_cast<mx_bf16*>(llc_dyn + (j % ST) * STAGE);
            mx_bf16* Ks = Ws + CH * LDW;
            mx_bf16* Us = Ks + CH * LDW;
            float* gs = reinterpret_cast<float*>(Us + CH * LDU);
            const int i0 = j * CH, n = min(CH, Tn - i0);
            const long long row0 = ((long long)b * Tn + i0) * H + h;
            ldt_copy_tile<CH, NT, DKW / 8, LDW>(Ws, W + row0 * Dk, (long long)H * Dk, Dk, n);
            ldt_copy_tile<CH, NT, DKW / 8, LDW>(Ks, k + row0 * Dk, (long long)H * Dk, Dk, n);
            ldt_copy_tile<CH, NT, VB / 8, LDU>(Us, U + row0 * Dv + v0, (long long)H * Dv, Dv - v0, n);
            ldt_copy_g<CH, NT>(gs, g, has_g, row0, H, n);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int j = 0; j < ST - 1; ++j) prefetch(j);
    float S[KT][4];  // Sᵀ: tile kk holds keys 8kk + 2t, 8kk + 2t + 1 (columns) of values g, g + 8
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int u = 0; u < 4; ++u) S[kk][u] = 0.f;
    const int dg = v0 + dw + gi;  // this lane's value columns dg and dg + 8 in S
    const bool hlo = dg < Dv, hhi = dg + 8 < Dv;
    float* hp = Hs + (long long)bh * nc * DD + 2 * tg * Dv + dg;  // chunk j's entering state, this lane's first entry
    const int dc = v0 + dw + 2 * tg;  // this lane's pairs of new values: columns dc, dc + 1 and dc + 8, dc + 9
    const bool vlo = dc < Dv, vhi = dc + 8 < Dv;
    const long long vstep = 8LL * H * Dv;  // eight tokens of Vn
    for (int j = 0; j < nc; ++j) {
        // As llc_delta_h_rg: chunk j's group is complete, the barrier frees chunk j − 1's buffer.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
        __syncthreads();
        prefetch(j + ST - 1);
        const unsigned char* base = llc_dyn + (j % ST) * STAGE;
        const unsigned wa = (unsigned)__cvta_generic_to_shared(base);
        const unsigned ka = wa + CH * LDW * 2, ua = ka + CH * LDW * 2;
        const float* gs = reinterpret_cast<const float*>(base + CH * (2 * LDW + LDU) * 2);
        const int i0 = j * CH, n = min(CH, Tn - i0);
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        // The entering state: keys 8kk + 2t (+1) of values g, g + 8 (Dk is a multiple of 8, so a
        // key tile is in or out whole).
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
            if (8 * kk < Dk)
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (u < 2 ? hlo : hhi) hp[(8 * kk + (u & 1)) * Dv + (u < 2 ? 0 : 8)] = S[kk][u];
        hp += DD;
        float d0, d1;
        const float tot = ldt_decays(lane, n, gs[2 * lane], gs[2 * lane + 1], d0, d1);
        // U'ᵀ = Uᵀ − Sᵀ Wᵀ: tile nt holds tokens 8nt + 2t, 8nt + 2t + 1 (columns) of values g, g + 8;
        // Uᵀ by transposing loads of U (tokens 16np .. 16np + 15, the warp's 16 values).
        float P[8][4];
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            unsigned r[4];
            mx_ldsm_x4_t(r, ua + ((16 * np + 8 * (lm >> 1) + lr) * LDU + dw + 8 * (lm & 1)) * 2);
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                P[2 * np + q][0] = __uint_as_float(r[2 * q] << 16);
                P[2 * np + q][1] = __uint_as_float(r[2 * q] & 0xffff0000u);
                P[2 * np + q][2] = __uint_as_float(r[2 * q + 1] << 16);
                P[2 * np + q][3] = __uint_as_float(r[2 * q + 1] & 0xffff0000u);
            }
        }
        unsigned A[K16][4];  // −Sᵀ as A fragments, k-steps of 16 keys
#pragma unroll
        for (int kk = 0; kk < K16; ++kk) {
            A[kk][0] = mx_pack_bf16(-S[2 * kk][0], -S[2 * kk][1]);
            A[kk][1] = mx_pack_bf16(-S[2 * kk][2], -S[2 * kk][3]);
            A[kk][2] = mx_pack_bf16(-S[2 * kk + 1][0], -S[2 * kk + 1][1]);
            A[kk][3] = mx_pack_bf16(-S[2 * kk + 1][2], -S[2 * kk + 1][3]);
        }
#pragma unroll
        for (int kq = 0; kq < DKW / 32; ++kq)
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                unsigned w[4];  // W rows 8nt .. 8nt + 7, keys 32kq .. 32kq + 31: two k-steps' B fragments
                mx_ldsm_x4(w, wa + ((8 * nt + lr) * LDW + 32 * kq + 8 * lm) * 2);
                mx_mma_bf16(P[nt], A[2 * kq][0], A[2 * kq][1], A[2 * kq][2], A[2 * kq][3], w[0], w[1]);
                if (2 * kq + 1 < K16)
                    mx_mma_bf16(P[nt], A[2 * kq + 1][0], A[2 * kq + 1][1], A[2 * kq + 1][2], A[2 * kq + 1][3], w[2],
                                w[3]);
            }
        // The new values out (tokens before n; Dv is a multiple of 8, so a lane's pair of columns is
        // in or out together), then scaled by their decays (0 from n on) as the A fragments of the
        // state update, k-steps of 16 tokens.
        unsigned B2[4][4];
        mx_bf16* vp = Vn + (row0 + (long long)gi * H) * Dv + dc;  // token g of the chunk
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const unsigned lo = mx_movm_t(mx_pack_bf16(P[nt][0], P[nt][1]));  // token 8nt + g, values 2t, 2t + 1
            const unsigned hi = mx_movm_t(mx_pack_bf16(P[nt][2], P[nt][3]));  // values 2t + 8, 2t + 9
            if (8 * nt + gi < n) {
                unsigned* vr = reinterpret_cast<unsigned*>(vp);
                if (vlo) vr[0] = lo;
                if (vhi) vr[4] = hi;
            }
            vp += vstep;
            const float e0 = __shfl_sync(0xffffffffu, d0, 4 * nt + tg), e1 = __shfl_sync(0xffffffffu, d1, 4 * nt + tg);
            B2[nt >> 1][(nt & 1) * 2] = mx_pack_bf16(e0 * P[nt][0], e1 * P[nt][1]);
            B2[nt >> 1][(nt & 1) * 2 + 1] = mx_pack_bf16(e0 * P[nt][2], e1 * P[nt][3]);
        }
        // Sᵀ ← e^{a_j} Sᵀ + (scaled U'ᵀ) K: K's fragments by transposing loads (tokens 16kk .. 16kk + 15,
        // keys 16np .. 16np + 15); rows n..63 of K and of the scaled values are zero.
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
#pragma unroll
            for (int u = 0; u < 4; ++u) S[kk][u] *= tot;
#pragma unroll
        for (int np = 0; np < KT / 2; ++np)
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                unsigned r[4];
                mx_ldsm_x4_t(r, ka + ((16 * kk + 8 * (lm & 1) + lr) * LDW + 16 * np + 8 * (lm >> 1)) * 2);
                mx_mma_bf16(S[2 * np], B2[kk][0], B2[kk][1], B2[kk][2], B2[kk][3], r[0], r[1]);
                mx_mma_bf16(S[2 * np + 1], B2[kk][0], B2[kk][1], B2[kk][2], B2[kk][3], r[2], r[3]);
            }
    }
}
#if DH_BF16  // the bf16 mode's kernels are compiled in their own module (-DDH_BF16=1)
extern "C" __global__ void __launch_bounds__(32 * DHR_WARPS)
    llc_delta_h_rb_bf16(const mx_bf16* k, const float* g, int has_g, const mx_bf16* W, const mx_bf16* U,
                        mx_bf16* Vn, float* Hs, int Tn, int H, int Dk, int Dv, int nc) {
    llc_delta_h_rb<DHR_DKP, DHR_WARPS, DHR_ST>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc);
}
#endif


// 6. Outputs of gated DeltaNet's lift, chunk i, a tile of 64 value columns (docs/math.md §2.6):
// P = σ QKᵀ ⊙ Γ (s ≤ r); the intra-chunk coefficients A = P T⁻¹ diag(β), weighted λ_r^(ℓ(r,s)), give
// y = A V; the carried queries Q̃ = σ diag(e^γ) Q − P W read every level state llc_delta_h wrote for
// the chunk: y_r += Σ_e λ_r^(c+e) Q̃_r S^(e). Grid (NC, BH, ⌈Dv/64⌉), 256 threads; dynamic shared
// memory (Pt, At [CH][CH+1], Qt [64][CH+1], Xs, Ys [16][65]).
template <typename T>
__device__ void llc_out_dl(const T* q, const T* k, const T* v, const T* g, int has_g, const T* beta, const T* lam,
                           const T* W, const T* Ti, const T* Hs, T* y, int Tn, int H, int Dk, int Dv, int L, int nc,
                           long long slots, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
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
    // acc += M · X, M = Mt transposed (Mt[s][r], rows r of the chunk), X the chunk's tokens s < n of
    // a [B,T,H,D] array, columns col0 .. col0 + LLC_NT − 1; tokens staged LLC_KT at a time.
    auto times_tokens = [&](T (&acc)[RI][4], const T* Mt, const T* src, int D, int col0) {
        for (int s0 = 0; s0 < n; s0 += LLC_KT) {
            for (int idx = tid; idx < LLC_KT * LLC_NT; idx += 256) {
                const int kk = idx / LLC_NT, cc = idx % LLC_NT, s = s0 + kk;
                Ys[kk * LLC_LD + cc] =
                    (s < n && col0 + cc < D) ? src[(row0 + (long long)s * H) * D + col0 + cc] : (T)0;
            }
            __syncthreads();
            llc_gemm<T, RI, 4, LDC, LLC_LD>(acc, Mt + s0 * LDC, Ys, min(LLC_KT, n - s0), ty, tx);
            __syncthreads();
        }
    };
    T yacc[RI][4] = {};
    times_tokens(yacc, At, v, Dv, d0);  // A V
    const long long first = llc_popsum(i);
    const int ne = __popc((unsigned)i);
    for (int c0 = 0; ne > 0 && c0 < Dk; c0 += 64) {
        // Q̃ for key columns c0..c0+64: σ e^γ Q − P W.
        T qa[RI][4] = {};
        times_tokens(qa, Pt, W, Dk, c0);  // P W
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

// 6'. llc_out_dl on tensor cores (tf32 / bf16 modes, f32 data): the same outputs, every product
// (QKᵀ, P·T⁻¹diag(β), A·V, P·W, Q̃·S^(e)) as m16n8k8 tf32 mma with f32 accumulation. Eight warps:
// warp w owns rows 16 (w mod 4) .. + 15 and columns 32 ⌊w / 4⌋ .. + 31 of every 64 × 64 product.
// Shared (floats, rows of 68 ≡ 4 mod 32 so that fragment loads hit 32 banks): Pm [64][68] (P),
// Am [64][68] (a Q tile, then the λ-weighted A, then a Q̃ tile), X [64][68] (the B operand
// being staged: K, T⁻¹diag(β), V, W or a level state). Grid (NC, BH, ⌈Dv/64⌉), 256 threads,
// 3 · 64 · 68 · 4 bytes of dynamic shared memory.
#define LDL_LD 68
__device__ void llc_out_dl_tc(const float* q, const float* k, const float* v, const float* g, int has_g,
                              const float* beta, const float* lam, const float* W, const float* Ti, const float* Hs,
                              float* y, int Tn, int H, int Dk, int Dv, int L, int nc, long long slots, double scale) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, CB = 6;
    extern __shared__ unsigned char llc_dyn[];
    float* Pm = reinterpret_cast<float*>(llc_dyn);
    float* Am = Pm + CH * LDL_LD;
    float* X = Am + CH * LDL_LD;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float bet[CH];
    const int i = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int d0 = blockIdx.z * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32;
    const int i0 = i * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const long long DD = (long long)Dk * Dv;
    const float sc = (float)scale;
    const bool vq = Dk % 4 == 0 && llc_al16(q) && llc_al16(k) && llc_al16(W), vv = Dv % 4 == 0 && llc_al16(v),
               vh = Dv % 4 == 0 && llc_al16(Hs);
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : 0.f;
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    // 64 × 64 tile of a [rows][D] array into dst (rows r < nrows of src at src + base + r·stride,
    // columns c0 .. c0 + 63 below D), rounded to tf32; 4 loads of four floats per thread.
    auto stage = [&](float* dst, const float* src, int nrows, int D, int c0, bool vec, long long base,
                     long long stride) {
        llc_stage<float4, 4, 256>(
            CH * 16,
            [&](int idx) {
                const int r = idx >> 4;
                return r < nrows ? llc_ld4(src, base + r * stride + c0, (idx & 15) * 4, D - c0, vec)
                                 : float4{0.f, 0.f, 0.f, 0.f};
            },
            [&](int idx, float4 x) {
                const int r = idx >> 4;
                llc_put4_tf32(dst + r * LDL_LD + (idx & 15) * 4, x, 1.f);
            });
    };
    auto mma_rows = [&](float (&acc)[4][4], const float* a, const float* bt, int kend, bool b_t) {
        llc_mma_rows<LDL_LD>(acc, a, bt, kend, b_t, mr, nb, gi, tg);
    };
    // Fragment element u of n-tile nt: row, column.
    auto frow = [&](int u) { return mr + gi + (u < 2 ? 0 : 8); };
    auto fcol = [&](int nt, int u) { return nb + nt * 8 + 2 * tg + (u & 1); };
    // 1. P = σ QKᵀ ⊙ Γ (s ≤ r).
    {
        float acc[4][4] = {};
        for (int c0 = 0; c0 < Dk; c0 += 64) {
            stage(Am, q, n, Dk, c0, vq, row0 * Dk, (long long)H * Dk);
            stage(X, k, n, Dk, c0, vq, row0 * Dk, (long long)H * Dk);
            __syncthreads();
            mma_rows(acc, Am, X, min(64, (Dk - c0 + 7) & ~7), true);
            __syncthreads();
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = frow(u), s = fcol(nt, u);
                const float p = (s <= r && r < n) ? sc * acc[nt][u] * __expf((float)(gam[r] - gam[s])) : 0.f;
                Pm[r * LDL_LD + s] = __uint_as_float(mx_tf32(p));
            }
    }
    // 2. A = P T⁻¹ diag(β), λ-weighted by the Fenwick level of (r, s).
    {
        const float* Tc = Ti + ((long long)bh * nc + i) * CH * CH;
        stage(X, Tc, CH, CH, 0, llc_al16(Ti), 0, CH);
        __syncthreads();
        float acc[4][4] = {};
        mma_rows(acc, Pm, X, (n + 7) & ~7, false);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = frow(u), s = fcol(nt, u);
                // (P T⁻¹)[r][s] β_s λ_r^(ℓ(r,s))
                const float a = (s <= r && r < n) ? acc[nt][u] * bet[s] *
                                                        lam[(row0 + (long long)r * H) * L + llc_bitlen((unsigned)(r ^ s))]
                                                  : 0.f;
                Am[r * LDL_LD + s] = __uint_as_float(mx_tf32(a));
            }
        __syncthreads();
    }
    // 3. y = A V (value columns d0 ..).
    float yacc[4][4] = {};
    stage(X, v, n, Dv, d0, vv, row0 * Dv, (long long)H * Dv);
    __syncthreads();
    mma_rows(yacc, Am, X, (n + 7) & ~7, false);
    __syncthreads();
    // 4. The levels entering the chunk: y_r += Σ_e λ_r^(c+e) Q̃_r S^(e), Q̃ = σ e^γ Q − P W, over key
    // tiles of 64.
    const long long first = llc_popsum(i);
    const int ne = __popc((unsigned)i);
    for (int c0 = 0; ne > 0 && c0 < Dk; c0 += 64) {
        stage(X, W, n, Dk, c0, vq, row0 * Dk, (long long)H * Dk);
        __syncthreads();
        float qa[4][4] = {};
        mma_rows(qa, Pm, X, (n + 7) & ~7, false);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = frow(u), cc = fcol(nt, u), c = c0 + cc;
                const float qt = (r < n && c < Dk)
                                     ? sc * __expf((float)gam[r]) * q[(row0 + (long long)r * H) * Dk + c] - qa[nt][u]
                                     : 0.f;
                Am[r * LDL_LD + cc] = __uint_as_float(mx_tf32(qt));
            }
        __syncthreads();
        int rank = 0;
        for (int e = 1; e <= llc_bitlen((unsigned)i); ++e) {
            if (!((i >> (e - 1)) & 1)) continue;
            const float* Se = Hs + ((long long)bh * slots + first + rank) * DD;
            ++rank;
            stage(X, Se, min(64, Dk - c0), Dv, d0, vh, (long long)c0 * Dv, Dv);
            __syncthreads();
            float la[4][4] = {};
            mma_rows(la, Am, X, min(64, (Dk - c0 + 7) & ~7), false);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = frow(u);
                const float w = r < n ? lam[(row0 + (long long)r * H) * L + CB + e] : 0.f;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) yacc[nt][u] += w * la[nt][u];
            }
            __syncthreads();
        }
    }
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = frow(u), d = d0 + fcol(nt, u);
            if (r < n && d < Dv) y[(row0 + (long long)r * H) * Dv + d] = yacc[nt][u];
        }
}

extern "C" __global__ void __launch_bounds__(256)
    llc_out_dl_tc_f32(const float* q, const float* k, const float* v, const float* g, int has_g, const float* beta,
                      const float* lam, const float* W, const float* Ti, const float* Hs, float* y, int Tn, int H,
                      int Dk, int Dv, int L, int nc, long long slots, double scale) {
    llc_out_dl_tc(q, k, v, g, has_g, beta, lam, W, Ti, Hs, y, Tn, H, Dk, Dv, L, nc, slots, scale);
}

#define LLD_EXPORT(T, S)                                                                                          \
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
    }

LLD_EXPORT(float, f32)
LLD_EXPORT(double, f64)
