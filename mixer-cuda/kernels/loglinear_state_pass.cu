// Gated DeltaNet's sequential state pass over chunks (docs/math.md §2.6), every variant: the
// one step of the chunked form that is not parallel over chunks. Without a lift it writes the
// state entering each chunk and the new values U' = U − W S; with the lift, every chunk-level
// Fenwick state entering each chunk. The host picks one variant by one rule (loglinear/state_pass.rs,
// StatePass::select) and launches it:
// - llc_delta_h: FMA (the exact mode, and f64);
// - llc_delta_h_tc: tensor cores, the states in shared memory, the lift's levels DH_LG at a time;
// - llc_delta_h_rg: tensor cores, no lift, the state in registers (many batch·heads);
// - llc_delta_h_rb: the bf16 mode's llc_delta_h_rg on bf16 operands (-DDH_BF16=1);
// - llc_lift_ab + llc_lift_h: the lift with f32 data in the transition form (one product per
//   level and chunk), tensor cores or FMA.
// Its inputs W, U come from the WY/UT step (loglinear_wy.cu); its outputs go to the output step
// (loglinear_output.cu). Chunks and helpers as in loglinear_common.cuh.

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
//   A run from a state (docs/math.md §7; every pass without a lift takes one, with the same
//   arguments): with has_s0 the state entering chunk 0 is H_0 = S_0ᵀ, read from S0 [BH][Dv][Dk],
//   instead of zero; with has_st the state after the last chunk (e^{a_j} over its n tokens only,
//   so after token T − 1), H_T = S_Tᵀ, is written to ST [BH][Dv][Dk]. The host passes
//   has_s0 = has_st = 0 with the lift (its level states are not one S).
// - lifted = 1 (chunk-level Fenwick states S^(e), e < E, docs/math.md §2.6): merge levels 0..m
//   into m + 1 (m = ctz j, j ≥ 1); write every non-empty level e ≥ 1 (bit e − 1 of j) to Hs at slot
//   popsum(j) + rank [BH][slots][Dk][Dv] (popsum(j) = Σ_{j'<j} popcount(j'), so chunk j's levels
//   follow each other); take every such level through the chunk, S ← e^{a_j} S − K̂ᵀ (W S); and
//   insert the chunk's own state at level 0, S^(0) = K̂ᵀ U.
// The chunk copies are 16-byte cp.async where f32 sizes and pointers allow (rows of W and K then
// padded to Dk + 4; H200, T = 16k, gated-deltanet exact: 3.22–3.24 → 2.42–2.43 ms against
// 4-byte copies), else 4-byte (f64, or odd sizes; rows of Dk + 1).
// Grid (BH, ⌈Dv/16⌉), 256 threads; dynamic shared memory: see delta_h_smem in loglinear/state_pass.rs.
#define LLC_DVT 16
template <typename T>
__device__ void llc_delta_h(const T* k, const T* g, int has_g, const T* W, const T* U, T* Vn, T* Hs, int Tn, int H,
                            int Dk, int Dv, int nc, int lifted, int E, long long slots, const T* S0, int has_s0,
                            T* ST, int has_st) {
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
    // The states entering chunk 0: zero, or H_0 = S_0ᵀ (has_s0, no lift; entry (c, d) of H is
    // entry (d, c) of S_0).
    const bool from_s0 = has_s0 && !lifted, to_st = has_st && !lifted;
    for (int idx = tid; idx < E * SD; idx += 256) {
        T h0 = (T)0;
        if (from_s0 && idx < SD) {
            const int c = idx / LLC_DVT, d = d0 + idx % LLC_DVT;
            if (d < Dv) h0 = S0[(long long)bh * DD + (long long)d * Dk + c];
        }
        S[idx] = h0;
    }
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
    // The state after the last token (the last chunk's update ended with a barrier): S_T = Hᵀ.
    if (to_st)
        for (int idx = tid; idx < SD; idx += 256) {
            const int c = idx / LLC_DVT, d = d0 + idx % LLC_DVT;
            if (d < Dv) ST[(long long)bh * DD + (long long)d * Dk + c] = S[idx];
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
// Without a lift it starts from S0 and writes ST as llc_delta_h does (has_s0, has_st).
// Grid (BH, ⌈Dv/16⌉), 288 threads (LDT_THREADS); dynamic shared memory: see delta_h_tc_smem in loglinear/state_pass.rs.
#define LDT_LDS 24
#ifndef DH_LG
#define DH_LG 1  // levels per group (the host passes -DDH_LG for the lift; 1 without it)
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
                               int ST, const float* S0, int has_s0, float* STo, int has_st) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NW = 8, NT = NW * 32;  // NW warps compute; warp NW takes the decays
#ifdef DH_DKP
    // The host compiles the pass for the call's Dk (-DLLC_DK, and DH_DKP = Dk rounded up to 16):
    // compile-time trip counts let the W·S loop unroll fully.
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
    const bool late = !lifted;
    float gx0 = 0.f, gx1 = 0.f;  // the decay warp: chunk j + 1's log-decays during chunk j
    if (dwarp) {
        load_g(0, gx0, gx1);
        decays(0, gx0, gx1, dec2);
        load_g(1, gx0, gx1);
    } else {
        // The states entering chunk 0: zero, or H_0 = S_0ᵀ (has_s0, no lift; entry (c, d) of H is
        // entry (d, c) of S_0).
        const bool from_s0 = has_s0 && !lifted;
        for (int idx = tid; idx < E * SD; idx += NT) {
            const int c = idx / LDT_LDS, dd = idx % LDT_LDS, d = d0 + dd;
            const bool in = from_s0 && idx < SD && c < Dk && dd < LLC_DVT && d < Dv;
            S[idx] = in ? S0[(long long)bh * DD + (long long)d * Dk + c] : 0.f;
        }
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
    // The state after the last token (no lift): S_T = Hᵀ, once the last update is complete.
    if (has_st && !lifted) {
        __syncthreads();
        for (int idx = tid; idx < Dk * LLC_DVT; idx += blockDim.x) {
            const int c = idx / LLC_DVT, dd = idx % LLC_DVT, d = d0 + dd;
            if (d < Dv) STo[(long long)bh * DD + (long long)d * Dk + c] = S[c * LDT_LDS + dd];
        }
    }
}

#define LDT_THREADS 288  // 8 computing warps and the decay warp
extern "C" __global__ void __launch_bounds__(LDT_THREADS, 1)
    llc_delta_h_tc_f32(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn, float* Hs,
                       int Tn, int H, int Dk, int Dv, int nc, int lifted, int E, long long slots, int stages,
                       const float* S0, int has_s0, float* ST, int has_st) {
    llc_delta_h_tc(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, lifted, E, slots, stages, S0, has_s0, ST, has_st);
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
// 1.27 at B·H = 64). From a state as llc_delta_h (has_s0, has_st; ldt_state_in, ldt_state_out).
// Grid (BH, ⌈Dv / (16·NWV)⌉), 32·NWV threads; dynamic shared memory ST · delta_h_rg_stage floats
// (delta_h_rg_smem in loglinear/state_pass.rs).
// A run from a state in the register passes (llc_delta_h_rg, llc_delta_h_rb; no lift): a lane's
// tiles of Sᵀ hold keys c = 8kk + 2t + (u & 1) of values d = dg + 8·(u ≥ 2); entry (c, d) of
// H = Sᵀ is entry (d, c) of a state S [BH][Dv][Dk] (S0 at `at` = bh·Dk·Dv). ldt_state_in loads
// H_0 = S_0ᵀ (zero without has_s0), ldt_state_out writes the state after the last token.
template <int KT>
__device__ __forceinline__ void ldt_state_in(float (&S)[KT][4], const float* S0, int has_s0, long long at, int Dk,
                                             int Dv, int dg, int tg) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = 8 * kk + 2 * tg + (u & 1), d = dg + (u < 2 ? 0 : 8);
            S[kk][u] = has_s0 && c < Dk && d < Dv ? S0[at + (long long)d * Dk + c] : 0.f;
        }
}
template <int KT>
__device__ __forceinline__ void ldt_state_out(const float (&S)[KT][4], float* ST, long long at, int Dk, int Dv, int dg,
                                              int tg) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = 8 * kk + 2 * tg + (u & 1), d = dg + (u < 2 ? 0 : 8);
            if (c < Dk && d < Dv) ST[at + (long long)d * Dk + c] = S[kk][u];
        }
}
// REV: gated DeltaNet's reverse pass over chunks for its backward (docs/math.md §2.7; the FMA
// form is lgb_pass<T, true> of loglinear_backward_chunked.cu), the same body with the chunks taken
// from the last and W and K exchanged: called with k ← W (the WY step's, tf32-rounded) and W ← k,
// U ← A = Pᵀ dY and Hs ← the chunks' B = σ Qᵀ diag(e^γ) dY (lgb_pre). With X (Dk × Dv, held as
// the forward holds Sᵀ) the adjoint of the state after chunk j, per chunk:
//   dU' = A + diag(τ) K X (written to Vn),
//   B_j read from Hs_j, X stored there, X ← e^{a_j} X + B_j − Wᵀ dU';
// X starts as S̄_Tᵀ (S0 ← the final state's cotangent) and the X left after chunk 0 is S̄_0ᵀ
// (written to ST_). No chunk table.
template <int DKP, int NWV, int ST, bool REV = false>
__device__ void llc_delta_h_rg(const float* k, const float* g, int has_g, const float* W, const float* U, float* Vn,
                               float* Hs, int Tn, int H, int Dk, int Dv, int nc, const float* S0, int has_s0,
                               float* ST_, int has_st, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NT = 32 * NWV, KT = DKP / 8, VB = 16 * NWV;
    // Row strides: W ≡ 8 (mod 32) floats for its float2 fragment loads, K ≡ 4 and U ≡ 4 (mod 16)
    // for scalar loads from rows 2t and 2t + 1: every fragment load hits 32 distinct banks.
    constexpr int LDW = (DKP + 31) / 32 * 32 + 8, LDK = (DKP + 31) / 32 * 32 + 4, LDU = VB + 4;
    constexpr int STAGE = CH * (LDW + LDK + LDU + 1);
    extern __shared__ unsigned char llc_dyn[];
    float* smem = reinterpret_cast<float*>(llc_dyn);
    // The chunks [jb, je) this block walks: every chunk of its (batch, head), or a packed batch's
    // sequence's (row = (sequence, head): its rows of S0 and ST; llc_range).
    const LlcRange rg = llc_range(tab, has_tab, blockIdx.x, H, nc, gridDim.x / H);
    const int bh = rg.bh, b = bh / H, h = bh % H, row = rg.row;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int v0 = blockIdx.y * VB, dw = warp * 16;  // the block's first value column, the warp's within it
    const long long DD = (long long)Dk * Dv;
    const bool vk = Dk % 4 == 0 && llc_al16(k) && llc_al16(W);
    const bool vu = Dv % 4 == 0 && llc_al16(U);
    // The block's p-th chunk's W, K (rows padded to LDW, LDK; columns Dk..DKP zero), U (the block's
    // VB columns) and log-decays into buffer p mod ST; rows past the chunk's end are zero. One
    // commit group per call, empty past the last chunk.
    // The block's p-th chunk: j = jb + p, or from the end (REV).
    auto chunk_of = [&](int p) { return REV ? rg.je - 1 - p : rg.jb + p; };
    auto prefetch = [&](int p) {
        if (rg.jb + p < rg.je) {
            float* Ws = smem + (p % ST) * STAGE;
            float* Ks = Ws + CH * LDW;
            float* Us = Ks + CH * LDK;
            float* gs = Us + CH * LDU;
            const LlcSpan sp = llc_span(tab, has_tab, chunk_of(p), nc, Tn, CH);
            const int i0 = sp.i0, n = sp.n;
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
    const int dg = v0 + dw + gi;  // this lane's value columns dg and dg + 8
    float S[KT][4];  // Sᵀ: tile kk holds keys 8kk .. 8kk + 7 as (k = 2t, 2t + 1) × (values g, g + 8)
    ldt_state_in<KT>(S, S0, has_s0, row * DD, Dk, Dv, dg, tg);
    for (int p = 0; rg.jb + p < rg.je; ++p) {
        const int j = chunk_of(p);
        // Chunk j's group is complete once at most ST − 2 younger ones are pending; the barrier
        // publishes it and frees the previous chunk's buffer, which the prefetch below overwrites.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
        __syncthreads();
        prefetch(p + ST - 1);
        const float* Ws = smem + (p % ST) * STAGE;
        const float* Ks = Ws + CH * LDW;
        const float* Us = Ks + CH * LDK;
        const float* gs = Us + CH * LDU;
        const LlcSpan sp = llc_span(tab, has_tab, j, nc, Tn, CH);
        const int i0 = sp.i0, n = sp.n;
        const long long row0 = ((long long)b * Tn + i0) * H + h;
        float* Hj = Hs + ((long long)bh * nc + j) * DD;
        // Reverse: B_j into registers first, every load issued before the stores of X_j to the
        // same places (and before the chunk's products, which hide their latency).
        float Bq[REV ? KT : 1][4];
        if constexpr (REV) {
#pragma unroll
            for (int kk = 0; kk < KT; ++kk)
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int c = 8 * kk + 2 * tg + (u & 1), d = dg + (u < 2 ? 0 : 8);
                    Bq[REV ? kk : 0][u] = c < Dk && d < Dv ? Hj[(long long)c * Dv + d] : 0.f;
                }
        }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = 8 * kk + 2 * tg + (u & 1), d = dg + (u < 2 ? 0 : 8);
                if (c < Dk && d < Dv) Hj[(long long)c * Dv + d] = S[kk][u];
            }
        float d0, d1;
        const float tot = ldt_decays(lane, n, gs[2 * lane], gs[2 * lane + 1], d0, d1);
        // Forward: U'ᵀ = Uᵀ − Sᵀ Wᵀ; reverse: (K X)ᵀ = Xᵀ Kᵀ (K in W's place, rounded here). Tile nt
        // holds tokens 8nt + 2t, 8nt + 2t + 1 (columns) of values g, g + 8.
        float P[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float* ur = Us + (8 * nt + 2 * tg) * LDU + dw + gi;
            P[nt][0] = REV ? 0.f : ur[0];
            P[nt][1] = REV ? 0.f : ur[LDU];
            P[nt][2] = REV ? 0.f : ur[8];
            P[nt][3] = REV ? 0.f : ur[LDU + 8];
        }
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            // −S rounded to tf32 (the rounding is odd, so this is −tf32(S)); W arrives rounded.
            const float sg = REV ? 1.f : -1.f;
            const unsigned a0 = mx_tf32(sg * S[kk][0]), a1 = mx_tf32(sg * S[kk][2]), a2 = mx_tf32(sg * S[kk][1]),
                           a3 = mx_tf32(sg * S[kk][3]);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const float2 w = *reinterpret_cast<const float2*>(Ws + (8 * nt + gi) * LDW + 8 * kk + 2 * tg);
                const unsigned b0 = REV ? mx_tf32(w.x) : __float_as_uint(w.x),
                               b1 = REV ? mx_tf32(w.y) : __float_as_uint(w.y);
                mx_mma_tf32(P[nt], a0, a1, a2, a3, b0, b1);
            }
        }
        // Forward: the new values out (tokens before n, columns before Dv), then scaled by their
        // decays (0 from n on) and rounded once for the state update. Reverse: dU' = A + τ (K X)
        // out, and −dU' rounded for the update.
        unsigned A[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float e0 = __shfl_sync(0xffffffffu, d0, 4 * nt + tg), e1 = __shfl_sync(0xffffffffu, d1, 4 * nt + tg);
            const int s = 8 * nt + 2 * tg;
            if (REV) {
                const float* ur = Us + s * LDU + dw + gi;
                P[nt][0] = fmaf(e0, P[nt][0], ur[0]);
                P[nt][1] = fmaf(e1, P[nt][1], ur[LDU]);
                P[nt][2] = fmaf(e0, P[nt][2], ur[8]);
                P[nt][3] = fmaf(e1, P[nt][3], ur[LDU + 8]);
            }
            if (s < n && dg < Dv) Vn[(row0 + (long long)s * H) * Dv + dg] = P[nt][0];
            if (s + 1 < n && dg < Dv) Vn[(row0 + (long long)(s + 1) * H) * Dv + dg] = P[nt][1];
            if (s < n && dg + 8 < Dv) Vn[(row0 + (long long)s * H) * Dv + dg + 8] = P[nt][2];
            if (s + 1 < n && dg + 8 < Dv) Vn[(row0 + (long long)(s + 1) * H) * Dv + dg + 8] = P[nt][3];
            const float f0 = REV ? -1.f : e0, f1 = REV ? -1.f : e1;
            A[nt][0] = mx_tf32(f0 * P[nt][0]);
            A[nt][1] = mx_tf32(f0 * P[nt][2]);
            A[nt][2] = mx_tf32(f1 * P[nt][1]);
            A[nt][3] = mx_tf32(f1 * P[nt][3]);
        }
        // Forward: Sᵀ ← e^{a_j} Sᵀ + (scaled U'ᵀ) K; reverse: Xᵀ ← e^{a_j} Xᵀ + B_jᵀ − dU'ᵀ W (W in
        // K's place). k-steps over the chunk's tokens (rows n..63 of K, W and of the scaled values
        // are zero).
#pragma unroll
        for (int kk = 0; kk < KT; ++kk)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (REV) {
                    S[kk][u] = fmaf(tot, S[kk][u], Bq[REV ? kk : 0][u]);
                } else {
                    S[kk][u] *= tot;
                }
            }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
            const float* kr = Ks + (8 * nt + 2 * tg) * LDK + gi;
#pragma unroll
            for (int kk = 0; kk < KT; ++kk)
                mx_mma_tf32(S[kk], A[nt][0], A[nt][1], A[nt][2], A[nt][3], DH_KOP(kr[8 * kk]), DH_KOP(kr[LDK + 8 * kk]));
        }
    }
    if (has_st) ldt_state_out<KT>(S, ST_, row * DD, Dk, Dv, dg, tg);
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
                       float* Hs, int Tn, int H, int Dk, int Dv, int nc, const float* S0, int has_s0, float* ST,
                       int has_st, const int* tab, int has_tab) {
    llc_delta_h_rg<DHR_DKP, DHR_WARPS, DHR_ST>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, S0, has_s0, ST, has_st,
                                               tab, has_tab);
}
// The reverse pass of gated DeltaNet's backward (llc_delta_h_rg with REV): W and k as the forward
// pass takes them (exchanged here), A over U (lgb_pre's Pᵀ dY), dU' into dU, B_j over Xs read and
// X_j written in its place, from the final state's cotangent dF (where has_df) and with the
// initial state's cotangent into dS0 (where has_ds0). Grid and shared memory as llc_delta_h_rg.
extern "C" __global__ void __launch_bounds__(32 * DHR_WARPS)
    llc_delta_h_rg_rev_f32(const float* k, const float* g, const float* W, const float* A, float* dU, float* Xs,
                           int Tn, int H, int Dk, int Dv, int nc, const float* dF, int has_df, float* dS0,
                           int has_ds0) {
    llc_delta_h_rg<DHR_DKP, DHR_WARPS, DHR_ST, true>(W, g, 1, k, A, dU, Xs, Tn, H, Dk, Dv, nc, dF, has_df, dS0,
                                                     has_ds0, nullptr, 0);
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
// multiples of 8 and 16-byte aligned k, W, U (the host checks). From an f32 state as
// llc_delta_h_rg (the state stays f32 in and out).
template <int DKP, int NWV, int ST>
__device__ void llc_delta_h_rb(const mx_bf16* k, const float* g, int has_g, const mx_bf16* W, const mx_bf16* U,
                               mx_bf16* Vn, float* Hs, int Tn, int H, int Dk, int Dv, int nc, const float* S0,
                               int has_s0, float* ST_, int has_st, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, NT = 32 * NWV, KT = DKP / 8, K16 = DKP / 16, VB = 16 * NWV;
    // W, K columns copied (zero from Dk on): whole x4 loads of 32 keys, and a power of two so that a
    // row's 16-byte pieces divide the threads (ldt_copy_tile); the products read KW32 groups of 32.
    constexpr int DKW = DKP <= 32 ? 32 : DKP <= 64 ? 64 : 128, KW32 = (DKP + 31) / 32;
    static_assert(DKP <= 128, "llc_delta_h_rb holds at most 128 keys");
    // Row strides (bf16) 16 bytes longer than the rows: an ldmatrix's eight rows fall in distinct
    // 16-byte bank groups.
    constexpr int LDW = DKW + 8, LDU = VB + 8;
    constexpr int STAGE = CH * (2 * LDW + LDU) * 2 + CH * 4;  // bytes: W, K, U, log-decays
    extern __shared__ unsigned char llc_dyn[];
    const LlcRange rg = llc_range(tab, has_tab, blockIdx.x, H, nc, gridDim.x / H);  // as llc_delta_h_rg
    const int bh = rg.bh, b = bh / H, h = bh % H, row = rg.row;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const int lr = lane & 7, lm = lane >> 3;   // the row and the matrix this lane addresses in ldmatrix
    const int v0 = blockIdx.y * VB, dw = warp * 16;  // the block's first value column, the warp's within it
    const long long DD = (long long)Dk * Dv;
    auto prefetch = [&](int p) {
        if (rg.jb + p < rg.je) {
            mx_bf16* Ws = reinterpret_cast<mx_bf16*>(llc_dyn + (p % ST) * STAGE);
            mx_bf16* Ks = Ws + CH * LDW;
            mx_bf16* Us = Ks + CH * LDW;
            float* gs = reinterpret_cast<float*>(Us + CH * LDU);
            const LlcSpan sp = llc_span(tab, has_tab, rg.jb + p, nc, Tn, CH);
            const int i0 = sp.i0, n = sp.n;
            const long long row0 = ((long long)b * Tn + i0) * H + h;
            ldt_copy_tile<CH, NT, DKW / 8, LDW>(Ws, W + row0 * Dk, (long long)H * Dk, Dk, n);
            ldt_copy_tile<CH, NT, DKW / 8, LDW>(Ks, k + row0 * Dk, (long long)H * Dk, Dk, n);
            ldt_copy_tile<CH, NT, VB / 8, LDU>(Us, U + row0 * Dv + v0, (long long)H * Dv, Dv - v0, n);
            ldt_copy_g<CH, NT>(gs, g, has_g, row0, H, n);
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
    for (int j = 0; j < ST - 1; ++j) prefetch(j);
    const int dg = v0 + dw + gi;  // this lane's value columns dg and dg + 8 in S
    float S[KT][4];  // Sᵀ: tile kk holds keys 8kk + 2t, 8kk + 2t + 1 (columns) of values g, g + 8
    ldt_state_in<KT>(S, S0, has_s0, row * DD, Dk, Dv, dg, tg);
    const bool hlo = dg < Dv, hhi = dg + 8 < Dv;
    float* hp = Hs + ((long long)bh * nc + rg.jb) * DD + 2 * tg * Dv + dg;  // chunk j's entering state, this lane's first entry
    const int dc = v0 + dw + 2 * tg;  // this lane's pairs of new values: columns dc, dc + 1 and dc + 8, dc + 9
    const bool vlo = dc < Dv, vhi = dc + 8 < Dv;
    const long long vstep = 8LL * H * Dv;  // eight tokens of Vn
    for (int p = 0; rg.jb + p < rg.je; ++p) {
        // As llc_delta_h_rg: chunk p's group is complete, the barrier frees chunk p − 1's buffer.
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2) : "memory");
        __syncthreads();
        prefetch(p + ST - 1);
        const unsigned char* base = llc_dyn + (p % ST) * STAGE;
        const unsigned wa = (unsigned)__cvta_generic_to_shared(base);
        const unsigned ka = wa + CH * LDW * 2, ua = ka + CH * LDW * 2;
        const float* gs = reinterpret_cast<const float*>(base + CH * (2 * LDW + LDU) * 2);
        const LlcSpan sp = llc_span(tab, has_tab, rg.jb + p, nc, Tn, CH);
        const int i0 = sp.i0, n = sp.n;
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
        for (int kq = 0; kq < KW32; ++kq)
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
    if (has_st) ldt_state_out<KT>(S, ST_, row * DD, Dk, Dv, dg, tg);
}
#if DH_BF16  // the bf16 mode's kernels are compiled in their own module (-DDH_BF16=1)
extern "C" __global__ void __launch_bounds__(32 * DHR_WARPS)
    llc_delta_h_rb_bf16(const mx_bf16* k, const float* g, int has_g, const mx_bf16* W, const mx_bf16* U,
                        mx_bf16* Vn, float* Hs, int Tn, int H, int Dk, int Dv, int nc, const float* S0, int has_s0,
                        float* ST, int has_st, const int* tab, int has_tab) {
    llc_delta_h_rb<DHR_DKP, DHR_WARPS, DHR_ST>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, S0, has_s0, ST, has_st,
                                               tab, has_tab);
}
#endif

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
// 64 × 64 product. Dynamic shared memory: Kt [64][68] | X [64][68] floats (LIFT_AB_SMEM in loglinear/state_pass.rs).
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
// banks. Dynamic shared memory: see lift_h_smem in loglinear/state_pass.rs.
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

#define LLP_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_delta_h_##S(const T* k, const T* g, int has_g, const T* W, const T* U, T* Vn, T* Hs, int Tn, int H,   \
                        int Dk, int Dv, int nc, int lifted, int E, long long slots, const T* S0, int has_s0,      \
                        T* ST, int has_st) {                                                                      \
        llc_delta_h<T>(k, g, has_g, W, U, Vn, Hs, Tn, H, Dk, Dv, nc, lifted, E, slots, S0, has_s0, ST, has_st);   \
    }

LLP_EXPORT(float, f32)
LLP_EXPORT(double, f64)
