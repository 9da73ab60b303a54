// Softmax attention on tensor cores (FlashAttention-2 structure), for NVRTC, no headers.
//
//   y_t = Σ_{s ≤ t, t − s < window} softmax_s(scale · q_t·k_s) v_s
//
// Layouts: q, y [B,T,H,D]; k, v [B,Nk,H,D] (token stride H·D). window ≤ 0: full causal. stats:
// null, or [B·H·T][4] floats for the backward's row statistics (att_store). prefix: null, or the
// keys of a KV cache before batch row b's first query, P_b = prefix[b] (query t at position P_b + t
// among the row's P_b + T keys, Nk ≥ P_b + T; attention.cu says more). part: null, or (a grid of
// Z = gridDim.z > 1 key splits, for few query tiles over many keys) the blocks' partial results:
// block z takes the z-th of Z equal shares of its key tiles and writes its rows' unnormalized
// outputs o [Z][B·H][T][D] and (m, ℓ) [Z][B·H][T][2] after them (att_store_part);
// attn_combine_splits then forms y = Σ_z 2^{m_z − M} o_z / Σ_z 2^{m_z − M} ℓ_z, M = max_z m_z.
// Compile-time: ATT_D (head dim: 32, 64, 96 or 128; wgmma 64, 128 or 256), ATT_BK (keys per tile), ATT_WM (16-row
// m-tiles per warp). A block of 4 warps owns BQ = 64·ATT_WM query rows of one (batch, head).
//
// Three kernels:
//  * attn_wgmma_bf16 (compiled with -DATT_WGMMA=1 for sm_90a): attn_mma_bf16's structure on
//    Hopper's warpgroup MMA, described where it is defined below.
//  * attn_mma_bf16: bf16 q, k, v, y; mma.m16n8k16 bf16 → f32; ldmatrix from XOR-swizzled
//    shared memory; P is re-packed from the score accumulators as the A operand of P·V.
//  * attn_mma_tf32: f32 q, k, v, y; mma.m16n8k8 tf32 → f32 (q and P rounded to tf32, k and
//    v truncated by the tensor core); padded shared memory. attn_mma_tf32x3 (the exact mode on f32)
//    is the same kernel with every product split into three tf32 products (tf32_split), which
//    keeps f32 accuracy, and rows computed again in double where a score overflows. The key
//    index inside an 8-key step is permuted (A column t ↔ key 2t, t+4 ↔ 2t+1) so that P goes
//    from the score accumulators to the A operand without shuffles; V is read with the same
//    permutation.
// Both: K/V tiles streamed with cp.async, double-buffered; online softmax in f32 with exp2
// (scale·log2 e folded into the exponent's FMA); causal/window masks applied before exp2 and only
// on tiles that straddle a boundary; tiles wholly outside the window are skipped; blocks run
// the longest query tiles first.

#ifndef ATT_D
#define ATT_D 64
#endif
#ifndef ATT_BK
#define ATT_BK 64
#endif
#ifndef ATT_WM
#define ATT_WM 1
#endif
#ifndef ATT_WARPS
#define ATT_WARPS 4
#endif
#define ATT_BQ (16 * ATT_WM * ATT_WARPS)
#define NEG_INF __int_as_float(0xff800000)

typedef unsigned short bf16_t;
typedef unsigned int u32;

// ---------------------------------------------------------------------------------------
// Online-softmax bookkeeping shared by both kernels. A thread holds, for each of its m-tiles,
// two rows (g and g+8) of the score tile: s[mt][nt][0..1] (row g) and [2..3] (row g+8).
struct RowState {
    float m[ATT_WM][2];
    float l[ATT_WM][2];
};

// The mma.sync tiles of the two kernels: mx_mma_bf16 and mx_mma_tf32 (common.cuh) as non-volatile
// asm, which the compiler may schedule as data flow allows.
__device__ __forceinline__ void att_mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    MX_MMA_SYNC(asm, "m16n8k16.row.col.f32.bf16.bf16.f32", c, a0, a1, a2, a3, b0, b1);
}
__device__ __forceinline__ void att_mma_tf32(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    MX_MMA_SYNC(asm, "m16n8k8.row.col.f32.tf32.tf32.f32", c, a0, a1, a2, a3, b0, b1);
}
// The bf16 kernel's product of one A fragment a (m16 × k16) with an x4 B fragment b as ldmatrix
// leaves it (k16 × n16: registers 0, 1 the first n8 tile, 2, 3 the second): c0 += A·B[:, 0..7],
// c1 += A·B[:, 8..15].
__device__ __forceinline__ void att_mma_bf16_n16(float* c0, float* c1, const u32 (&a)[4], const u32 (&b)[4]) {
    att_mma_bf16(c0, a[0], a[1], a[2], a[3], b[0], b[1]);
    att_mma_bf16(c1, a[0], a[1], a[2], a[3], b[2], b[3]);
}

// The online softmax's start, in every kernel: running maxima −∞, sums and accumulators 0.
__device__ __forceinline__ void att_begin(float (&o)[ATT_WM][ATT_D / 8][4], RowState& st) {
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt) {
        st.m[mt][0] = st.m[mt][1] = NEG_INF;
        st.l[mt][0] = st.l[mt][1] = 0.f;
#pragma unroll
        for (int dt = 0; dt < ATT_D / 8; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    }
}

// One step of the mma.sync kernels' two-stage K/V pipeline: wait until at most one copy group is in
// flight (the tile about to be read has landed), a barrier (every warp is done with the buffer that
// load refills), then issue load's copies when there is a next tile, as one group (an empty group
// otherwise, so that the count stays the same).
template <typename Load>
__device__ __forceinline__ void att_next(bool more, Load load) {
    cp_wait<1>();
    __syncthreads();
    if (more) load();
    cp_commit();
}

// A score tile's mma.sync accumulators, zeroed.
__device__ __forceinline__ void att_zero(float (&s)[ATT_WM][ATT_BK / 8][4]) {
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int nt = 0; nt < ATT_BK / 8; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
}

// Masks s for keys outside [lo_q, q] (per row) or beyond T, where lo_q = q − window + 1.
__device__ __forceinline__ void mask_tile(float (&s)[ATT_WM][ATT_BK / 8][4], int q_row0, int k0, int T,
                                          int window) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int nt = 0; nt < ATT_BK / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int q = q_row0 + mt * 16 + g + (e >> 1) * 8;
                const int kk = k0 + nt * 8 + 2 * t + (e & 1);
                bool ok = kk <= q && kk < T;
                if (window > 0) ok = ok && (q - kk < window);
                if (!ok) s[mt][nt][e] = NEG_INF;
            }
}

// Rescales the running state by the new tile; turns the raw scores s into
// p = exp2(scale_log2·s − m) in place, m the running row maximum in the scaled domain.
// Masked scores are −∞; a row with every key masked so far keeps m = −∞ and is referenced
// to 0 instead, so that no ∞ − ∞ appears.
__device__ __forceinline__ void softmax_update(float (&s)[ATT_WM][ATT_BK / 8][4], RowState& st,
                                               float (&o)[ATT_WM][ATT_D / 8][4], float scale_log2) {
    float cf[ATT_WM][2];
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < ATT_BK / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            mx = fmaxf(st.m[mt][r], __fmul_rn(mx, scale_log2));
            const float mref = mx == NEG_INF ? 0.f : mx;
            const float corr = fast_exp2(st.m[mt][r] - mref);
            st.m[mt][r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < ATT_BK / 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    // The product rounded as mx's was (__fmul_rn is never fused with the
                    // subtraction): the maximum's own exponent is exactly 0, the others ≤ 0. A fused
                    // fmaf would leave the rounding error of the product, about 2^-24·|logit|, as a
                    // positive exponent: e^{+1e29} = ∞ for logits near 1e37, and NaN in y.
                    const float p = fast_exp2(__fmul_rn(s[mt][nt][2 * r + c], scale_log2) - mref);
                    s[mt][nt][2 * r + c] = p;
                    sum += p;
                }
            st.l[mt][r] = st.l[mt][r] * corr + sum;
            cf[mt][r] = corr;
            moved = moved || corr != 1.f;
        }
    // Rescale the accumulators only where some row of the warp has a new maximum (after the first
    // tiles of a causal row the maximum rarely moves; corr = 1 leaves them unchanged anyway).
    if (__any_sync(0xffffffffu, moved))
#pragma unroll
        for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
            for (int dt = 0; dt < ATT_D / 8; ++dt) {
                o[mt][dt][0] *= cf[mt][0];
                o[mt][dt][1] *= cf[mt][0];
                o[mt][dt][2] *= cf[mt][1];
                o[mt][dt][3] *= cf[mt][1];
            }
}

// Tile range of a query block (first row q0 of T, at position P + q0 among the keys): [first, last]
// key tiles, with the window's skip.
__device__ __forceinline__ void tile_range(int q0, int T, int P, int window, int& first, int& last) {
    const int a_last = min(q0 + ATT_BQ, T) - 1 + P;
    last = a_last / ATT_BK;
    first = window > 0 ? max(0, q0 + P - window + 1) / ATT_BK : 0;
}
// q0: the block's first query's position among the keys; T: the number of keys.
__device__ __forceinline__ bool tile_needs_mask(int q0, int k0, int T, int window) {
    // Some key after some query row, past T, or (window) too far back for some row.
    if (k0 + ATT_BK - 1 > q0) return true;
    if (k0 + ATT_BK > T) return true;
    if (window > 0 && (q0 + ATT_BQ - 1) - k0 >= window) return true;
    return false;
}

// =======================================================================================
// bf16
// =======================================================================================
#define CH (ATT_D / 8)  // 16-byte chunks per row (8 bf16 each)
// The XOR swizzle's mask: the row's low three bits where a row holds whole groups of 8 chunks
// (D = 64, 128: the eight rows an ldmatrix reads fall in eight distinct bank groups), its low two
// where it holds groups of 4 (D = 32, 96: at most two rows per bank group). chunk ^ (row & mask)
// stays inside the chunk's aligned group, hence inside the row.
#define SWZ_MASK (CH % 8 == 0 ? 7 : 3)

__device__ __forceinline__ int swz(int row, int chunk) { return row * CH + (chunk ^ (row & SWZ_MASK)); }
// The wgmma kernel's layout of a tile of nrows rows (D a multiple of 64): D/64 panels of 64 columns one
// after the other, each [nrows][64] in 128-byte swizzle atoms (chunk ^ (row mod 8) inside the row's 128
// bytes), which wgmma's descriptors read; at D = 64 it is swz's layout.
__device__ __forceinline__ int swz_panels(int row, int chunk, int nrows) {
    return (chunk >> 3) * nrows * 8 + row * 8 + ((chunk & 7) ^ (row & 7));
}

// Loads rows [r0, r0+nrows) of a [B,T,H,D] bf16 tensor (this batch/head) into swizzled smem (PANELS:
// the wgmma kernel's layout, swz_panels; else swz).
template <bool PANELS>
__device__ __forceinline__ void load_tile_bf16(bf16_t* sm, const bf16_t* base, int r0, int nrows, int T,
                                               long long tok_stride) {
    const u32 sbase = smem_u32(sm);
    for (int idx = threadIdx.x; idx < nrows * CH; idx += ATT_WARPS * 32) {
        const int row = idx / CH, ch = idx % CH, r = r0 + row;
        const bool in = r < T;
        const bf16_t* src = base + (long long)(in ? r : 0) * tok_stride + ch * 8;
        const int at = PANELS ? swz_panels(row, ch, nrows) : swz(row, ch);
        cp_async16(sbase + at * 16, src, in ? 16 : 0);
    }
}

// The block's query tile (longest rows first; rows q0 … of T, at positions P + q0 … among the Tk =
// P + T keys), its key tiles [first, last] and its offsets in the layouts (off: q and y's, koff: k
// and v's).
struct AttBlock {
    int q0, first, last, P, Tk;
    long long tok, off, koff;
};
__device__ __forceinline__ AttBlock att_block(int T, int H, int window, const int* prefix, int Nk) {
    AttBlock a;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    a.q0 = qb * ATT_BQ;
    a.P = prefix ? prefix[b] : 0;
    a.Tk = a.P + T;
    a.tok = (long long)H * ATT_D;
    a.off = (long long)b * T * a.tok + (long long)h * ATT_D;
    a.koff = (long long)b * Nk * a.tok + (long long)h * ATT_D;
    tile_range(a.q0, T, a.P, window, a.first, a.last);
    if (gridDim.z > 1) {  // key splits: this block's share (none at all where first > last)
        const int per = (a.last - a.first + gridDim.z) / gridDim.z;
        a.first += blockIdx.z * per;
        a.last = min(a.last, a.first + per - 1);
    }
    return a;
}
// att_block, then the copies of Q and the first K tile (one group) and V tile (a second).
template <bool PANELS>
__device__ __forceinline__ AttBlock att_start_bf16(bf16_t* qs, bf16_t* k0s, bf16_t* v0s, const bf16_t* q,
                                                   const bf16_t* k, const bf16_t* v, int T, int H, int window,
                                                   const int* prefix, int Nk) {
    const AttBlock a = att_block(T, H, window, prefix, Nk);
    load_tile_bf16<PANELS>(qs, q + a.off, a.q0, ATT_BQ, T, a.tok);
    load_tile_bf16<PANELS>(k0s, k + a.koff, a.first * ATT_BK, ATT_BK, a.Tk, a.tok);
    cp_commit();
    load_tile_bf16<PANELS>(v0s, v + a.koff, a.first * ATT_BK, ATT_BK, a.Tk, a.tok);
    cp_commit();
    return a;
}
// y = O / ℓ for the warp's rows from wrow0 (ℓ summed over the four threads of a row), as bf16
// or f32 (att_put2: two adjacent columns). Where stats is not null, also each row's statistics for
// the backward (kernels/attention_backward_fused.cu): stats[4 (bh·T + row) + 0, 1] = m, log₂ ℓ,
// so that softmax = exp2(scale·log₂e · q·k − m − log₂ ℓ), bh = blockIdx.y.
__device__ __forceinline__ void att_put2(bf16_t* d, float a, float b) { *reinterpret_cast<u32*>(d) = mx_pack_bf16(a, b); }
__device__ __forceinline__ void att_put2(float* d, float a, float b) { *reinterpret_cast<float2*>(d) = make_float2(a, b); }
template <typename TO>
__device__ __forceinline__ void att_store(TO* y, const float (&o)[ATT_WM][ATT_D / 8][4], const RowState& st, int wrow0,
                                          int T, long long tok, float* stats) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = st.l[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const float inv = l > 0.f ? 1.f / l : 0.f;
            const int row = wrow0 + mt * 16 + g + r * 8;
            if (row < T && stats && t == 0) {
                float* at = stats + 4 * ((long long)blockIdx.y * T + row);
                at[0] = st.m[mt][r];
                at[1] = log2f(l);
            }
            if (row < T) {
                TO* dst = y + (long long)row * tok;
#pragma unroll
                for (int dt = 0; dt < ATT_D / 8; ++dt)
                    att_put2(dst + dt * 8 + 2 * t, o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
            }
        }
}

// A key split's partial result for the warp's rows from wrow0 (module header, `part`): the
// unnormalized outputs o and the rows' (m, ℓ), ℓ summed over the four threads of a row. Waits for
// the block's copies first (a block without key tiles has issued some and runs no loop).
__device__ __forceinline__ void att_store_part(float* part, const float (&o)[ATT_WM][ATT_D / 8][4],
                                               const RowState& st, int wrow0, int T) {
    cp_wait<0>();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long long slab = (long long)blockIdx.z * gridDim.y + blockIdx.y;
    float* po = part + slab * T * ATT_D;
    float* pml = part + (long long)gridDim.z * gridDim.y * T * ATT_D + slab * T * 2;
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = st.l[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            const int row = wrow0 + mt * 16 + g + r * 8;
            if (row >= T) continue;
            if (t == 0) {
                pml[2 * row] = st.m[mt][r];
                pml[2 * row + 1] = l;
            }
#pragma unroll
            for (int dt = 0; dt < ATT_D / 8; ++dt)
                *reinterpret_cast<float2*>(po + (long long)row * ATT_D + dt * 8 + 2 * t) =
                    make_float2(o[mt][dt][2 * r], o[mt][dt][2 * r + 1]);
        }
}
// The end of every forward kernel: y (att_store), or a key split's partial result.
template <typename TO>
__device__ __forceinline__ void att_finish(TO* y, float* part, const float (&o)[ATT_WM][ATT_D / 8][4],
                                           const RowState& st, int wrow0, int T, long long tok, float* stats) {
    if (part) att_store_part(part, o, st, wrow0, T);
    else att_store(y, o, st, wrow0, T, tok, stats);
}

// y from the Z key splits' partial results (module header), one block per (query row t, b·h),
// the output in bf16 (yb) or f32 (yf; the other null) at [B,T,H,D]. A row no key reaches (ℓ = 0 in
// every split) gets 0, as att_store gives it.
extern "C" __global__ void attn_combine_splits(const float* __restrict__ part, bf16_t* __restrict__ yb,
                                               float* __restrict__ yf, int T, int H, int Z) {
    const int t = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const long long nbh = gridDim.y;
    const float* ml = part + (long long)Z * nbh * T * ATT_D;
    float M = NEG_INF;
    for (int z = 0; z < Z; ++z) M = fmaxf(M, ml[((z * nbh + bh) * T + t) * 2]);
    const float mref = M == NEG_INF ? 0.f : M;
    float L = 0.f;
    for (int z = 0; z < Z; ++z) {
        const float* e = ml + ((z * nbh + bh) * T + t) * 2;
        L += exp2f(e[0] - mref) * e[1];
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const long long out = ((long long)(b * T + t) * H + h) * ATT_D;
    for (int c = threadIdx.x; c < ATT_D; c += blockDim.x) {
        float acc = 0.f;
        for (int z = 0; z < Z; ++z)
            acc += exp2f(ml[((z * nbh + bh) * T + t) * 2] - mref) * part[((z * nbh + bh) * T + t) * ATT_D + c];
        const float v = acc * inv;
        if (yb) yb[out + c] = (bf16_t)(mx_pack_bf16(v, 0.f) & 0xffffu);
        else yf[out + c] = v;
    }
}

// ---------------------------------------------------------------------------------------
// Hopper warpgroup MMA (wgmma, sm_90a; compiled only with -DATT_WGMMA=1 and --gpu-architecture=sm_90a).
// A warpgroup (4 warps, 128 threads) computes a 64 × 64 tile, m64n64k16 per instruction, bf16 → f32.
// The accumulator d[j][e] of a thread is the mma.sync m16n8 layout per 8-column block j: warp w of
// the warpgroup holds rows 16w + g (e = 0, 1) and 16w + g + 8 (e = 2, 3), columns 8j + 2t + (e & 1).
// Shared operands are described by 64-bit descriptors: start address, leading and stride byte
// offsets (16-byte units), swizzle mode (1 = 128 B: the 16-byte group index XOR row mod 8 inside
// 8-row × 128-byte atoms, the layout of swz() above with 64 bf16 per row).
#ifdef ATT_WGMMA
typedef unsigned long long u64;
__device__ __forceinline__ u64 wg_desc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo & 0x3FFF) << 16) | ((u64)(sbo & 0x3FFF) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Shared-memory writes of the generic proxy (st.shared, cp.async) made visible to wgmma's reads.
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// d += A·B (A, B in shared memory; TB = 1: B stored MN-major, i.e. transposed); accumulate = 0 starts from 0.
template <int TB>
__device__ __forceinline__ void wg_ss(float (&d)[8][4], u64 da, u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}
// d += A·B with A from registers (each warp its 16 rows as the m16n8k16 A fragment), B shared.
template <int TB>
__device__ __forceinline__ void wg_rs(float (&d)[8][4], const u32 (&a)[4], u64 db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(TB), "r"(accumulate));
}
#endif

#ifdef ATT_WGMMA
// =======================================================================================
// bf16 on Hopper's warpgroup MMA (the bf16 mode on compute capability 9.0, ATT_WM = 1, ATT_WARPS = 8
// or 12, ATT_D ∈ {64, 128, 256}, ATT_BK ∈ {64, 128}): the structure of attn_mma_bf16 with ATT_WM = 1,
// each warpgroup owning 64 query rows. Tiles are stored as WG_NP panels of 64 columns (swz_panels),
// 1024-byte aligned (128-byte swizzle atoms). S = Q Kᵀ as D/16 · BK/64 m64n64k16 wgmma with Q and K
// from shared memory (K-major descriptors; k-step kt reads panel kt/4 at byte 32·(kt mod 4) of its
// rows, each instruction 64 keys of it); the online softmax on
// the accumulators (the same layout as mma.sync's); then O += P V: for each panel p of V (columns
// 64p…64p+63) four wgmma with P from registers and V's panel from shared memory (MN-major descriptor,
// WG_V_LBO / WG_V_SBO, start stepping WG_V_STEP bytes per 16 keys: the settings
// bench/gpu/wgmma_probe.py found against an f64 product on the H200), accumulating into the output
// fragments of columns 64p…64p+63.
#define WG_NP (ATT_D / 64)
#define WG_V_LBO 1
#define WG_V_SBO 64
#define WG_V_STEP 2048
// The 8 accumulator tiles (64 columns) of an accumulator (o, or s) from column 64·p, as wgmma's operand.
template <int N>
__device__ __forceinline__ float (&wg_n64(float (&a)[N][4], int p))[8][4] {
    return *reinterpret_cast<float(*)[8][4]>(&a[8 * p]);
}
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32, 1)
    attn_wgmma_bf16(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                    bf16_t* __restrict__ y, int B, int T, int H, int window, float scale_log2,
                  float* __restrict__ stats, const int* __restrict__ prefix, int Nk, float* __restrict__ part) {
    // Dynamic shared memory (plus up to 1 KB to align): q [BQ·D] | k stage 0, 1 [BK·D] | v stage 0, 1 [BK·D].
    extern __shared__ __align__(1024) bf16_t smw[];
    bf16_t* qs = smw + ((1024 - (smem_u32(smw) & 1023)) & 1023) / 2;
    bf16_t* ks[2] = {qs + ATT_BQ * ATT_D, qs + ATT_BQ * ATT_D + ATT_BK * ATT_D};
    bf16_t* vs[2] = {ks[1] + ATT_BK * ATT_D, ks[1] + 2 * ATT_BK * ATT_D};
    const AttBlock ab = att_start_bf16<true>(qs, ks[0], vs[0], q, k, v, T, H, window, prefix, Nk);
    const int q0 = ab.q0, first = ab.first, last = ab.last, P = ab.P, Tk = ab.Tk;
    const long long tok = ab.tok, off = ab.off, koff = ab.koff;
    const int warp = threadIdx.x >> 5, wg = warp >> 2;
    const int wrow0 = q0 + warp * 16;

    float o[1][ATT_D / 8][4];  // ATT_WM = 1
    RowState st;
    att_begin(o, st);
    // The warpgroup's 64 rows in Q's first panel; panels are BQ rows (BQ·128 bytes) apart.
    const u32 qaddr = smem_u32(qs) + wg * 64 * 128;

    for (int j = first; j <= last; ++j) {
        const int stage = (j - first) & 1;
        // One barrier per tile: K and V of tile j + 1 are copied while tile j is computed (1.06x
        // faster than a barrier before each of the two products on the H200).
        cp_wait<0>();
        wg_proxy_fence();
        __syncthreads();
        if (j < last) {
            load_tile_bf16<true>(ks[stage ^ 1], k + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok);
            load_tile_bf16<true>(vs[stage ^ 1], v + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok);
        }
        cp_commit();
        // S = Q Kᵀ: 16 columns of reduction per instruction.
        float s[1][ATT_BK / 8][4];
        const u32 kaddr = smem_u32(ks[stage]);
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < ATT_D / 16; ++kt) {
            const u32 qa = qaddr + (kt >> 2) * ATT_BQ * 128 + (kt & 3) * 32;
            const u32 ka = kaddr + (kt >> 2) * ATT_BK * 128 + (kt & 3) * 32;
#pragma unroll
            for (int nb = 0; nb < ATT_BK / 64; ++nb)  // 64 keys (8192 bytes of the panel) per instruction
                wg_ss<0>(wg_n64(s[0], nb), wg_desc(qa, 1, 64), wg_desc(ka + nb * 8192, 1, 64), kt > 0);
        }
        wg_commit();
        wg_wait0();
        if (tile_needs_mask(q0 + P, j * ATT_BK, Tk, window)) mask_tile(s, wrow0 + P, j * ATT_BK, Tk, window);
        softmax_update(s, st, o, scale_log2);
        // O += P V: P as the A fragment (the same packing as attn_mma_bf16), V MN-major, panel by panel.
        u32 pa[ATT_BK / 16][4];
#pragma unroll
        for (int kt = 0; kt < ATT_BK / 16; ++kt) {
            pa[kt][0] = mx_pack_bf16(s[0][2 * kt][0], s[0][2 * kt][1]);
            pa[kt][1] = mx_pack_bf16(s[0][2 * kt][2], s[0][2 * kt][3]);
            pa[kt][2] = mx_pack_bf16(s[0][2 * kt + 1][0], s[0][2 * kt + 1][1]);
            pa[kt][3] = mx_pack_bf16(s[0][2 * kt + 1][2], s[0][2 * kt + 1][3]);
        }
        const u32 vaddr = smem_u32(vs[stage]);
        wg_fence();
#pragma unroll
        for (int p = 0; p < WG_NP; ++p)
#pragma unroll
            for (int kt = 0; kt < ATT_BK / 16; ++kt)
                wg_rs<1>(wg_n64(o[0], p), pa[kt],
                         wg_desc(vaddr + p * ATT_BK * 128 + kt * WG_V_STEP, WG_V_LBO, WG_V_SBO), 1);
        wg_commit();
        wg_wait0();
    }
    att_finish(y + off, part, o, st, wrow0, T, tok, stats);
}
#endif

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32, 1)
    attn_mma_bf16(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                  bf16_t* __restrict__ y, int B, int T, int H, int window, float scale_log2,
                  float* __restrict__ stats, const int* __restrict__ prefix, int Nk, float* __restrict__ part) {
    // Dynamic shared memory: q [BQ·D] | k stage 0, 1 [BK·D] | v stage 0, 1 [BK·D].
    extern __shared__ __align__(128) bf16_t smb[];
    bf16_t* qs = smb;
    bf16_t* ks[2] = {qs + ATT_BQ * ATT_D, qs + ATT_BQ * ATT_D + ATT_BK * ATT_D};
    bf16_t* vs[2] = {ks[1] + ATT_BK * ATT_D, ks[1] + 2 * ATT_BK * ATT_D};
    const AttBlock ab = att_start_bf16<false>(qs, ks[0], vs[0], q, k, v, T, H, window, prefix, Nk);
    const int q0 = ab.q0, first = ab.first, last = ab.last, P = ab.P, Tk = ab.Tk;
    const long long tok = ab.tok, off = ab.off, koff = ab.koff;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wrow0 = q0 + warp * 16 * ATT_WM;

    u32 qf[ATT_WM][ATT_D / 16][4];
    float o[ATT_WM][ATT_D / 8][4];
    RowState st;
    att_begin(o, st);

    for (int j = first; j <= last; ++j) {
        // Groups in flight: K_j, V_j. K_{j+1} is issued once every warp is done with K_{j−1}
        // (the barrier below), V_{j+1} once every warp is done with V_{j−1} (the middle barrier).
        const int stage = (j - first) & 1;
        att_next(j < last, [&] { load_tile_bf16<false>(ks[stage ^ 1], k + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok); });
        if (j == first) {
#pragma unroll
            for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
                for (int kt = 0; kt < ATT_D / 16; ++kt) {
                    const int row = warp * 16 * ATT_WM + mt * 16 + (lane & 15);
                    const int ch = kt * 2 + (lane >> 4);
                    const u32 addr = smem_u32(qs) + swz(row, ch) * 16;
                    mx_ldsm_x4(qf[mt][kt], addr);
                }
        }
        // S = Q Kᵀ
        float s[ATT_WM][ATT_BK / 8][4];
        att_zero(s);
        const u32 kb = smem_u32(ks[stage]);
#pragma unroll
        for (int kt = 0; kt < ATT_D / 16; ++kt) {
            // all of this step's K fragments first, then the products (more loads in flight)
            u32 bf[ATT_BK / 16][4];
#pragma unroll
            for (int np = 0; np < ATT_BK / 16; ++np) {
                const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int ch = kt * 2 + ((lane >> 3) & 1);
                mx_ldsm_x4(bf[np], kb + swz(row, ch) * 16);
            }
#pragma unroll
            for (int np = 0; np < ATT_BK / 16; ++np)
#pragma unroll
                for (int mt = 0; mt < ATT_WM; ++mt)
                    att_mma_bf16_n16(s[mt][2 * np], s[mt][2 * np + 1], qf[mt][kt], bf[np]);
        }
        if (tile_needs_mask(q0 + P, j * ATT_BK, Tk, window)) mask_tile(s, wrow0 + P, j * ATT_BK, Tk, window);
        softmax_update(s, st, o, scale_log2);
        att_next(j < last, [&] { load_tile_bf16<false>(vs[stage ^ 1], v + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok); });
        // O += P V
        const u32 vb = smem_u32(vs[stage]);
#pragma unroll
        for (int kt = 0; kt < ATT_BK / 16; ++kt) {
            u32 pa[ATT_WM][4];
#pragma unroll
            for (int mt = 0; mt < ATT_WM; ++mt) {
                pa[mt][0] = mx_pack_bf16(s[mt][2 * kt][0], s[mt][2 * kt][1]);
                pa[mt][1] = mx_pack_bf16(s[mt][2 * kt][2], s[mt][2 * kt][3]);
                pa[mt][2] = mx_pack_bf16(s[mt][2 * kt + 1][0], s[mt][2 * kt + 1][1]);
                pa[mt][3] = mx_pack_bf16(s[mt][2 * kt + 1][2], s[mt][2 * kt + 1][3]);
            }
            u32 vf[ATT_D / 16][4];
#pragma unroll
            for (int dp = 0; dp < ATT_D / 16; ++dp) {
                const int row = kt * 16 + (lane & 15);
                const int ch = dp * 2 + (lane >> 4);
                mx_ldsm_x4_t(vf[dp], vb + swz(row, ch) * 16);
            }
#pragma unroll
            for (int dp = 0; dp < ATT_D / 16; ++dp)
#pragma unroll
                for (int mt = 0; mt < ATT_WM; ++mt)
                    att_mma_bf16_n16(o[mt][2 * dp], o[mt][2 * dp + 1], pa[mt], vf[dp]);
        }
    }
    att_finish(y + off, part, o, st, wrow0, T, tok, stats);
}

// =======================================================================================
// tf32
// =======================================================================================
#define KS_STRIDE (ATT_D + 8)  // float2 reads of K rows: conflict-free per half-warp
#define VS_STRIDE (ATT_D + 4)  // scalar reads of V columns: conflict-free

__device__ __forceinline__ void load_tile_f32(float* sm, int stride, const float* base, int r0, int nrows, int T,
                                              long long tok_stride) {
    const u32 sbase = smem_u32(sm);
    const int chs = ATT_D / 4;
    for (int idx = threadIdx.x; idx < nrows * chs; idx += ATT_WARPS * 32) {
        const int row = idx / chs, ch = idx % chs, r = r0 + row;
        const bool in = r < T;
        const float* src = base + (long long)(in ? r : 0) * tok_stride + ch * 4;
        cp_async16(sbase + (row * stride + ch * 4) * 4, src, in ? 16 : 0);
    }
}

// hi + lo = x to about 2⁻²² relative: hi = x rounded to tf32, lo = the rest (exact in f32) rounded to
// tf32. The split-tf32 product a·b ≈ a_lo·b_hi + a_hi·b_lo + a_hi·b_hi (the a_lo·b_lo term, about
// 2⁻²² of the product, is dropped) keeps f32 accuracy on the tensor cores.
__device__ __forceinline__ void tf32_split(float x, u32& hi, u32& lo) {
    hi = mx_tf32(x);
    lo = mx_tf32(x - __uint_as_float(hi));
}
// c += A·B from the split fragments of A (ah, al) and B (bh, bl), small terms first.
__device__ __forceinline__ void att_mma_x3(float* c, const u32 (&ah)[4], const u32 (&al)[4], const u32 (&bh)[2],
                                           const u32 (&bl)[2]) {
    att_mma_tf32(c, al[0], al[1], al[2], al[3], bh[0], bh[1]);
    att_mma_tf32(c, ah[0], ah[1], ah[2], ah[3], bl[0], bl[1]);
    att_mma_tf32(c, ah[0], ah[1], ah[2], ah[3], bh[0], bh[1]);
}
// The A fragments of the warp's m-tiles from f32 values x as the products take them: rounded to
// tf32 (hi; ROUNDED: x holds tf32 values already), or with SPLIT split as tf32_split says (hi, lo).
template <bool SPLIT, bool ROUNDED = false>
__device__ __forceinline__ void att_a_frag(const float (&x)[ATT_WM][4], u32 (&hi)[ATT_WM][4], u32 (&lo)[ATT_WM][4]) {
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (SPLIT) tf32_split(x[mt][i], hi[mt][i], lo[mt][i]);
            else hi[mt][i] = ROUNDED ? __float_as_uint(x[mt][i]) : mx_tf32(x[mt][i]);
        }
}
// c[mt] += A[mt]·B for the warp's m-tiles, A from att_a_frag, B the fragment (b0, b1) of f32 values
// (truncated to tf32 by the tensor core, or with SPLIT split).
template <bool SPLIT>
__device__ __forceinline__ void att_mma_f32(float* const (&c)[ATT_WM], const u32 (&ah)[ATT_WM][4],
                                            const u32 (&al)[ATT_WM][4], float b0, float b1) {
    if (SPLIT) {
        u32 bh[2], bl[2];
        tf32_split(b0, bh[0], bl[0]);
        tf32_split(b1, bh[1], bl[1]);
#pragma unroll
        for (int mt = 0; mt < ATT_WM; ++mt) att_mma_x3(c[mt], ah[mt], al[mt], bh, bl);
    } else {
#pragma unroll
        for (int mt = 0; mt < ATT_WM; ++mt)
            att_mma_tf32(c[mt], ah[mt][0], ah[mt][1], ah[mt][2], ah[mt][3], __float_as_uint(b0), __float_as_uint(b1));
    }
}

// The f32 kernels' body: attn_mma_tf32 (SPLIT = false) and attn_mma_tf32x3 (SPLIT = true, the exact
// mode: every product split as tf32_split says; a block where some score is not finite, f32 dot
// products beyond 3.4e38, computes its rows again in double with attn_row_f64).
template <bool SPLIT>
__device__ __forceinline__ void attn_f32_body(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, float* __restrict__ y, int T, int H,
                                              int window, float scale_log2, float* __restrict__ stats, double scale,
                                              float* __restrict__ flag, const int* __restrict__ prefix, int Nk,
                                              float* __restrict__ part) {
    extern __shared__ __align__(16) float smf[];
    __shared__ int overflow;
    float* ks0 = smf;
    float* ks1 = ks0 + ATT_BK * KS_STRIDE;
    float* vs0 = ks1 + ATT_BK * KS_STRIDE;
    float* vs1 = vs0 + ATT_BK * VS_STRIDE;
    const AttBlock ab = att_block(T, H, window, prefix, Nk);
    const int q0 = ab.q0, first = ab.first, last = ab.last, P = ab.P, Tk = ab.Tk;
    const long long tok = ab.tok, off = ab.off, koff = ab.koff;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wrow0 = q0 + warp * 16 * ATT_WM;
    if (SPLIT && threadIdx.x == 0) overflow = 0;  // seen by every thread after att_next's barrier

    load_tile_f32(ks0, KS_STRIDE, k + koff, first * ATT_BK, ATT_BK, Tk, tok);
    cp_commit();
    load_tile_f32(vs0, VS_STRIDE, v + koff, first * ATT_BK, ATT_BK, Tk, tok);
    cp_commit();

    // Q fragments straight from global memory (read once): rounded to tf32 here, or kept in f32
    // and split per use (SPLIT). Dim permutation inside each 8-dim step: A column t ↔ dim 2t,
    // t+4 ↔ dim 2t+1 (K uses the same).
    auto q_in = [](float x) { return SPLIT ? x : __uint_as_float(mx_tf32(x)); };
    float qf[ATT_D / 8][ATT_WM][4];
#pragma unroll
    for (int mt = 0; mt < ATT_WM; ++mt) {
        const int r0 = wrow0 + mt * 16 + g, r1 = r0 + 8;
#pragma unroll
        for (int kt = 0; kt < ATT_D / 8; ++kt) {
            float2 a = r0 < T ? *reinterpret_cast<const float2*>(q + off + (long long)r0 * tok + kt * 8 + 2 * t)
                              : make_float2(0.f, 0.f);
            float2 c = r1 < T ? *reinterpret_cast<const float2*>(q + off + (long long)r1 * tok + kt * 8 + 2 * t)
                              : make_float2(0.f, 0.f);
            qf[kt][mt][0] = q_in(a.x);
            qf[kt][mt][1] = q_in(c.x);
            qf[kt][mt][2] = q_in(a.y);
            qf[kt][mt][3] = q_in(c.y);
        }
    }
    float o[ATT_WM][ATT_D / 8][4];
    RowState st;
    att_begin(o, st);
    float seen = 0.f;  // SPLIT: the sum of the scores, not finite where one is not

    for (int j = first; j <= last; ++j) {
        const int stage = (j - first) & 1;  // same K/V pipeline as the bf16 kernel
        att_next(j < last, [&] { load_tile_f32(stage ? ks0 : ks1, KS_STRIDE, k + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok); });
        const float* kss = stage ? ks1 : ks0;
        const float* vss = stage ? vs1 : vs0;
        float s[ATT_WM][ATT_BK / 8][4];
        att_zero(s);
#pragma unroll
        for (int kt = 0; kt < ATT_D / 8; ++kt) {
            u32 ah[ATT_WM][4], al[ATT_WM][4];
            att_a_frag<SPLIT, !SPLIT>(qf[kt], ah, al);
#pragma unroll
            for (int nt = 0; nt < ATT_BK / 8; ++nt) {
                const float2 kv = *reinterpret_cast<const float2*>(kss + (nt * 8 + g) * KS_STRIDE + kt * 8 + 2 * t);
                float* c[ATT_WM];
#pragma unroll
                for (int mt = 0; mt < ATT_WM; ++mt) c[mt] = s[mt][nt];
                att_mma_f32<SPLIT>(c, ah, al, kv.x, kv.y);
            }
        }
        if (SPLIT)
#pragma unroll
            for (int mt = 0; mt < ATT_WM; ++mt)
#pragma unroll
                for (int nt = 0; nt < ATT_BK / 8; ++nt)
                    seen += (s[mt][nt][0] + s[mt][nt][1]) + (s[mt][nt][2] + s[mt][nt][3]);
        if (tile_needs_mask(q0 + P, j * ATT_BK, Tk, window)) mask_tile(s, wrow0 + P, j * ATT_BK, Tk, window);
        softmax_update(s, st, o, scale_log2);
        att_next(j < last, [&] { load_tile_f32(stage ? vs0 : vs1, VS_STRIDE, v + koff, (j + 1) * ATT_BK, ATT_BK, Tk, tok); });
        // O += P V, one 8-key step at a time; A column t ↔ key 2t, t+4 ↔ key 2t+1.
#pragma unroll
        for (int kt = 0; kt < ATT_BK / 8; ++kt) {
            float p[ATT_WM][4];
#pragma unroll
            for (int mt = 0; mt < ATT_WM; ++mt) {
                p[mt][0] = s[mt][kt][0];
                p[mt][1] = s[mt][kt][2];
                p[mt][2] = s[mt][kt][1];
                p[mt][3] = s[mt][kt][3];
            }
            u32 ph[ATT_WM][4], pl[ATT_WM][4];
            att_a_frag<SPLIT>(p, ph, pl);
            const float* v0 = vss + (kt * 8 + 2 * t) * VS_STRIDE + g;
#pragma unroll
            for (int dt = 0; dt < ATT_D / 8; ++dt) {
                float* c[ATT_WM];
#pragma unroll
                for (int mt = 0; mt < ATT_WM; ++mt) c[mt] = o[mt][dt];
                att_mma_f32<SPLIT>(c, ph, pl, v0[dt * 8], v0[VS_STRIDE + dt * 8]);
            }
        }
    }
    if (SPLIT) {
        if (__any_sync(0xffffffffu, !isfinite(seen)) && lane == 0) atomicExch(&overflow, 1);
        __syncthreads();
        if (overflow) {
            // The rows' statistics are not written: flag says so to the backward (where given).
            if (flag && threadIdx.x == 0) *flag = 1.f;
            const int r = q0 + threadIdx.x;
            if (threadIdx.x < ATT_BQ && r < T)
                attn_row_f64<float>(q + off, k + koff, v + koff, y + off, tok, tok, ATT_D, ATT_D, r, P, window, scale);
            return;
        }
    }
    att_finish(y + off, part, o, st, wrow0, T, tok, stats);
}

extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32, 1)
    attn_mma_tf32(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  float* __restrict__ y, int B, int T, int H, int window, float scale_log2,
                  float* __restrict__ stats, const int* __restrict__ prefix, int Nk, float* __restrict__ part) {
    attn_f32_body<false>(q, k, v, y, T, H, window, scale_log2, stats, 0.0, nullptr, prefix, Nk, part);
}

// The exact mode's kernel on f32 inputs (scale: σ in double, for rows computed again in double;
// flag: null, or set to 1 where a block computed its rows again and wrote no statistics).
extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32, 1)
    attn_mma_tf32x3(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                    float* __restrict__ y, int B, int T, int H, int window, float scale_log2,
                    float* __restrict__ stats, double scale, float* __restrict__ flag,
                    const int* __restrict__ prefix, int Nk) {
    attn_f32_body<true>(q, k, v, y, T, H, window, scale_log2, stats, scale, flag, prefix, Nk, nullptr);
}
