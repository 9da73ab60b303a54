// The backward pass of softmax attention on tensor cores (the tf32 and bf16 modes), FlashAttention-2
// style, for NVRTC, no headers. The forward (attention_fused.cu, launched with a stats buffer) has
// left per row t
//
//   m_t = max_s λ u_{t,s},  g_t = log₂ Σ_s 2^{λ u_{t,s} − m_t}   (u = q·k, λ = scale·log₂e ≥ 0),
//
// so that P_{t,s} = 2^{λ u_{t,s} − m_t − g_t} on the visible keys (s ≤ t, t − s < window; window ≤ 0:
// full causal), 0 elsewhere. Then, with D_t = dy_t · y_t (atc_delta),
//
//   dS_{t,s} = P_{t,s} (dy_t · v_s − D_t),  dv_s = Σ_t P_{t,s} dy_t,  dk_s = σ Σ_t dS_{t,s} q_t,
//   dq_t = σ Σ_s dS_{t,s} k_s,
//
// in three launches, none with atomics (every output element is summed by one thread, in a fixed
// order): atc_delta (one warp per row), atc_dkdv (one block per key tile of ATC_BM keys, looping over
// the query tiles of ATC_BN queries that see it) and atc_dq (one block per query tile of ATC_BM
// queries, looping over the key tiles of ATC_BN keys it sees). A warp owns 16 rows of its block's
// tile (keys in atc_dkdv, queries in atc_dq) and computes with mma.sync, f32 accumulation:
//
//   atc_dkdv:  Sᵀ = K Qᵀ, dPᵀ = V dYᵀ (16 × ATC_BN per warp), Pᵀ and dSᵀ elementwise, then
//              dV += Pᵀ dY and dK += dSᵀ Q with Pᵀ, dSᵀ re-packed from the accumulators as A operands;
//   atc_dq:    S = Q Kᵀ, dP = dY Vᵀ, P and dS elementwise, dQ += dS K.
//
// The column tiles (Q and dY with the rows' statistics in atc_dkdv, K and V in atc_dq) stream through
// shared memory with cp.async, two stages, one barrier per tile. Tiles wholly outside the causal
// window are skipped; masks are evaluated only on tiles that cross a boundary. Exponents are
// clamped at 0 before subtracting g_t (λu − m may round above 0 where the forward's product of the
// same pair rounded differently), so that P ≤ 1 even for logits near the f32 range.
//
// Three precisions (one template, AtcBf16 / AtcTf32 / AtcTf32x3):
//  * bf16: q, k, v, dy bf16; mma m16n8k16; ldmatrix (.trans for operands read along their rows'
//    token axis) from XOR-swizzled 16-byte chunks; P and dS rounded to bf16 as A operands.
//  * tf32: q, k, v, dy f32; mma m16n8k8, every operand rounded to tf32 (cvt.rna); padded rows of
//    ATC_D + 8 floats. The reduction index inside an 8-step is permuted (A column i ↔ 2i, i + 4 ↔
//    2i + 1) in every operand alike, so the accumulators of one product are the A operand of the
//    next without shuffles.
//  * tf32x3 (the exact mode on f32): tf32's layout and loads, every operand split as hi + lo
//    (tf32_split: hi = x rounded to tf32, lo = the rest rounded to tf32) and every product run as
//    three tf32 products a_lo·b_hi + a_hi·b_lo + a_hi·b_hi, which keeps f32 accuracy. The forward
//    (attn_mma_tf32x3) sets the flag stats[4·B·H·T] where some block's q·k is not finite in f32;
//    atc_dkdv and atc_dq then write nothing (skip), and the FMA backward (attention_backward.cu),
//    launched after them with the same flag, computes the gradients with keys in double.
// Gradients are f32 in all.
//
// Layouts: q, k, v, dy [B,T,H,D] (token stride H·D); stats [B·H·T][4] (m, g, D, unused); dq, dk, dv
// f32 [B,T,H,D]. Compile-time: ATC_D (32, 64, 96 or 128), ATC_WARPS (warps per block; ATC_BM = 16
// rows each), ATC_BN (columns per streamed tile, a multiple of 16).

#ifndef ATC_D
#define ATC_D 64
#endif
#ifndef ATC_WARPS
#define ATC_WARPS 8
#endif
#ifndef ATC_BN
#define ATC_BN 64
#endif
#define ATC_BM (16 * ATC_WARPS)
#define ATC_THREADS (32 * ATC_WARPS)
#define ATC_NT (ATC_BN / 8)  // n8 tiles of a score tile
#define ATC_DT (ATC_D / 8)   // n8 tiles of a gradient row block
#define ATC_STAGE (ATC_BN * P::ELEMS)  // elements of one stage of a streamed tile

// One m16n8 product c += a·b, non-volatile (the compiler schedules it as data flow allows).
#define ATC_MMA(SHAPE, c, a, b0, b1) MX_MMA_SYNC(asm, SHAPE, c, a[0], a[1], a[2], a[3], b0, b1)

// --- operands --------------------------------------------------------------------------------
// Each precision gives, for tiles X of rows × ATC_D in shared memory (rows: tokens):
//   load(sm, src, r0, n, T, tok): rows r0 .. r0 + n of a [T, ·] head (token stride tok), zeros past T;
//   FA, FB: an A fragment and a pair of n8 B fragments as the products take them;
//   a_rows(a, X, r0, k0): the A fragment A[i][k] = X[r0 + i][k0 + k] (16 × KS);
//   b_rows(b, X, n0, k0): two n8 B fragments B[k][n] = X[n0 + n][k0 + k] (KS × 16);
//   b_cols(b, X, k0, n0): two n8 B fragments B[k][n] = X[k0 + k][n0 + n] (KS × 16);
//   a_acc(a, c, kk): the A fragment of columns [KS·kk, KS·kk + KS) of accumulators c (16 × ATC_BN);
//   mma(c, a, b, j): c += A · (n8 fragment j of b).

struct AtcBf16 {
    typedef mx_bf16 E;
    typedef unsigned FA[4];
    typedef unsigned FB[4];
    static constexpr int KS = 16;
    static constexpr int CH = ATC_D / 8;  // 16-byte chunks per row
    // chunk ^ (row & mask) stays inside the chunk's aligned group of 8 (D = 64, 128) or 4 (32, 96).
    static constexpr int MASK = CH % 8 == 0 ? 7 : 3;
    static constexpr int ELEMS = ATC_D;  // elements per row in shared memory
    __device__ static unsigned at(const E* X, int row, int chunk) {
        return smem_u32(X) + (row * CH + (chunk ^ (row & MASK))) * 16;
    }
    __device__ static void load(E* sm, const E* src, int r0, int n, int T, long long tok) {
        for (int i = threadIdx.x; i < n * CH; i += ATC_THREADS) {
            const int row = i / CH, ch = i % CH, r = r0 + row;
            const bool in = r < T;
            cp_async16(at(sm, row, ch), src + (long long)(in ? r : 0) * tok + ch * 8, in ? 16 : 0);
        }
    }
    __device__ static void a_rows(unsigned (&a)[4], const E* X, int r0, int k0) {
        const int lane = threadIdx.x & 31;
        mx_ldsm_x4(a, at(X, r0 + (lane & 15), k0 / 8 + (lane >> 4)));
    }
    __device__ static void b_rows(unsigned (&b)[4], const E* X, int n0, int k0) {
        const int lane = threadIdx.x & 31;
        mx_ldsm_x4(b, at(X, n0 + (lane & 7) + ((lane >> 4) << 3), k0 / 8 + ((lane >> 3) & 1)));
    }
    __device__ static void b_cols(unsigned (&b)[4], const E* X, int k0, int n0) {
        const int lane = threadIdx.x & 31;
        mx_ldsm_x4_t(b, at(X, k0 + (lane & 15), n0 / 8 + (lane >> 4)));
    }
    __device__ static void a_acc(unsigned (&a)[4], const float (&c)[ATC_NT][4], int kk) {
        a[0] = mx_pack_bf16(c[2 * kk][0], c[2 * kk][1]);
        a[1] = mx_pack_bf16(c[2 * kk][2], c[2 * kk][3]);
        a[2] = mx_pack_bf16(c[2 * kk + 1][0], c[2 * kk + 1][1]);
        a[3] = mx_pack_bf16(c[2 * kk + 1][2], c[2 * kk + 1][3]);
    }
    __device__ static void mma(float (&c)[4], const FA& a, const FB& b, int j) {
        ATC_MMA("m16n8k16.row.col.f32.bf16.bf16.f32", c, a, b[2 * j], b[2 * j + 1]);
    }
};

struct AtcTf32 {
    typedef float E;
    typedef unsigned FA[4];
    typedef unsigned FB[4];
    static constexpr int KS = 8;
    // Row stride: float2 reads of 8 rows × 4 lanes fall in 32 distinct banks.
    static constexpr int ELEMS = ATC_D + 8;
    __device__ static void load(E* sm, const E* src, int r0, int n, int T, long long tok) {
        const unsigned base = smem_u32(sm);
        for (int i = threadIdx.x; i < n * (ATC_D / 4); i += ATC_THREADS) {
            const int row = i / (ATC_D / 4), ch = i % (ATC_D / 4), r = r0 + row;
            const bool in = r < T;
            cp_async16(base + (row * ELEMS + ch * 4) * 4, src + (long long)(in ? r : 0) * tok + ch * 4, in ? 16 : 0);
        }
    }
    // (X[r][c], X[r][c + 1]) rounded to tf32.
    __device__ static void pair(unsigned& x, unsigned& y, const E* X, int r, int c) {
        const float2 v = *reinterpret_cast<const float2*>(X + r * ELEMS + c);
        x = mx_tf32(v.x);
        y = mx_tf32(v.y);
    }
    __device__ static void a_rows(unsigned (&a)[4], const E* X, int r0, int k0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        pair(a[0], a[2], X, r0 + g, k0 + 2 * i);
        pair(a[1], a[3], X, r0 + g + 8, k0 + 2 * i);
    }
    __device__ static void b_rows(unsigned (&b)[4], const E* X, int n0, int k0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        pair(b[0], b[1], X, n0 + g, k0 + 2 * i);
        pair(b[2], b[3], X, n0 + 8 + g, k0 + 2 * i);
    }
    __device__ static void b_cols(unsigned (&b)[4], const E* X, int k0, int n0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        const E* x = X + (k0 + 2 * i) * ELEMS + n0 + g;
        b[0] = mx_tf32(x[0]);
        b[1] = mx_tf32(x[ELEMS]);
        b[2] = mx_tf32(x[8]);
        b[3] = mx_tf32(x[ELEMS + 8]);
    }
    __device__ static void a_acc(unsigned (&a)[4], const float (&c)[ATC_NT][4], int kk) {
        a[0] = mx_tf32(c[kk][0]);
        a[1] = mx_tf32(c[kk][2]);
        a[2] = mx_tf32(c[kk][1]);
        a[3] = mx_tf32(c[kk][3]);
    }
    __device__ static void mma(float (&c)[4], const FA& a, const FB& b, int j) {
        ATC_MMA("m16n8k8.row.col.f32.tf32.tf32.f32", c, a, b[2 * j], b[2 * j + 1]);
    }
};

// hi + lo = x to about 2⁻²² relative: hi = x rounded to tf32, lo = the rest (exact in f32) rounded
// to tf32.
__device__ __forceinline__ void tf32_split(float x, unsigned& hi, unsigned& lo) {
    hi = mx_tf32(x);
    lo = mx_tf32(x - __uint_as_float(hi));
}

// tf32's layout and loads; fragments of hi and lo parts, each product three tf32 products.
struct AtcTf32x3 : AtcTf32 {
    struct FA {
        unsigned h[4], l[4];
    };
    typedef FA FB;
    __device__ static void pair(FA& f, int i0, int i1, const E* X, int r, int c) {
        const float2 v = *reinterpret_cast<const float2*>(X + r * ELEMS + c);
        tf32_split(v.x, f.h[i0], f.l[i0]);
        tf32_split(v.y, f.h[i1], f.l[i1]);
    }
    __device__ static void a_rows(FA& a, const E* X, int r0, int k0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        pair(a, 0, 2, X, r0 + g, k0 + 2 * i);
        pair(a, 1, 3, X, r0 + g + 8, k0 + 2 * i);
    }
    __device__ static void b_rows(FB& b, const E* X, int n0, int k0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        pair(b, 0, 1, X, n0 + g, k0 + 2 * i);
        pair(b, 2, 3, X, n0 + 8 + g, k0 + 2 * i);
    }
    __device__ static void b_cols(FB& b, const E* X, int k0, int n0) {
        const int lane = threadIdx.x & 31, g = lane >> 2, i = lane & 3;
        const E* x = X + (k0 + 2 * i) * ELEMS + n0 + g;
        tf32_split(x[0], b.h[0], b.l[0]);
        tf32_split(x[ELEMS], b.h[1], b.l[1]);
        tf32_split(x[8], b.h[2], b.l[2]);
        tf32_split(x[ELEMS + 8], b.h[3], b.l[3]);
    }
    __device__ static void a_acc(FA& a, const float (&c)[ATC_NT][4], int kk) {
        tf32_split(c[kk][0], a.h[0], a.l[0]);
        tf32_split(c[kk][2], a.h[1], a.l[1]);
        tf32_split(c[kk][1], a.h[2], a.l[2]);
        tf32_split(c[kk][3], a.h[3], a.l[3]);
    }
    // Small terms first.
    __device__ static void mma(float (&c)[4], const FA& a, const FB& b, int j) {
        ATC_MMA("m16n8k8.row.col.f32.tf32.tf32.f32", c, a.l, b.h[2 * j], b.h[2 * j + 1]);
        ATC_MMA("m16n8k8.row.col.f32.tf32.tf32.f32", c, a.h, b.l[2 * j], b.l[2 * j + 1]);
        ATC_MMA("m16n8k8.row.col.f32.tf32.tf32.f32", c, a.h, b.h[2 * j], b.h[2 * j + 1]);
    }
};

// --- the products ----------------------------------------------------------------------------

// c = X[r0 .. r0 + 16) · Y[0 .. ATC_BN)ᵀ over the head dim (16 × ATC_BN, c zeroed first).
template <class P>
__device__ __forceinline__ void atc_scores(float (&c)[ATC_NT][4], const typename P::E* X, int r0,
                                           const typename P::E* Y) {
#pragma unroll
    for (int n = 0; n < ATC_NT; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < ATC_D; k0 += P::KS) {
        typename P::FA a;
        P::a_rows(a, X, r0, k0);
#pragma unroll
        for (int n = 0; n < ATC_NT / 2; ++n) {
            typename P::FB b;
            P::b_rows(b, Y, 16 * n, k0);
            P::mma(c[2 * n], a, b, 0);
            P::mma(c[2 * n + 1], a, b, 1);
        }
    }
}

// acc += c · Y[0 .. ATC_BN) (16 × ATC_D): c the accumulators of a score tile, Y a column tile.
template <class P>
__device__ __forceinline__ void atc_accumulate(float (&acc)[ATC_DT][4], const float (&c)[ATC_NT][4],
                                               const typename P::E* Y) {
#pragma unroll
    for (int kk = 0; kk < ATC_BN / P::KS; ++kk) {
        typename P::FA a;
        P::a_acc(a, c, kk);
#pragma unroll
        for (int n = 0; n < ATC_DT / 2; ++n) {
            typename P::FB b;
            P::b_cols(b, Y, kk * P::KS, 16 * n);
            P::mma(acc[2 * n], a, b, 0);
            P::mma(acc[2 * n + 1], a, b, 1);
        }
    }
}

// One step of a loop over streamed column tiles: waits for the current tile's copies (the only group
// in flight), a barrier (every warp is done with the other stage), issues the next tile's copies into
// the other stage (load, where more) as one group, then the warp's score tile s = X1 Y1ᵀ and
// dP tile dp = X2 Y2ᵀ (rows r0 .. r0 + 16 of X1, X2; Y1, Y2 the current stage).
template <class P, typename Load>
__device__ __forceinline__ void atc_step(float (&s)[ATC_NT][4], float (&dp)[ATC_NT][4], const typename P::E* X1,
                                         const typename P::E* Y1, const typename P::E* X2, const typename P::E* Y2,
                                         int r0, bool more, Load load) {
    cp_wait<0>();
    __syncthreads();
    if (more) load();
    cp_commit();
    atc_scores<P>(s, X1, r0, Y1);
    atc_scores<P>(dp, X2, r0, Y2);
}

// Whether query t sees key s.
__device__ __forceinline__ bool atc_visible(int t, int s, int T, int window) {
    return t < T && s <= t && (window <= 0 || t - s < window);
}

// P and dS of one pair from the score u (= q·k), dp = dy·v and the query's statistics st
// (m, g, D): s ← P, dp ← dS; 0 where the key is not visible.
__device__ __forceinline__ void atc_pds(float& s, float& dp, float4 st, float sl2, bool visible) {
    const float p = visible ? fast_exp2(fminf(__fmul_rn(s, sl2) - st.x, 0.f) - st.y) : 0.f;
    s = p;
    dp = p * (dp - st.z);
}

// Rows [r0, r0 + 16) of the f32 gradient g (token stride tok, T rows) = scale · acc.
__device__ __forceinline__ void atc_store(float* g, const float (&acc)[ATC_DT][4], int r0, int T, long long tok,
                                          float scale) {
    const int lane = threadIdx.x & 31, gr = lane >> 2, i = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = r0 + gr + 8 * h;
        if (r >= T) continue;
#pragma unroll
        for (int n = 0; n < ATC_DT; ++n)
            *reinterpret_cast<float2*>(g + (long long)r * tok + 8 * n + 2 * i) =
                make_float2(scale * acc[n][2 * h], scale * acc[n][2 * h + 1]);
    }
}

__device__ __forceinline__ void atc_zero(float (&acc)[ATC_DT][4]) {
#pragma unroll
    for (int n = 0; n < ATC_DT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

// --- atc_delta -------------------------------------------------------------------------------

__device__ __forceinline__ float atc_f32(mx_bf16 x) { return mx_bf16_f32(x); }
__device__ __forceinline__ float atc_f32(float x) { return x; }

// stats[·][2] = D_t = Σ_d dy_{t,d} y_{t,d} in f32, one warp per row (rows = B·T·H in token-major
// order; y and dy [B,T,H,D]), the lanes' partial sums added in a fixed tree.
template <typename E>
__device__ void atc_delta(const E* y, const E* dy, float* stats, int T, int H, long long rows) {
    const long long row = (long long)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    float s = 0.f;
    for (int d = lane; d < ATC_D; d += 32) s = fmaf(atc_f32(dy[row * ATC_D + d]), atc_f32(y[row * ATC_D + d]), s);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    // row = (b·T + t)·H + h; the statistics are indexed (b·H + h)·T + t.
    const long long h = row % H, bt = row / H, b = bt / T, t = bt % T;
    if (lane == 0) stats[4 * ((b * H + h) * T + t) + 2] = s;
}

extern __shared__ __align__(128) unsigned char atc_smem[];

// The dynamic shared memory of atc_dkdv and atc_dq: two tiles of ATC_BM rows that stay (R1, R2), two
// stages of two streamed tiles of ATC_BN rows (C1, C2; stage s at + s·ATC_STAGE), then (atc_dkdv)
// two stages of ATC_BN rows' statistics (S).
template <class P>
struct AtcTiles {
    typename P::E *R1, *R2, *C1, *C2;
    float4* S;
    __device__ explicit AtcTiles(unsigned char* raw) {
        R1 = reinterpret_cast<typename P::E*>(raw);
        R2 = R1 + ATC_BM * P::ELEMS;
        C1 = R2 + ATC_BM * P::ELEMS;
        C2 = C1 + 2 * ATC_STAGE;
        S = reinterpret_cast<float4*>(C2 + 2 * ATC_STAGE);
    }
};

// The offset of head bh = b·H + h's first element in a [B,T,H,ATC_D] tensor.
__device__ __forceinline__ long long atc_head(int bh, int T, int H) {
    return ((long long)(bh / H) * T * H + bh % H) * ATC_D;
}

// --- atc_dkdv --------------------------------------------------------------------------------

// Grid (⌈T/ATC_BM⌉, B·H), key tile blockIdx.x. Shared tiles (AtcTiles): R1, R2 = K, V; C1, C2 = Q, dY;
// S the query rows' statistics.
template <class P>
__device__ void atc_dkdv(const typename P::E* q, const typename P::E* k, const typename P::E* v,
                         const typename P::E* dy, const float4* stats, float* dk, float* dv, int T, int H,
                         int window, float sl2, float scale, const float* skip) {
    if (skip && *skip != 0.f) return;
    const AtcTiles<P> sm(atc_smem);
    typename P::E *Ks = sm.R1, *Vs = sm.R2, *Qs = sm.C1, *Gs = sm.C2;
    float4* Ss = sm.S;
    const int k0 = blockIdx.x * ATC_BM, bh = blockIdx.y;
    const long long tok = (long long)H * ATC_D, off = atc_head(bh, T, H);
    const float4* st = stats + (long long)bh * T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, i4 = lane & 3;
    const int r0 = 16 * warp;
    // The query tiles that see a key of this tile: from the one holding k0 to the last query within
    // the window of the tile's last key.
    const int jfirst = k0 / ATC_BN;
    const int qlast = window > 0 ? min(T - 1, k0 + ATC_BM - 1 + window - 1) : T - 1;
    const int jlast = qlast / ATC_BN;
    auto load_q = [&](int j, int stage) {
        P::load(Qs + stage * ATC_STAGE, q + off, j * ATC_BN, ATC_BN, T, tok);
        P::load(Gs + stage * ATC_STAGE, dy + off, j * ATC_BN, ATC_BN, T, tok);
        const unsigned sb = smem_u32(Ss + stage * ATC_BN);
        for (int r = threadIdx.x; r < ATC_BN; r += ATC_THREADS) {
            const int t = j * ATC_BN + r;
            cp_async16(sb + 16 * r, st + (t < T ? t : 0), t < T ? 16 : 0);
        }
    };
    P::load(Ks, k + off, k0, ATC_BM, T, tok);
    P::load(Vs, v + off, k0, ATC_BM, T, tok);
    load_q(jfirst, 0);
    cp_commit();
    float adk[ATC_DT][4], adv[ATC_DT][4];
    atc_zero(adk);
    atc_zero(adv);
    for (int j = jfirst; j <= jlast; ++j) {
        const int stage = (j - jfirst) & 1, q0 = j * ATC_BN;
        float s[ATC_NT][4], dp[ATC_NT][4];
        atc_step<P>(s, dp, Ks, Qs + stage * ATC_STAGE, Vs, Gs + stage * ATC_STAGE, r0, j < jlast, [&] {
            load_q(j + 1, stage ^ 1);
        });
        // Every pair visible: every query after every key, inside T and the window.
        const bool all = q0 >= k0 + ATC_BM - 1 && q0 + ATC_BN <= T && (window <= 0 || q0 + ATC_BN - 1 - k0 < window);
        const float4* sq = Ss + stage * ATC_BN;
#pragma unroll
        for (int n = 0; n < ATC_NT; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = 8 * n + 2 * i4 + c;
                const float4 sc = sq[col];
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int key = k0 + r0 + gr + 8 * hh;
                    atc_pds(s[n][2 * hh + c], dp[n][2 * hh + c], sc, sl2, all || atc_visible(q0 + col, key, T, window));
                }
            }
        atc_accumulate<P>(adv, s, Gs + stage * ATC_STAGE);
        atc_accumulate<P>(adk, dp, Qs + stage * ATC_STAGE);
    }
    atc_store(dk + off, adk, k0 + r0, T, tok, scale);
    atc_store(dv + off, adv, k0 + r0, T, tok, 1.f);
}

// --- atc_dq ----------------------------------------------------------------------------------

// Grid (⌈T/ATC_BM⌉, B·H), the longest query tiles first. Shared tiles (AtcTiles): R1, R2 = Q, dY;
// C1, C2 = K, V.
template <class P>
__device__ void atc_dq(const typename P::E* q, const typename P::E* k, const typename P::E* v,
                       const typename P::E* dy, const float4* stats, float* dq, int T, int H, int window, float sl2,
                       float scale, const float* skip) {
    if (skip && *skip != 0.f) return;
    const AtcTiles<P> sm(atc_smem);
    typename P::E *Qs = sm.R1, *Gs = sm.R2, *Ks = sm.C1, *Vs = sm.C2;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ATC_BM, bh = blockIdx.y;
    const long long tok = (long long)H * ATC_D, off = atc_head(bh, T, H);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, i4 = lane & 3;
    const int r0 = 16 * warp;
    const int jfirst = window > 0 ? max(0, q0 - window + 1) / ATC_BN : 0;
    const int jlast = (min(q0 + ATC_BM, T) - 1) / ATC_BN;
    auto load_kv = [&](int j, int stage) {
        P::load(Ks + stage * ATC_STAGE, k + off, j * ATC_BN, ATC_BN, T, tok);
        P::load(Vs + stage * ATC_STAGE, v + off, j * ATC_BN, ATC_BN, T, tok);
    };
    P::load(Qs, q + off, q0, ATC_BM, T, tok);
    P::load(Gs, dy + off, q0, ATC_BM, T, tok);
    load_kv(jfirst, 0);
    cp_commit();
    // The statistics of the thread's two rows.
    float4 sr[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int t = q0 + r0 + gr + 8 * hh;
        sr[hh] = t < T ? stats[(long long)bh * T + t] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float adq[ATC_DT][4];
    atc_zero(adq);
    for (int j = jfirst; j <= jlast; ++j) {
        const int stage = (j - jfirst) & 1, k0 = j * ATC_BN;
        float s[ATC_NT][4], dp[ATC_NT][4];
        atc_step<P>(s, dp, Qs, Ks + stage * ATC_STAGE, Gs, Vs + stage * ATC_STAGE, r0, j < jlast, [&] {
            load_kv(j + 1, stage ^ 1);
        });
        const bool all = k0 + ATC_BN - 1 <= q0 && q0 + ATC_BM <= T && (window <= 0 || q0 + ATC_BM - 1 - k0 < window);
#pragma unroll
        for (int n = 0; n < ATC_NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int t = q0 + r0 + gr + 8 * (e >> 1), key = k0 + 8 * n + 2 * i4 + (e & 1);
                atc_pds(s[n][e], dp[n][e], sr[e >> 1], sl2, all || atc_visible(t, key, T, window));
            }
        atc_accumulate<P>(adq, dp, Ks + stage * ATC_STAGE);
    }
    atc_store(dq + off, adq, q0 + r0, T, tok, scale);
}

#define ATC_EXPORT(P, E, S)                                                                                     \
    extern "C" __global__ void atc_delta_##S(const E* y, const E* dy, float* stats, int T, int H, long long rows) { \
        atc_delta<E>(y, dy, stats, T, H, rows);                                                                  \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATC_THREADS)                                                    \
        atc_dkdv_##S(const E* q, const E* k, const E* v, const E* dy, const float4* stats, float* dk, float* dv, \
                     int T, int H, int window, float sl2, float scale, const float* skip) {                      \
        atc_dkdv<P>(q, k, v, dy, stats, dk, dv, T, H, window, sl2, scale, skip);                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATC_THREADS)                                                    \
        atc_dq_##S(const E* q, const E* k, const E* v, const E* dy, const float4* stats, float* dq, int T, int H, \
                   int window, float sl2, float scale, const float* skip) {                                      \
        atc_dq<P>(q, k, v, dy, stats, dq, T, H, window, sl2, scale, skip);                                       \
    }

ATC_EXPORT(AtcBf16, mx_bf16, bf16)
ATC_EXPORT(AtcTf32, float, tf32)
ATC_EXPORT(AtcTf32x3, float, tf32x3)
