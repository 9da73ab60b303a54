// The shared bottom of the log-linear family's chunked kernels (loglinear_ssd.cu, loglinear_wy.cu,
// loglinear_state_pass.cu, loglinear_output.cu), prepended to each by the host (loglinear/common.rs
// on the host side): the chunk length per scalar type, tile sizes, the shared-memory GEMM and store
// of the FMA kernels, load staging, the chunk-local prefix sums γ, the chunk's raw scores, the
// four-float loads of the tensor-core kernels, and the compile-time head dims.
// Layouts: q, k [B,T,H,Dk]; v, y [B,T,H,Dv]; g [B,T,H]; lam [B,T,H,L] (weights, mapped).

template <typename T> struct Llc;
template <> struct Llc<float> {
    static constexpr int CH = 64, CBITS = 6;
};
template <> struct Llc<double> {
    static constexpr int CH = 32, CBITS = 5;
};
#define LLC_KT 16  // reduction tile
#define LLC_NT 64  // output column tile (value columns or key rows)
#define LLC_LD (LLC_NT + 1)
// Row length (floats) of the tensor-core kernels' staged K and V tiles of 64 columns (≡ 8 mod 32).
#define LLT_LDV 72

__device__ inline int llc_bitlen(unsigned x) { return x == 0u ? 0 : 32 - __clz((int)x); }

// Index of tree entry (level e, bh, block m): levels one after the other, each [BH][⌊NC/2^e⌋].
__device__ inline long long llc_entry(int e, int bh, int m, int nc, int BH) {
    long long s = 0;
    for (int l = 0; l < e; ++l) s += (long long)(nc >> l);
    return s * BH + (long long)bh * (nc >> e) + m;
}

// The states chunk i reads between chunks (thread 0 of llc_out / llc_out_tc; returns how many):
// for every set bit e − 1 of i, its tree entry (the level-(e−1) block 2·(i ≫ e)), the decay from
// that block's end to the chunk's start (the entries of the lower set bits summed) and e; with
// direct = 1 the one state entering chunk i (entry bh·NC + i), none for a first chunk (i = 0, or a
// sequence's first chunk in a packed batch: first); direct = 2 the same with a state entering a
// first chunk too (a run from an initial state, docs/math.md §7).
__device__ inline int llc_levels(int i, bool first, int bh, int nc, int direct, const double* A, long long* ent,
                                 double* dec, int* lev) {
    if (direct) {
        ent[0] = (long long)bh * nc + i;
        dec[0] = 0.0;
        return (!first || direct == 2) ? 1 : 0;
    }
    int np = 0;
    double d = 0.0;
    for (int e = 1; e <= llc_bitlen((unsigned)i); ++e) {
        if (!((i >> (e - 1)) & 1)) continue;
        ent[np] = llc_entry(e - 1, bh, (i >> e) << 1, nc, gridDim.y);
        dec[np] = d;
        lev[np] = e;
        d += A[ent[np]];
        ++np;
    }
    return np;
}

// Where a block of the FMA chunk kernels works (grid (chunks, B·H, …), 256 threads as a 16 × 16 grid
// tx, ty): chunk i = blockIdx.x of batch·head bh = blockIdx.y (b = bh / H, h = bh mod H), its first
// token i0 and its n ≤ CH tokens, and row0, the [B,T,H] row of its token 0 (token r at row0 + r·H).
struct LlcChunk {
    int i, bh, b, h, tid, tx, ty, i0, n;
    long long row0;
};
template <int CH>
__device__ __forceinline__ LlcChunk llc_chunk(int Tn, int H) {
    LlcChunk c;
    c.i = blockIdx.x, c.bh = blockIdx.y;
    c.b = c.bh / H, c.h = c.bh % H;
    c.tid = threadIdx.x, c.tx = c.tid % 16, c.ty = c.tid / 16;
    c.i0 = c.i * CH, c.n = min(CH, Tn - c.i0);
    c.row0 = ((long long)c.b * Tn + c.i0) * H + c.h;
    return c;
}

// acc[i][j] += Σ_κ X[κ][ty + 16 i] · Y[κ][tx + 16 j] (X, Y in shared memory, rows of LDX / LDY).
template <typename T, int RI, int RJ, int LDX, int LDY>
__device__ inline void llc_gemm(T (&acc)[RI][RJ], const T* X, const T* Y, int K, int ty, int tx) {
#pragma unroll 4
    for (int kk = 0; kk < K; ++kk) {
        T xr[RI], yr[RJ];
#pragma unroll
        for (int i = 0; i < RI; ++i) xr[i] = X[kk * LDX + ty + 16 * i];
#pragma unroll
        for (int j = 0; j < RJ; ++j) yr[j] = Y[kk * LDY + tx + 16 * j];
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
            for (int j = 0; j < RJ; ++j) acc[i][j] = fma(xr[i], yr[j], acc[i][j]);
    }
}

// The entries of a thread's RI × RJ tile of a chunk block as llc_gemm leaves it: the statement after
// LLC_TILE_EACH(RI, RJ, a, b, r, c, r0, c0) runs for entry acc[a][b] at row r = r0 + ty + 16a,
// column c = c0 + tx + 16b of the block placed at (r0, c0) (ty, tx: the thread's place in the
// 16 × 16 grid, in scope; r0 and c0 go in unparenthesised, so that the sums associate left to right
// as written). A macro rather than a helper taking a lambda: NVRTC compiles the lambda form of
// llc_out_dl to other machine code (llc_out_dl_f32 at Dk = Dv = 64: 98 → 128 registers).
#define LLC_TILE_EACH(RI, RJ, a, b, r, c, r0, c0)                                                          \
    _Pragma("unroll") for (int a = 0; a < (RI); ++a) _Pragma("unroll") for (int b = 0; b < (RJ); ++b)      \
        if (const int r = r0 + ty + 16 * a, c = c0 + tx + 16 * b; true)

// Stores a thread's RI × 4 tile of a chunk's block (rows ty + 16a, columns c0 + tx + 16jj, as
// llc_gemm leaves it) into x laid out as rows (row0 + r·H) of D columns: rows below n, columns
// below D only.
template <typename T, int RI>
__device__ inline void llc_store(const T (&acc)[RI][4], T* x, long long row0, int H, int D, int n, int c0, int ty,
                                 int tx) {
    LLC_TILE_EACH(RI, 4, a, jj, r, c, 0, c0) {
        if (r < n && c < D) x[(row0 + (long long)r * H) * D + c] = acc[a][jj];
    }
}

// Moves `total` elements from `fetch(idx)` to `put(idx, value)`, idx = threadIdx.x + u·NT for u <
// PER: every load is issued before the first store, so that a tile's global loads are in flight
// together rather than one round trip per loop iteration.
template <typename T, int PER, int NT, typename Fetch, typename Put>
__device__ __forceinline__ void llc_stage(int total, Fetch fetch, Put put) {
    T r[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int idx = threadIdx.x + u * NT;
        r[u] = idx < total ? fetch(idx) : T{};
    }
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int idx = threadIdx.x + u * NT;
        if (idx < total) put(idx, r[u]);
    }
}

// γ_r of chunk i0..i0+n (γ_r = γ_{n−1} for r ≥ n) into gam[CH]; has_g = 0: no decay (γ ≡ 0).
// Inclusive prefix sum of x over threads 0..CH−1 (CH ≤ 64) by warp shuffles; every thread of the
// block calls it (it synchronises); tmp holds one double. The result is meaningful for tid < CH.
template <int CH>
__device__ inline double llc_prefix(double x, double* tmp) {
    const int tid = threadIdx.x, lane = tid & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (CH > 32) {
        if (tid == 31) *tmp = x;
        __syncthreads();
        if (tid >= 32 && tid < 64) x += *tmp;
    }
    return x;
}

template <typename T, int CH>
__device__ inline void llc_gamma(double* gam, double* gtmp, const T* g, int has_g, long long rowbase, int H, int n) {
    const int tid = threadIdx.x;
    const double x = (tid < CH && has_g && tid < n) ? (double)g[rowbase + (long long)tid * H] : 0.0;
    const double p = llc_prefix<CH>(x, gtmp);
    if (tid < CH) gam[tid] = p;
    __syncthreads();
}

// The chunk's raw scores acc[a][b'] = q_r · k_s (r = ty + 16a, s = tx + 16b', rows ≥ n zero),
// through key-column tiles of 16 staged transposed in Xs, Ys [16][65]. 256 threads.
template <typename T, int CH>
__device__ inline void llc_qk(T (&acc)[CH / 16][CH / 16], const T* q, const T* k, T* Xs, T* Ys, long long row0,
                              int H, int Dk, int n) {
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    for (int c0 = 0; c0 < Dk; c0 += LLC_KT) {
        for (int idx = tid; idx < LLC_KT * CH; idx += 256) {
            const int r = idx / LLC_KT, kk = idx % LLC_KT, c = c0 + kk;
            T qv = (T)0, kv = (T)0;
            if (r < n && c < Dk) {
                const long long row = row0 + (long long)r * H;
                qv = q[row * Dk + c];
                kv = k[row * Dk + c];
            }
            Xs[kk * LLC_LD + r] = qv;
            Ys[kk * LLC_LD + r] = kv;
        }
        __syncthreads();
        llc_gemm<T, CH / 16, CH / 16, LLC_LD, LLC_LD>(acc, Xs, Ys, LLC_KT, ty, tx);
        __syncthreads();
    }
}

// An entry as f32 (f32 as it is; bf16 — its 16 bits — exactly), and four consecutive entries
// from one 16-byte (f32) or 8-byte (bf16) load.
__device__ __forceinline__ float llc_f(float x) { return x; }
__device__ __forceinline__ float llc_f(mx_bf16 b) { return mx_bf16_f32(b); }
// An f32 value stored as T: itself, or rounded to bf16 (nearest even).
template <typename T>
__device__ __forceinline__ T llc_as(float x) {
    if constexpr (sizeof(T) == 2)
        return mx_f32_bf16(x);
    else
        return x;
}
__device__ __forceinline__ float4 llc_f4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 llc_f4(const mx_bf16* p) {
    return mx_bf16x4_f32(*reinterpret_cast<const uint2*>(p));
}
// Four consecutive entries p[off + c .. off + c + 3] of a row of D entries as f32, entries at or
// past D read as 0: one load when vec (D % 4 = 0 and p aligned to four entries, so that off + c is
// a multiple of 4), else four loads.
template <typename T>
__device__ __forceinline__ float4 llc_ld4(const T* p, long long off, int c, int D, bool vec) {
    float4 r = {0.f, 0.f, 0.f, 0.f};
    if (vec) {
        if (c < D) r = llc_f4(p + off + c);
    } else {
        if (c < D) r.x = llc_f(p[off + c]);
        if (c + 1 < D) r.y = llc_f(p[off + c + 1]);
        if (c + 2 < D) r.z = llc_f(p[off + c + 2]);
        if (c + 3 < D) r.w = llc_f(p[off + c + 3]);
    }
    return r;
}
// Stores x · s, rounded to tf32, at dst[0..3].
__device__ __forceinline__ void llc_put4_tf32(float* dst, float4 x, float s) {
    dst[0] = __uint_as_float(mx_tf32(s * x.x));
    dst[1] = __uint_as_float(mx_tf32(s * x.y));
    dst[2] = __uint_as_float(mx_tf32(s * x.z));
    dst[3] = __uint_as_float(mx_tf32(s * x.w));
}
__device__ __forceinline__ bool llc_al16(const void* p) { return mx_aligned(p, 16); }
// Columns c0 .. c0 + 63 of a chunk's rows r < n of src (row r at (row0 + r·H)·D, D columns), row
// r times w(r), into dst (64 rows of LD floats), rounded to tf32 when round; rows from n on and
// columns from D on zero. 256 threads, every load issued before the first store (llc_stage); vec:
// 16-byte loads (llc_ld4).
template <int LD, typename TI, typename Wt>
__device__ __forceinline__ void llc_stage_tile(float* dst, const TI* src, long long row0, int H, int D, int c0, int n,
                                               bool vec, bool round, Wt w) {
    llc_stage<float4, 4, 256>(
        64 * 16,
        [&](int idx) {
            const int r = idx >> 4;
            return r < n ? llc_ld4(src, (row0 + (long long)r * H) * D + c0, (idx & 15) * 4, D - c0, vec)
                         : float4{0.f, 0.f, 0.f, 0.f};
        },
        [&](int idx, float4 x) {
            const int r = idx >> 4;
            float* d = dst + r * LD + (idx & 15) * 4;
            const float s = w(r);
            if (round) {
                llc_put4_tf32(d, x, s);
            } else {
                d[0] = s * x.x, d[1] = s * x.y, d[2] = s * x.z, d[3] = s * x.w;
            }
        });
}
// Asynchronous copies global → shared (cp.async) of 4 or 8 bytes, or of 16; with valid = 0 the
// destination is zero-filled and nothing is read.
__device__ __forceinline__ void llc_cp_async(void* dst, const void* src, int bytes, int valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
    else if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 8 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void llc_cp_async16(void* dst, const void* src, int valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}

// A packed batch's chunk table (B = 1, sequences packed along T; docs/math.md §7.2): every chunk
// lies inside one sequence, which restarts the chunking. For NC chunks and NS sequences,
// tab[j] = the first token of chunk j, tab[NC + j] = its length, plus 1 << 16 where it is its
// sequence's first chunk, tab[2·NC + s] = the first chunk of sequence s (s ≤ NS; chunk indices run
// over all sequences in order), and tab[2·NC + NS + 1 + k] = the sequence with the k-th most
// chunks (ties in order). has_tab = 0: no table, chunk j holds tokens CH·j .. CH·j + CH − 1 of
// every batch row, and only chunk 0 is first.
struct LlcSpan {
    int i0, n;
    bool first;
};
__device__ __forceinline__ LlcSpan llc_span(const int* tab, int has_tab, int j, int nc, int Tn, int CH) {
    if (!has_tab) return {j * CH, min(CH, Tn - j * CH), j == 0};
    const int m = tab[nc + j];
    return {tab[j], m & 0xffff, (m >> 16) != 0};
}
// The chunks [jb, je) the per-(row, head) pass of launch row `row` (of NS·H with a table) walks,
// and the state's row it reads and writes (S0, ST): without a table every chunk of batch row b,
// row = bh = b·H + h; with one, sequence s's chunks, the state's row s·H + h (and the chunk states
// of head h are those of batch row 0), where s is the sequence with the (row / H)-th most chunks:
// blocks start in launch order and each walks its sequence's chunks one after the other, so the
// longest walks start first and the short ones fill in behind them (with the sequences in order,
// a long one started last would run alone at the end: a packed batch's scan took 3.6× the time of
// one sequence's on the H200).
struct LlcRange {
    int bh, jb, je, row;
};
__device__ __forceinline__ LlcRange llc_range(const int* tab, int has_tab, int row, int H, int nc, int ns) {
    if (!has_tab) return {row, 0, nc, row};
    const int s = tab[2 * nc + ns + 1 + row / H], h = row % H;
    return {h, tab[2 * nc + s], tab[2 * nc + s + 1], s * H + h};
}

// Copies rows [0, nrows) × columns [0, ncols) of a tile whose row r starts at src + r·rs into the
// R × C shared tile dst (element (r, c) at dst + at(r, c)), zero-filling the rest: 16-byte copies
// when vec (base and rows 16-byte aligned, ncols a multiple of 16 bytes), else element by element
// (4-byte cp.async for f32, plain loads and stores for bf16). 128 threads.
template <int R, int C, typename T, typename At>
__device__ __forceinline__ void lld_tile(T* dst, const T* src, long long rs, int nrows, int ncols, bool vec, At at) {
    constexpr int E = 16 / sizeof(T);  // elements per 16 bytes
    if (vec) {
        for (int idx = threadIdx.x; idx < R * (C / E); idx += 128) {
            const int r = idx / (C / E), c = (idx % (C / E)) * E, ok = r < nrows && c < ncols;
            llc_cp_async16(dst + at(r, c), ok ? src + r * rs + c : src, ok);
        }
    } else {
        for (int idx = threadIdx.x; idx < R * C; idx += 128) {
            const int r = idx / C, c = idx % C;
            const bool ok = r < nrows && c < ncols;
            if (sizeof(T) == 4)
                llc_cp_async(dst + at(r, c), ok ? src + r * rs + c : src, 4, ok);
            else
                dst[at(r, c)] = ok ? src[r * rs + c] : T(0);
        }
    }
}
// acc += A·B over k < kend (a multiple of 8) as tf32 m16n8k8 mma, for a warp's 16 rows from mr and
// 32 columns from nb (g = lane / 4, t = lane % 4): A row-major with rows of LD floats, k along the
// row; B = bt rows k, or with b_t B[k][col] = bt[col][k] (the transpose of a row-major tile).
// Operands already rounded to tf32.
template <int LD>
__device__ __forceinline__ void llc_mma_rows(float (&acc)[4][4], const float* a, const float* bt, int kend, bool b_t,
                                             int mr, int nb, int g, int t) {
    for (int k8 = 0; k8 < kend; k8 += 8) {
        const float* ap = a + (mr + g) * LD + k8 + t;
        const unsigned a0 = __float_as_uint(ap[0]), a1 = __float_as_uint(ap[8 * LD]), a2 = __float_as_uint(ap[4]),
                       a3 = __float_as_uint(ap[8 * LD + 4]);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const int col = nb + nt * 8 + g;
            const float* bp = b_t ? bt + col * LD + k8 + t : bt + (k8 + t) * LD + col;
            const unsigned b0 = __float_as_uint(bp[0]), b1 = __float_as_uint(b_t ? bp[4] : bp[4 * LD]);
            mx_mma_tf32(acc[nt], a0, a1, a2, a3, b0, b1);
        }
    }
}

// The entries of a warp's accumulators as llc_mma_rows leaves them: the statement after
// LLC_MMA_EACH(nt, u, r, c, r0, c0) runs for acc[nt][u] at row r = r0 + mr + g + 8⌊u/2⌋ and
// column c = c0 + nb + 8nt + 2t + (u mod 2) (mr, nb, gi = g and tg = t in scope, as they are passed
// to llc_mma_rows; r0 and c0 go in unparenthesised, as in LLC_TILE_EACH).
#define LLC_MMA_EACH(nt, u, r, c, r0, c0)                                                                  \
    _Pragma("unroll") for (int nt = 0; nt < 4; ++nt) _Pragma("unroll") for (int u = 0; u < 4; ++u)         \
        if (const int r = r0 + mr + gi + ((u) < 2 ? 0 : 8), c = c0 + nb + 8 * (nt) + 2 * tg + ((u) & 1); true)

// Σ_{j' < j} popcount(j'): for each bit b, the numbers below j with bit b set.
__device__ inline long long llc_popsum(long long j) {
    long long s = 0;
    for (int b2 = 0; b2 < 40; ++b2) {
        const long long p = 1LL << b2;
        if (p > j) break;
        s += (j >> (b2 + 1)) * p + max(0LL, (j & (2 * p - 1)) - p);
    }
    return s;
}

// Head dims fixed at compile time: the host compiles the chunk kernels for the call's Dk and Dv
// (-DLLC_DK=…, -DLLC_DV=…) and passes the same values as arguments; each kernel starts with
// LLC_FIX_DIMS(Dk, Dv), so that loop trip counts, vector-load tests and index arithmetic fold
// into constants. Without the defines the kernels take the arguments as they are.
#if defined(LLC_DK) && defined(LLC_DV)
#define LLC_FIX_DIMS(Dk, Dv) (Dk = LLC_DK, Dv = LLC_DV)
#define DH_DKP ((LLC_DK + 15) / 16 * 16)  // Dk rounded up to whole k-steps of 16
#else
#define LLC_FIX_DIMS(Dk, Dv) ((void)0)
#endif
