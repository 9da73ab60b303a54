// Gated DeltaNet's Fenwick lift, its sequential pass in the transition form (f32 data; docs/math.md
// §2.6). Level 0 is empty whenever a chunk starts (it is merged upward at every chunk boundary),
// so chunk j takes every non-empty level e ≥ 1 through one and the same linear map and inserts
// its own state at level 0:
//     S^(e) ← e^{a_j} S^(e) + M_j S^(e),   M_j = −K̂ᵀ W   (Dk × Dk),
//     S^(0) = B_j = K̂ᵀ U                                (Dk × Dv),
// with K̂_s = e^{a_j − γ_s} k_s (γ the chunk-local prefix sums of the log-decays, a_j its last)
// and W, U the chunk's WY/UT pieces (llc_wy). M_j and B_j depend on the chunk alone:
// llc_lift_ab forms them for every chunk in parallel, and the pass llc_lift_h then does one
// product per non-empty level and chunk, where the two-product pass (llc_delta_h_tc) does two
// (W S, then K̂ᵀ times it) and one more for level 0. Both kernels come as MMA = true (the tf32 mode:
// m16n8k8 tf32 mma, f32 accumulation; M_j stored rounded to tf32) and MMA = false (the exact mode:
// f32 FMA, the same loops and accumulator layout).

// acc += A·B for a warp's 16 rows from mr and 32 columns from nb (gi = lane / 4, tg = lane % 4),
// over k < kend: A given transposed (at[k][row]), B row-major (b[k][col]), rows of LD floats.
// MMA: tf32 m16n8k8 mma on operands already rounded to tf32 (kend a multiple of 8); else each lane
// accumulates its own entries of the mma's accumulator layout (rows mr + gi, mr + gi + 8; columns
// nb + 8·nt + 2·tg, + 1) in f32 FMA.
template <int LD, bool MMA>
__device__ __forceinline__ void lift_gemm_at(float (&acc)[4][4], const float* at, const float* b, int kend, int mr,
                                             int nb, int gi, int tg) {
    if (MMA) {
        for (int k8 = 0; k8 < kend; k8 += 8) {
            const float* ap = at + (k8 + tg) * LD + mr + gi;
            const unsigned a0 = __float_as_uint(ap[0]), a1 = __float_as_uint(ap[8]),
                           a2 = __float_as_uint(ap[4 * LD]), a3 = __float_as_uint(ap[4 * LD + 8]);
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const float* bp = b + (k8 + tg) * LD + nb + nt * 8 + gi;
                mx_mma_tf32(acc[nt], a0, a1, a2, a3, __float_as_uint(bp[0]), __float_as_uint(bp[4 * LD]));
            }
        }
    } else {
        for (int s = 0; s < kend; ++s) {
            const float x0 = at[s * LD + mr + gi], x1 = at[s * LD + mr + gi + 8];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const float2 y = *reinterpret_cast<const float2*>(b + s * LD + nb + nt * 8 + 2 * tg);
                acc[nt][0] = fmaf(x0, y.x, acc[nt][0]);
                acc[nt][1] = fmaf(x0, y.y, acc[nt][1]);
                acc[nt][2] = fmaf(x1, y.x, acc[nt][2]);
                acc[nt][3] = fmaf(x1, y.y, acc[nt][3]);
            }
        }
    }
}

// 1. Per chunk j (grid (NC, BH), 256 threads): M_j, B_j and e^{a_j}. M_j is written as
// Mg[bh][j][DKP][DKP] and B_j as Bg[bh][j][DKP][DVP] (DKP, DVP = Dk, Dv rounded up to 16; the
// padding zero), so that the pass copies whole 16-byte pieces whatever the head dims; e^{a_j}
// into Eg[bh][j]. K̂ᵀ goes through 64-row tiles (Kt[s][r] = K̂_s[r0 + r], rounded to tf32 with
// MMA), W and U through 64-column tiles X; eight warps take 16 rows and 32 columns of each
// 64 × 64 product. Dynamic shared memory: Kt [64][68] | X [64][68] floats (LIFT_AB_SMEM on the host).
#define LIFT_LD 68
template <bool MMA>
__device__ void llc_lift_ab(const float* k, const float* g, int has_g, const float* W, const float* U, float* Mg,
                            float* Bg, float* Eg, int Tn, int H, int Dk, int Dv, int nc) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, LD = LIFT_LD;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ float dec[CH];
    extern __shared__ unsigned char llc_dyn[];
    float* Kt = reinterpret_cast<float*>(llc_dyn);
    float* X = Kt + CH * LD;
    const int j = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int mr = (warp & 3) * 16, nb = (warp >> 2) * 32;
    const int DKP = (Dk + 15) / 16 * 16, DVP = (Dv + 15) / 16 * 16;
    const int i0 = j * CH, n = min(CH, Tn - i0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);
    if (tid < CH) dec[tid] = tid < n ? __expf((float)(gam[CH - 1] - gam[tid])) : 0.f;
    if (tid == 0) Eg[(long long)bh * nc + j] = __expf((float)gam[CH - 1]);
    __syncthreads();
    // Columns c0 .. c0 + 63 of the chunk's rows s < n of src (D columns), times dec_s when
    // scaled, into dst (rounded to tf32 with MMA); rows from n on zero.
    auto stage = [&](float* dst, const float* src, int D, int c0, bool scaled) {
        const bool vec = D % 4 == 0 && llc_al16(src);
        llc_stage_tile<LD>(dst, src, row0, H, D, c0, n, vec, MMA, [&](int s) { return scaled ? dec[s] : 1.f; });
    };
    const int kend = MMA ? (n + 7) & ~7 : n;
    const long long first = (long long)bh * nc + j;
    for (int r0 = 0; r0 < DKP; r0 += 64) {
        stage(Kt, k, Dk, r0, true);
        for (int pass = 0; pass < 2; ++pass) {
            const int D = pass == 0 ? Dk : Dv, DP = pass == 0 ? DKP : DVP;
            for (int c0 = 0; c0 < DP; c0 += 64) {
                stage(X, pass == 0 ? W : U, D, c0, false);
                __syncthreads();
                float o[4][4] = {};
                lift_gemm_at<LD, MMA>(o, Kt, X, kend, mr, nb, gi, tg);
                float* dst = pass == 0 ? Mg + first * DKP * DKP : Bg + first * DKP * DVP;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const int r = r0 + mr + gi + (u < 2 ? 0 : 8), col = c0 + nb + nt * 8 + 2 * tg + (u & 1);
                        if (r >= DKP || col >= DP) continue;
                        // M_j = −K̂ᵀ W, a tensor-core operand of the pass only: stored rounded.
                        const float x = pass == 0 ? -o[nt][u] : o[nt][u];
                        dst[(long long)r * DP + col] = MMA && pass == 0 ? __uint_as_float(mx_tf32(x)) : x;
                    }
                __syncthreads();
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(256)
    llc_lift_ab_tc_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Mg,
                       float* Bg, float* Eg, int Tn, int H, int Dk, int Dv, int nc) {
    llc_lift_ab<true>(k, g, has_g, W, U, Mg, Bg, Eg, Tn, H, Dk, Dv, nc);
}
extern "C" __global__ void __launch_bounds__(256)
    llc_lift_ab_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Mg, float* Bg,
                    float* Eg, int Tn, int H, int Dk, int Dv, int nc) {
    llc_lift_ab<false>(k, g, has_g, W, U, Mg, Bg, Eg, Tn, H, Dk, Dv, nc);
}

// 2. The sequential pass (grid (BH, ⌈Dv/16⌉), 256 threads; head dims fixed at compile time). The
// block keeps the states of levels 1 .. E − 1 for its 16 value columns in shared memory, twice:
// chunk j reads them from one copy and writes the next chunk's into the other, so that one barrier
// per chunk orders everything. Each warp owns 16 × 8 tiles of the states (the same tiles of every
// level), and per chunk j, for each non-empty level e ≥ 1 (bit e − 1 of j) forms its tile of
// e^{a_j} S + M_j S (M_j's fragments loaded once per chunk, the level's mma in two independent
// chains); then, in its registers, the next chunk's merge: levels 1 .. m (m = ctz(j + 1), all
// non-empty at j) and the inserted B_j sum into level m + 1 (empty at j), the other levels keep
// their slot. Every state entering chunk j + 1 goes from the registers to shared memory and to Hs,
// slot popsum(j + 1) + rank [BH][slots][Dk][Dv] (the rank among chunk j + 1's non-empty levels,
// lowest first, as llc_delta_h writes them). The levels are a compile-time loop up to LIFT_EMAX,
// each one warp-uniform branch, so that no branch sits inside a product. The states enter the
// tensor cores rounded to nearest by lift_tf32 (one integer add). M_j, B_j's 16 columns and e^{a_j}
// are copied ST − 1 chunks ahead (16-byte cp.async) into ST buffers. Rows of M_j are padded to
// LDK ≡ 4 (mod 32) floats and rows of the states to 24, so that fragment loads hit 32 distinct
// banks. Dynamic shared memory: see lift_h_smem on the host.
#define LIFT_LDS 24
#define LIFT_EMAX 17  // levels the pass handles (E ≤ 17: T ≤ 2²² tokens; the host checks)
// x as a tf32 operand rounded to nearest (ties away): the tensor cores read the top 19 bits of
// the register, so adding half a tf32 unit (2¹² in the bits) rounds as cvt.rna.tf32.f32 does,
// for finite x, in one instruction instead of three (both measured on the H200; the first form of
// this pass, rounding with cvt.rna: loglinear-gated-deltanet 1.86 ms at T = 16k, 1.56 unrounded).
__device__ __forceinline__ unsigned lift_tf32(float x) { return __float_as_uint(x) + 0x1000u; }
#ifdef DH_DKP
template <bool MMA>
__device__ void llc_lift_h(const float* Mg, const float* Bg, const float* Eg, float* Hs, int Dk, int Dv, int nc, int E,
                           long long slots, int ST) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int NW = 8, NT = NW * 32, DKP = DH_DKP, LDK = (DKP + 31) / 32 * 32 + 4, SD = DKP * LIFT_LDS;
    constexpr int NTILE = DKP / 16 * 2;  // 16 × 8 tiles of one level's DKP × 16 state
    const int DVP = (Dv + 15) / 16 * 16;
    extern __shared__ unsigned char llc_dyn[];
    // Layout (floats): S [2][E − 1][SD] | Mb [ST][DKP·LDK] | Bb [ST][DKP·16] | tb [ST] (e^{a_j}).
    float* S = reinterpret_cast<float*>(llc_dyn);
    float* Mb = S + 2 * (E - 1) * SD;
    float* Bb = Mb + ST * DKP * LDK;
    float* tb = Bb + ST * DKP * 16;
    const int bh = blockIdx.x, d0 = blockIdx.y * 16;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const long long DD = (long long)Dk * Dv;
    auto prefetch = [&](int j, int buf) {
        const long long c = (long long)bh * nc + j;
        const float* m = Mg + c * DKP * DKP;
        for (int idx = tid; idx < DKP * DKP / 4; idx += NT) {
            const int r = idx / (DKP / 4), q = idx % (DKP / 4) * 4;
            llc_cp_async16(Mb + buf * DKP * LDK + r * LDK + q, m + r * DKP + q, 1);
        }
        const float* bsrc = Bg + c * DKP * DVP + d0;
        for (int idx = tid; idx < DKP * 4; idx += NT) {
            const int r = idx >> 2, q = (idx & 3) * 4;
            llc_cp_async16(Bb + buf * DKP * 16 + r * 16 + q, bsrc + (long long)r * DVP + q, 1);
        }
        if (tid == 0) llc_cp_async(tb + buf, Eg + c, 4, 1);
        asm volatile("cp.async.commit_group;\n" ::);
    };
    // Chunks 0 .. nc − 2 go through the pass: the states after the last chunk are read by no one.
    const int np = nc - 1;
    for (int jj = 0; jj < ST - 1 && jj < np; ++jj) prefetch(jj, jj);
    long long first = 0;  // popsum(j + 1): chunk j + 1's first slot in Hs
    for (int j = 0; j < np; ++j) {
        const int buf = j % ST;
        first += __popc(j);
        // Chunk j's group is complete once at most (chunks issued after it) groups are pending.
        const int after = min(ST - 2, np - 1 - j);
        if (after >= 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
        else if (after == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();  // chunk j's copies and the states chunk j − 1 wrote are in place
        // The buffer of chunk j + ST − 1 was read last by chunk j − 1, before the barrier.
        if (j + ST - 1 < np) prefetch(j + ST - 1, (j + ST - 1) % ST);
        const float* Sp = S + (j & 1) * (E - 1) * SD;
        float* Sq = S + ((j + 1) & 1) * (E - 1) * SD;
        const float* Mc = Mb + buf * DKP * LDK;
        const float* Bc = Bb + buf * DKP * 16;
        const float tot = tb[buf];
        const int mnext = __ffs(j + 1) - 1;  // chunk j + 1 merges levels 0 .. mnext into mnext + 1
        for (int tw = warp; tw < NTILE; tw += NW) {
            const int mt = tw >> 1, nt = tw & 1;
            const int r0 = mt * 16 + gi, c0 = nt * 8 + 2 * tg;  // this lane's accumulator entries
            // Accumulator entry u's offset within a tile of rows of ld floats (a state: LIFT_LDS).
            auto at = [&](int u, int ld = LIFT_LDS) { return (r0 + (u < 2 ? 0 : 8)) * ld + c0 + (u & 1); };
            // A state entering chunk j + 1 (this lane's entries): into slot `level − 1` of Sq and
            // into Hs at chunk j + 1's slot of that level.
            auto put = [&](int level, const float (&x)[4]) {
#pragma unroll
                for (int u = 0; u < 4; ++u) Sq[(level - 1) * SD + at(u)] = x[u];
                const long long slot = first + __popc((unsigned)(j + 1) & ((1u << (level - 1)) - 1u));
                float* hp = Hs + ((long long)bh * slots + slot) * DD + d0 + c0;
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = r0 + 8 * h2;
                    if (r >= Dk) continue;
                    float* p = hp + (long long)r * Dv;
                    if (Dv % 2 == 0 && d0 + c0 + 1 < Dv) {
                        *reinterpret_cast<float2*>(p) = make_float2(x[2 * h2], x[2 * h2 + 1]);
                    } else {
                        if (d0 + c0 < Dv) p[0] = x[2 * h2];
                        if (d0 + c0 + 1 < Dv) p[1] = x[2 * h2 + 1];
                    }
                }
            };
            float mg[4];  // the merged level: B_j, then the levels 1 .. mnext
#pragma unroll
            for (int u = 0; u < 4; ++u) mg[u] = Bc[at(u, 16)];
            // M_j's fragments for this tile's rows, all k (MMA).
            unsigned af[MMA ? DKP / 8 : 1][4];
            if (MMA) {
                const float* ar = Mc + r0 * LDK + tg;
#pragma unroll
                for (int k8 = 0; k8 < DKP; k8 += 8) {
                    af[k8 / 8][0] = __float_as_uint(ar[k8]);
                    af[k8 / 8][1] = __float_as_uint(ar[8 * LDK + k8]);
                    af[k8 / 8][2] = __float_as_uint(ar[k8 + 4]);
                    af[k8 / 8][3] = __float_as_uint(ar[8 * LDK + k8 + 4]);
                }
            }
#pragma unroll
            for (int e = 1; e < LIFT_EMAX; ++e) {
                if (e >= E || !((j >> (e - 1)) & 1)) continue;  // warp-uniform
                const float* sl = Sp + (e - 1) * SD;
                float acc[4], acc2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
                for (int u = 0; u < 4; ++u) acc[u] = tot * sl[at(u)];
                if (MMA) {
                    const float* br = sl + tg * LIFT_LDS + nt * 8 + gi;
#pragma unroll
                    for (int k8 = 0; k8 < DKP; k8 += 16) {
                        const unsigned* a = af[k8 / 8];
                        const unsigned* a2 = af[k8 / 8 + 1];
                        mx_mma_tf32(acc, a[0], a[1], a[2], a[3], lift_tf32(br[k8 * LIFT_LDS]),
                                    lift_tf32(br[(k8 + 4) * LIFT_LDS]));
                        mx_mma_tf32(acc2, a2[0], a2[1], a2[2], a2[3], lift_tf32(br[(k8 + 8) * LIFT_LDS]),
                                    lift_tf32(br[(k8 + 12) * LIFT_LDS]));
                    }
                } else {
#pragma unroll 4
                    for (int k4 = 0; k4 < DKP; k4 += 4) {
                        const float4 m0 = *reinterpret_cast<const float4*>(Mc + r0 * LDK + k4);
                        const float4 m1 = *reinterpret_cast<const float4*>(Mc + (r0 + 8) * LDK + k4);
                        const float x0[4] = {m0.x, m0.y, m0.z, m0.w}, x1[4] = {m1.x, m1.y, m1.z, m1.w};
                        const float* br = sl + k4 * LIFT_LDS + c0;
#pragma unroll
                        for (int kk = 0; kk < 4; ++kk) {
                            const float2 y = *reinterpret_cast<const float2*>(br + kk * LIFT_LDS);
                            float* ac = kk & 1 ? acc2 : acc;
                            ac[0] = fmaf(x0[kk], y.x, ac[0]);
                            ac[1] = fmaf(x0[kk], y.y, ac[1]);
                            ac[2] = fmaf(x1[kk], y.x, ac[2]);
                            ac[3] = fmaf(x1[kk], y.y, ac[3]);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) acc[u] += acc2[u];
                if (e <= mnext) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) mg[u] += acc[u];
                } else {
                    put(e, acc);
                }
            }
            put(mnext + 1, mg);
        }
    }
}
extern "C" __global__ void __launch_bounds__(256, 1)
    llc_lift_h_tc_f32(const float* Mg, const float* Bg, const float* Eg, float* Hs, int Dk, int Dv, int nc, int E,
                      long long slots, int stages) {
    llc_lift_h<true>(Mg, Bg, Eg, Hs, Dk, Dv, nc, E, slots, stages);
}
extern "C" __global__ void __launch_bounds__(256, 1)
    llc_lift_h_f32(const float* Mg, const float* Bg, const float* Eg, float* Hs, int Dk, int Dv, int nc, int E,
                   long long slots, int stages) {
    llc_lift_h<false>(Mg, Bg, Eg, Hs, Dk, Dv, nc, E, slots, stages);
}
#endif
