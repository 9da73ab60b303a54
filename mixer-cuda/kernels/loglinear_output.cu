// The output step of the log-linear family's chunked form (docs/math.md §2.6), parallel over
// (chunk, batch·head, value tile), for every member: per chunk the intra-chunk quadratic part with
// the Fenwick levels inside the chunk, plus the read of the states the chunk sees.
// - llc_out (FMA) and llc_out_tc (tensor cores): the scalar-decay members, reading the tree of chunk
//   states (lifts) or the one state entering the chunk (direct = 1: without a lift, and gated
//   DeltaNet without a lift with v = U', the new values of the state pass);
// - llc_out_direct_tc: one state per chunk, Dk ≤ 128, tensor cores (f32, or bf16 as stored);
// - llc_out_dl (FMA) and llc_out_dl_tc: gated DeltaNet's lift, with the intra-chunk coefficients
//   P T⁻¹ diag(β) and the carried queries Q̃ = σ e^γ Q − P W.
// The states come from loglinear_ssd.cu (scalar decay) or loglinear_state_pass.cu (gated
// DeltaNet). Launched by loglinear/output.rs; chunks and helpers as in loglinear_common.cuh.

// 3. Outputs of chunk i, a tile of 64 value columns. Grid (NC, BH, ⌈Dv/64⌉), 256 threads.
// direct = 1 (gated DeltaNet, no lift): F holds the state entering each chunk, [BH][NC][Dk][Dv],
// read once with σ e^{γ_r} q_r; v is then the new values U' of the sequential pass.
template <typename T>
__device__ void llc_out(const T* q, const T* k, const T* v, const T* g, int has_g, const T* lam, const T* F, const double* A,
                        T* y, int Tn, int H, int Dk, int Dv, int L, int lifted, int direct, int nc, double scale,
                        const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = Llc<T>::CH, CB = Llc<T>::CBITS, RI = CH / 16;
    __shared__ double gam[CH], gtmp[CH];
    __shared__ T Xs[LLC_KT * LLC_LD], Ys[LLC_KT * LLC_LD];
    __shared__ T Pt[CH * (CH + 1)];  // Pt[s][r]
    __shared__ long long lev_ent[32];  // per present chunk level e: its tree entry (level e − 1),
    __shared__ double lev_d[32];       // its decay to the chunk start,
    __shared__ int lev_e[32];          // and e
    __shared__ int nlev_s;
    const LlcChunk c = llc_chunk<CH>(Tn, H);
    const LlcSpan sp = llc_span(tab, has_tab, c.i, nc, Tn, CH);  // a packed batch's chunk (no table: c's)
    const int i = c.i, bh = c.bh, d0 = blockIdx.z * LLC_NT, tid = c.tid, tx = c.tx, ty = c.ty, n = sp.n;
    const long long row0 = ((long long)c.b * Tn + sp.i0) * H + c.h;
    const long long DD = (long long)Dk * Dv;
    const T sc = (T)scale;
    if (tid == 0) nlev_s = llc_levels(i, sp.first, bh, nc, direct, A, lev_ent, lev_d, lev_e);
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    const int nlev = nlev_s;
    // Intra-chunk scores P[r][s] (r = ty + 16a, s = tx + 16b'), masked, decayed, weighted.
    {
        T acc[RI][RI] = {};
        llc_qk<T, CH>(acc, q, k, Xs, Ys, row0, H, Dk, n);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
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
__device__ void llc_out_tc(const float* q, const float* k, const float* v, const float* g, int has_g,
                           const float* lam, const float* F, const double* A, float* y, int Tn, int H, int Dk,
                           int Dv, int L, int lifted, int direct, int nc, double scale, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
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
    const LlcSpan sp = llc_span(tab, has_tab, i, nc, Tn, CH);  // a packed batch's chunk, or chunk i
    const int i0 = sp.i0, n = sp.n;
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const long long DD = (long long)Dk * Dv;
    const float sc = (float)scale;
    const bool vq = Dk % 4 == 0 && llc_al16(q) && llc_al16(k), vv = Dv % 4 == 0 && llc_al16(v),
               vf = Dv % 4 == 0 && llc_al16(F);
    if (tid == 0) {
        nlev_s = llc_levels(i, sp.first, bh, nc, direct, A, lev_ent, lev_d, lev_e);
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
                   int direct, int nc, double scale, const int* tab, int has_tab) {
    llc_out_tc(q, k, v, g, has_g, lam, F, A, y, Tn, H, Dk, Dv, L, lifted, direct, nc, scale, tab, has_tab);
}

// 3''. Pass 3 without a lift (direct = 1: F[bh·NC + i] is the state entering chunk i; chunk 0's
// is read only with read0, a run from a state, where it is H_0 = S_0ᵀ; with a chunk table
// (llc_span, a packed batch) the same holds of every sequence's first chunk) on tensor cores, for
// Dk ≤ KT (KT = 64 or 128 key columns): the four tiles a block needs — Q, K [64 tokens × KT key
// columns], V [64 tokens × 64 value columns] and the state H [KT key rows × 64 value columns]
// — are copied by cp.async all at once (Q and H first), so that one memory latency is exposed per
// block. Warp w owns rows r = 16w..16w+15 of the chunk:
//   y_r = σ e^{γ_r} q_r·H + Σ_{s ≤ r} σ e^{γ_r − γ_s} (q_r·k_s) v_s.
// The scores stay in registers and are P·V's A operand: inside each 8-key step the key order is
// permuted (A column t ↔ key 2t, column t + 4 ↔ key 2t + 1) and V's rows are read in that order.
// Key steps after the warp's last row are skipped. Columns ≥ Dk of Q and K, rows ≥ Dk of H, tokens
// ≥ n and value columns ≥ Dv are zero-filled by the copies. With HT the states are stored
// transposed ([Dv][Dk] per chunk: the backward's reversed run for d_v reads the chunk states of its
// run for d_k, which are the transposes of its own): H's tile is copied as K's is (rows = value
// columns) and its fragments read at the transposed index. Dk only sets the length of the loops
// over key columns, so KT changes the shared memory and not the registers.
// TI is the activations' type (q, k, v and y): f32 here (rounded to tf32 as operands); bf16 (the
// bf16 mode) in llc_out_direct_bf below. Shared tiles are unpadded and XOR-swizzled so that every
// fragment load hits distinct banks: f32 Q, K (r, c) at r·KT + (c ⊕ 4(r mod 8)), V (s, d) at
// s·64 + (d ⊕ 8(⌊s/2⌋ mod 4)), the f32 state (c, d) at c·64 + (d ⊕ 8(c mod 4)); bf16 Q, K, V and
// state: the 8-element (16-byte) group ⌊c/8⌋ ⊕ (r mod 8) in rows of KT (Q, K) or 64 (V, state)
// elements, so that the eight rows an ldmatrix reads fall in distinct banks.
// Grid (NC, BH, ⌈Dv/64⌉), 128 threads, dynamic shared memory lld_smem<TI, KT>() bytes.
template <typename TI, int KT>
__device__ constexpr int lld_smem() { return (3 * KT + 64) * 64 * (int)sizeof(TI); }
// Swizzled offsets: of Q and K (qk = true, rows of KT) or V (rows of 64) in a TI tile, and of the
// f32 state.
template <typename TI, int KT>
__device__ __forceinline__ int lld_at(int r, int c, bool qk) {
    const int ld = qk ? KT : 64;
    if (sizeof(TI) == 2) return r * ld + ((((c >> 3) ^ (r & 7)) << 3) | (c & 7));
    return qk ? r * ld + (c ^ ((r & 7) << 2)) : r * ld + (c ^ (((r >> 1) & 3) << 3));
}
__device__ __forceinline__ int lld_h(int c, int d) { return c * 64 + (d ^ ((c & 3) << 3)); }
// Scales the accumulator rows r0 and r0 + 8 of a warp's 64 columns (o[dt][0..1] and o[dt][2..3])
// by σ e^{γ_r}, and rows at or past n to zero: the read of the entering state, q_r·H, becomes
// σ e^{γ_r} q_r·H.
__device__ __forceinline__ void lld_scale_rows(float (&o)[8][4], const double* gam, int r0, int n, float sc) {
    const int r1 = r0 + 8;
    const float f0 = r0 < n ? sc * __expf((float)gam[r0]) : 0.f, f1 = r1 < n ? sc * __expf((float)gam[r1]) : 0.f;
#pragma unroll
    for (int dt = 0; dt < 8; ++dt) o[dt][0] *= f0, o[dt][1] *= f0, o[dt][2] *= f1, o[dt][3] *= f1;
}
template <typename TI, int KT, bool HT = false>
__device__ void llc_out_direct_tc(const TI* q, const TI* k, const TI* v, const float* g, int has_g, const float* F,
                                  TI* y, int Tn, int H, int Dk, int Dv, int nc, double scale, int read0, const int* tab,
                                  int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64, E = 16 / sizeof(TI);
    __shared__ double gam[CH], gtmp[CH];
    extern __shared__ __align__(16) unsigned char lld_dyn[];
    float* Hs = reinterpret_cast<float*>(lld_dyn);
    TI* Qs = reinterpret_cast<TI*>(Hs + KT * 64);
    TI* Ks = Qs + 64 * KT;
    TI* Vs = Ks + 64 * KT;
    const int i = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H, d0 = blockIdx.z * 64;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    const LlcSpan ck = llc_span(tab, has_tab, i, nc, Tn, CH);
    const int i0 = ck.i0, n = ck.n, nd = min(64, Dv - d0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const float sc = (float)scale;
    const bool vq = Dk % E == 0 && llc_al16(q) && llc_al16(k), vv = Dv % E == 0 && llc_al16(v),
               vf = (HT ? Dk : Dv) % 4 == 0 && llc_al16(F);
    const int DK8 = (Dk + 7) / 8;
    auto atqk = [](int r, int c) { return lld_at<TI, KT>(r, c, true); };
    auto atv = [](int r, int c) { return lld_at<TI, KT>(r, c, false); };
    // The state's entry (c, d) (key column c, value column d of the tile): H[c][d0 + d], or with HT
    // (the state stored transposed, [Dv][Dk]) H[d0 + d][c], staged as K is (rows d).
    auto ath = [](int c, int d) { return HT ? lld_at<float, KT>(d, c, true) : lld_h(c, d); };
    // Group 1: Q and the entering state (none for a first chunk unless read0: a run from a state);
    // group 2: K and V.
    const bool state = !ck.first || read0;
    lld_tile<64, KT>(Qs, q + row0 * Dk, (long long)H * Dk, n, Dk, vq, atqk);
    if (state) {
        const float* Fc = F + ((long long)bh * nc + i) * Dk * Dv;
        if (HT)
            lld_tile<64, KT>(Hs, Fc + (long long)d0 * Dk, Dk, nd, Dk, vf, atqk);
        else
            lld_tile<KT, 64>(Hs, Fc + d0, Dv, Dk, nd, vf, lld_h);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    lld_tile<64, KT>(Ks, k + row0 * Dk, (long long)H * Dk, n, Dk, vq, atqk);
    lld_tile<64, 64>(Vs, v + row0 * Dv + d0, (long long)H * Dv, n, nd, vv, atv);
    asm volatile("cp.async.commit_group;\n" ::);
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);  // ends with a barrier
    const int r0 = w * 16 + gi, r1 = r0 + 8;
    float o[8][4] = {};
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads();
    if (state) {
        // o = (Q H) scaled by σ e^{γ_r} per row.
        for (int k8 = 0; k8 < DK8; ++k8) {
            const int c = k8 * 8 + tg;
            const unsigned a0 = mx_tf32(Qs[atqk(r0, c)]), a1 = mx_tf32(Qs[atqk(r1, c)]), a2 = mx_tf32(Qs[atqk(r0, c + 4)]),
                           a3 = mx_tf32(Qs[atqk(r1, c + 4)]);
#pragma unroll
            for (int dt = 0; dt < 8; ++dt)
                mx_mma_tf32(o[dt], a0, a1, a2, a3, mx_tf32(Hs[ath(c, dt * 8 + gi)]),
                            mx_tf32(Hs[ath(c + 4, dt * 8 + gi)]));
        }
        lld_scale_rows(o, gam, r0, n, sc);
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    // Scores of the warp's rows against keys 0..16w+15 (n-tiles nt ≤ 2w + 1).
    float s[8][4] = {};
    for (int k8 = 0; k8 < DK8; ++k8) {
        const int c = k8 * 8 + tg;
        const unsigned a0 = mx_tf32(Qs[atqk(r0, c)]), a1 = mx_tf32(Qs[atqk(r1, c)]), a2 = mx_tf32(Qs[atqk(r0, c + 4)]),
                       a3 = mx_tf32(Qs[atqk(r1, c + 4)]);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
            if (nt <= 2 * w + 1)
                mx_mma_tf32(s[nt], a0, a1, a2, a3, mx_tf32(Ks[atqk(nt * 8 + gi, c)]), mx_tf32(Ks[atqk(nt * 8 + gi, c + 4)]));
    }
    // P = σ e^{γ_r − γ_s} S on s ≤ r < n, 0 elsewhere; then o += P V with the permuted key order.
    const double g0 = gam[min(r0, CH - 1)], g1 = gam[min(r1, CH - 1)];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
        if (nt > 2 * w + 1) continue;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = u < 2 ? r0 : r1, ss = nt * 8 + 2 * tg + (u & 1);
            s[nt][u] = (ss <= r && r < n) ? sc * s[nt][u] * __expf((float)((u < 2 ? g0 : g1) - gam[ss])) : 0.f;
        }
        const unsigned a0 = mx_tf32(s[nt][0]), a1 = mx_tf32(s[nt][2]), a2 = mx_tf32(s[nt][1]), a3 = mx_tf32(s[nt][3]);
        const int k0 = nt * 8 + 2 * tg;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt)
            mx_mma_tf32(o[dt], a0, a1, a2, a3, mx_tf32(Vs[atv(k0, dt * 8 + gi)]), mx_tf32(Vs[atv(k0 + 1, dt * 8 + gi)]));
    }
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = u < 2 ? r0 : r1, d = dt * 8 + 2 * tg + (u & 1);
            if (r < n && d < nd) y[(row0 + (long long)r * H) * Dv + d0 + d] = o[dt][u];
        }
}

// 3'''. llc_out_direct_tc's bf16 form (the bf16 mode: q, k, v and y bf16), the same outputs with
// every product on m16n8k16 bf16 tensor cores (f32 accumulation) and every operand read by
// ldmatrix from the swizzled tiles: Q and K as stored, V and the state transposed. The entering
// state is bf16 in global memory (TS = mx_bf16: copied by cp.async with Q) or f32 (rounded to
// bf16 as it is staged, through registers, while Q, K and V are in flight by cp.async): the same
// operand either way, since llc_scan_hb and llc_walk_tc_hb round as the staging does. The scores
// P, rounded to bf16, are P·V's A operand straight from their accumulators (keys 16j .. 16j + 15
// are the n-tiles 2j and 2j + 1). Key steps after the warp's last row are skipped. Rounding the
// state and P to bf16 instead of tf32 is within the mode's tolerance (docs/design.md, precision
// modes). Dynamic shared memory lld_smem<mx_bf16, KT>().
template <int KT, typename TS>
__device__ void llc_out_direct_bf(const mx_bf16* q, const mx_bf16* k, const mx_bf16* v, const float* g, int has_g,
                                  const TS* F, mx_bf16* y, int Tn, int H, int Dk, int Dv, int nc, double scale,
                                  int read0, const int* tab, int has_tab) {
    LLC_FIX_DIMS(Dk, Dv);
    constexpr int CH = 64;
    __shared__ double gam[CH], gtmp[CH];
    extern __shared__ __align__(16) unsigned char lld_dyn[];
    mx_bf16* Hs = reinterpret_cast<mx_bf16*>(lld_dyn);
    mx_bf16* Qs = Hs + KT * 64;
    mx_bf16* Ks = Qs + 64 * KT;
    mx_bf16* Vs = Ks + 64 * KT;
    const int i = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H, d0 = blockIdx.z * 64;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, gi = lane >> 2, tg = lane & 3;
    // The row and the matrix this lane addresses in an ldmatrix x4.
    const int lr = lane & 7, lm = lane >> 3;
    const LlcSpan ck = llc_span(tab, has_tab, i, nc, Tn, CH);
    const int i0 = ck.i0, n = ck.n, nd = min(64, Dv - d0);
    const long long row0 = ((long long)b * Tn + i0) * H + h;
    const float sc = (float)scale;
    const bool vq = Dk % 8 == 0 && llc_al16(q) && llc_al16(k), vv = Dv % 8 == 0 && llc_al16(v),
               vf = Dv % (16 / (int)sizeof(TS)) == 0 && llc_al16(F);
    auto atqk = [](int r, int c) { return lld_at<mx_bf16, KT>(r, c, true); };
    auto atv = [](int r, int c) { return lld_at<mx_bf16, KT>(r, c, false); };
    const bool state = !ck.first || read0;
    const TS* Fc = F + ((long long)bh * nc + i) * Dk * Dv + d0;
    lld_tile<64, KT>(Qs, q + row0 * Dk, (long long)H * Dk, n, Dk, vq, atqk);
    // A bf16 state (llc_scan_hb, llc_walk_tc_hb) is copied with Q: the state's rows c < KT (zero at
    // c ≥ Dk), value columns d0 .. d0 + 63 (zero past Dv), laid out as V.
    if constexpr (sizeof(TS) == 2)
        if (state) lld_tile<KT, 64>(Hs, Fc, Dv, Dk, nd, vf, atv);
    asm volatile("cp.async.commit_group;\n" ::);
    lld_tile<64, KT>(Ks, k + row0 * Dk, (long long)H * Dk, n, Dk, vq, atqk);
    lld_tile<64, 64>(Vs, v + row0 * Dv + d0, (long long)H * Dv, n, nd, vv, atv);
    asm volatile("cp.async.commit_group;\n" ::);
    if (sizeof(TS) == 4 && state) {
        // The state's rows c < KT (zero at c ≥ Dk), value columns d0 .. d0 + 63 (zero past Dv),
        // four at a time: H (c, d) = F[c][d0 + d].
        for (int idx = tid; idx < KT * 16; idx += 128) {
            const int c = idx >> 4, d = (idx & 15) * 4;
            float4 x = {0.f, 0.f, 0.f, 0.f};
            if (c < Dk && d < nd) {
                const float* src = reinterpret_cast<const float*>(Fc) + (long long)c * Dv + d;
                if (vf)
                    x = *reinterpret_cast<const float4*>(src);
                else
                    x = {src[0], d + 1 < nd ? src[1] : 0.f, d + 2 < nd ? src[2] : 0.f, d + 3 < nd ? src[3] : 0.f};
            }
            *reinterpret_cast<uint2*>(Hs + atv(c, d)) = make_uint2(mx_pack_bf16(x.x, x.y), mx_pack_bf16(x.z, x.w));
        }
    }
    llc_gamma<float, CH>(gam, gtmp, g, has_g, row0, H, n);  // ends with a barrier
    const int r0 = w * 16 + gi, r1 = r0 + 8, DK16 = (Dk + 15) / 16;
    // The A fragment of the warp's 16 rows of Q at key columns 16kk .. 16kk + 15.
    auto qfrag = [&](unsigned (&a)[4], int kk) {
        mx_ldsm_x4(a, smem_u32(Qs + atqk(w * 16 + lr + 8 * (lm & 1), kk * 16 + 8 * (lm >> 1))));
    };
    // c[2j], c[2j + 1] += a · B over the rows 16kk .. 16kk + 15 of a row-major tile X (V or the
    // state) and its columns 16j .. 16j + 15, j < 4: the B fragments by ldmatrix.trans.
    auto times_rows = [&](float (&c)[8][4], const unsigned (&a)[4], const mx_bf16* X, int kk) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            unsigned bb[4];
            mx_ldsm_x4_t(bb, smem_u32(X + atv(kk * 16 + lr + 8 * (lm & 1), j * 16 + 8 * (lm >> 1))));
            mx_mma_bf16(c[2 * j], a[0], a[1], a[2], a[3], bb[0], bb[1]);
            mx_mma_bf16(c[2 * j + 1], a[0], a[1], a[2], a[3], bb[2], bb[3]);
        }
    };
    float o[8][4] = {};
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    __syncthreads();
    if (state) {
        // o = (Q H) scaled by σ e^{γ_r} per row.
        for (int kk = 0; kk < DK16; ++kk) {
            unsigned a[4];
            qfrag(a, kk);
            times_rows(o, a, Hs, kk);
        }
        lld_scale_rows(o, gam, r0, n, sc);
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
    // Scores of the warp's rows against keys 0 .. 16w + 15 (key blocks j ≤ w): the B fragments
    // of K's rows 16j .. 16j + 15 as stored (ldmatrix matrices: rows +0/+8 by lm / 2, columns
    // +0/+8 by lm mod 2).
    float s[8][4] = {};
    for (int kk = 0; kk < DK16; ++kk) {
        unsigned a[4];
        qfrag(a, kk);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j > w) continue;
            unsigned bb[4];
            mx_ldsm_x4(bb, smem_u32(Ks + atqk(j * 16 + lr + 8 * (lm >> 1), kk * 16 + 8 * (lm & 1))));
            mx_mma_bf16(s[2 * j], a[0], a[1], a[2], a[3], bb[0], bb[1]);
            mx_mma_bf16(s[2 * j + 1], a[0], a[1], a[2], a[3], bb[2], bb[3]);
        }
    }
    // P = σ e^{γ_r − γ_s} S on s ≤ r < n, 0 elsewhere; then o += P V, key block by key block.
    const double g0 = gam[min(r0, CH - 1)], g1 = gam[min(r1, CH - 1)];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (j > w) continue;
#pragma unroll
        for (int nt = 2 * j; nt < 2 * j + 2; ++nt)
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = u < 2 ? r0 : r1, ss = nt * 8 + 2 * tg + (u & 1);
                s[nt][u] = (ss <= r && r < n) ? sc * s[nt][u] * __expf((float)((u < 2 ? g0 : g1) - gam[ss])) : 0.f;
            }
        const unsigned a[4] = {mx_pack_bf16(s[2 * j][0], s[2 * j][1]), mx_pack_bf16(s[2 * j][2], s[2 * j][3]),
                               mx_pack_bf16(s[2 * j + 1][0], s[2 * j + 1][1]),
                               mx_pack_bf16(s[2 * j + 1][2], s[2 * j + 1][3])};
        times_rows(o, a, Vs, j);
    }
    // y, two columns at a time where both are inside Dv and the pair is 4-byte aligned.
    const bool pairs = Dv % 2 == 0 && llc_al16(y);
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = half ? r1 : r0, d = dt * 8 + 2 * tg;
            if (r >= n || d >= nd) continue;
            mx_bf16* dst = y + (row0 + (long long)r * H) * Dv + d0 + d;
            const float lo = o[dt][2 * half], hi = o[dt][2 * half + 1];
            if (pairs) {
                *reinterpret_cast<unsigned*>(dst) = mx_pack_bf16(lo, hi);
            } else {
                dst[0] = mx_f32_bf16(lo);
                if (d + 1 < nd) dst[1] = mx_f32_bf16(hi);
            }
        }
}

// llc_out_direct_tc_f32 (Dk ≤ 64) and llc_out_direct_tc_f32_k128 (Dk ≤ 128), with _ht the states
// transposed (HT); the bf16 mode's
// llc_out_direct_tc_bf16 and llc_out_direct_tc_bf16_k128 (f32 states: gated DeltaNet's pass, and
// the runs of the backward, which keeps them), llc_out_direct_tc_hb and llc_out_direct_tc_hb_k128
// (the states in bf16: llc_scan_hb, llc_walk_tc_hb).
#define LLD_EXPORT(NAME, TI, TS, BODY)                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                        \
        NAME(const TI* q, const TI* k, const TI* v, const float* g, int has_g, const TS* F, TI* y, int Tn,   \
             int H, int Dk, int Dv, int nc, double scale, int read0, const int* tab, int has_tab) {           \
        BODY(q, k, v, g, has_g, F, y, Tn, H, Dk, Dv, nc, scale, read0, tab, has_tab);                        \
    }
LLD_EXPORT(llc_out_direct_tc_f32, float, float, (llc_out_direct_tc<float, 64>))
LLD_EXPORT(llc_out_direct_tc_f32_k128, float, float, (llc_out_direct_tc<float, 128>))
LLD_EXPORT(llc_out_direct_tc_f32_ht, float, float, (llc_out_direct_tc<float, 64, true>))
LLD_EXPORT(llc_out_direct_tc_f32_ht_k128, float, float, (llc_out_direct_tc<float, 128, true>))
LLD_EXPORT(llc_out_direct_tc_bf16, mx_bf16, float, (llc_out_direct_bf<64, float>))
LLD_EXPORT(llc_out_direct_tc_bf16_k128, mx_bf16, float, (llc_out_direct_bf<128, float>))
LLD_EXPORT(llc_out_direct_tc_hb, mx_bf16, mx_bf16, (llc_out_direct_bf<64, mx_bf16>))
LLD_EXPORT(llc_out_direct_tc_hb_k128, mx_bf16, mx_bf16, (llc_out_direct_bf<128, mx_bf16>))

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
    const LlcChunk c = llc_chunk<CH>(Tn, H);
    const int i = c.i, bh = c.bh, d0 = blockIdx.z * LLC_NT, tid = c.tid, tx = c.tx, ty = c.ty, n = c.n;
    const long long row0 = c.row0;
    const long long DD = (long long)Dk * Dv;
    const T sc = (T)scale;
    if (tid < CH) bet[tid] = tid < n ? beta[row0 + (long long)tid * H] : (T)0;
    llc_gamma<T, CH>(gam, gtmp, g, has_g, row0, H, n);
    {
        T acc[RI][RI] = {};
        llc_qk<T, CH>(acc, q, k, Xs, Ys, row0, H, Dk, n);
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
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
        LLC_TILE_EACH(RI, RI, a, bb, r, s, 0, 0) {
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
        LLC_TILE_EACH(RI, 4, a, jj, r, cc, 0, 0) {
            const int c = c0 + cc;
            Qt[cc * LDC + r] =
                (r < n && c < Dk) ? sc * mx_exp((T)gam[r]) * q[(row0 + (long long)r * H) * Dk + c] - qa[a][jj] : (T)0;
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

#define LLO_EXPORT(T, S)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_out_##S(const T* q, const T* k, const T* v, const T* g, int has_g, const T* lam, const T* F,          \
                    const double* A, T* y, int Tn, int H, int Dk, int Dv, int L, int lifted, int direct, int nc,  \
                    double scale, const int* tab, int has_tab) {                                                  \
        llc_out<T>(q, k, v, g, has_g, lam, F, A, y, Tn, H, Dk, Dv, L, lifted, direct, nc, scale, tab, has_tab);   \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        llc_out_dl_##S(const T* q, const T* k, const T* v, const T* g, int has_g, const T* beta, const T* lam,      \
                       const T* W, const T* Ti, const T* Hs, T* y, int Tn, int H, int Dk, int Dv, int L, int nc,  \
                       long long slots, double scale) {                                                           \
        llc_out_dl<T>(q, k, v, g, has_g, beta, lam, W, Ti, Hs, y, Tn, H, Dk, Dv, L, nc, slots, scale);           \
    }

LLO_EXPORT(float, f32)
LLO_EXPORT(double, f64)
