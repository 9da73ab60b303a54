// The `fast` backward of the log-linear base mixers (docs/math.md §2.7, docs/gradients.md "GPU"),
// launched from src/loglinear/backward.rs. Tensors are row-major: q, k [B, T, H, Dk], v, dy
// [B, T, H, Dv], g, beta [B, T, H]. Every sum runs in a fixed order (no float atomics), so the
// same inputs give the same bits.
//
// Gated DeltaNet's is in loglinear_backward_chunked.cu.
//
// Linear attention and Mamba-2 (transposed operators): the gradients are forward runs on
// reversed sequences, joined by
// - llb_reverse:   out[b, t, h, :] = c · x[b, M−1−t, h, :] for t < N, zero where M−1−t is not a
//                  token of x (c = σ for dy, else 1): M = N = T reverses; M = N = T' > T reverses
//                  into T' rows, the first T' − T zero (padded to whole chunks); M = T', N = T
//                  reverses such a run back;
// - llb_reverse_g: the reversed log-decays over N rows, g'_0 = 0, g'_j = g_{N−j} (j ≥ 1; zero past
//                  T), so that G'_{N−1−s} − G'_{N−1−t} = G_t − G_s;
// - llb_dg_chunk:  the decay gradient from the states at the chunk boundaries (below);
// - llb_dg_*:      the lifts' decay gradient: dG_t = q_t·dq_t − k_t·dk_t (a warp per token) and
//                  dg_i = Σ_{t ≥ i} dG_t by a tiled suffix scan, dots and sums in f64 (below).
// From a state (docs/math.md §7.1, "The CUDA backward from a state"), two per-(b, h) state maps
// [B·H, R, C]:
// - llb_state_t:     out[bh, c, r] = x[bh, r, c] (S_0ᵀ and S̄_Tᵀ for the runs that read them);
// - llb_state_decay: out[bh, :] = e^(g[b, 0, h]) · x[bh, :] (S̄_0 from the reversed run's final
//                    state, which lacks the first token's decay).

template <typename T> __device__ inline T llb_warp_sum(T x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// An activation as f64 (bf16 widened exactly).
__device__ __forceinline__ double llb_f64(float x) { return (double)x; }
__device__ __forceinline__ double llb_f64(double x) { return x; }
__device__ __forceinline__ double llb_f64(mx_bf16 x) { return (double)mx_bf16_f32(x); }

// dG_t = q_t·dq_t − k_t·dk_t of the token row starting at `base` (Dk entries), in f64, by one
// warp: lanes over the entries (d = lane + 32 j, coalesced), then the warp's sum (every lane has it).
template <typename V>
__device__ inline double llb_row_dg(const V* q, const V* dq, const V* k, const V* dk, long long base, int Dk, int lane) {
    double x = 0.0;
    for (int d = lane; d < Dk; d += 32)
        x += llb_f64(q[base + d]) * llb_f64(dq[base + d]) - llb_f64(k[base + d]) * llb_f64(dk[base + d]);
    return llb_warp_sum(x);
}

// x [B, Tn, H, D] → out [B, N, H, D] (llb_reverse above): a block per output token row (grid-stride
// over the B·N rows), whose H·D entries are contiguous in x and in out — a copy without a division
// per entry (four 64-bit divisions per entry made it 120 µs for 64 MiB on the H200, 48 µs with a
// load per entry). Where a row's bytes are a multiple of 16 and x and out are 16-byte aligned
// (every row then is), each thread moves 16-byte vectors (the host sizes the block to a row's
// vectors); entry by entry otherwise. c · x in the element's type (a bf16 element scaled in f32
// and rounded back; c = 1 copies it).
__device__ __forceinline__ float llb_scaled(float x, float c) { return c * x; }
__device__ __forceinline__ double llb_scaled(double x, double c) { return c * x; }
__device__ __forceinline__ mx_bf16 llb_scaled(mx_bf16 x, float c) {
    return c == 1.0f ? x : mx_f32_bf16(c * mx_bf16_f32(x));
}
// llb_scaled of each element of a 16-byte vector.
template <typename T, typename S> __device__ __forceinline__ uint4 llb_scaled16(uint4 w, S c) {
    union {
        uint4 u;
        T e[16 / sizeof(T)];
    } a;
    a.u = w;
#pragma unroll
    for (int j = 0; j < (int)(16 / sizeof(T)); ++j) a.e[j] = llb_scaled(a.e[j], c);
    return a.u;
}

template <typename T, typename S>
__device__ void llb_reverse(const T* x, T* out, int B, int Tn, int H, int D, int M, int N, S c) {
    constexpr int P = 16 / sizeof(T);
    const int HD = H * D;
    const bool vec = HD % P == 0 && ((unsigned long long)x | (unsigned long long)out) % 16 == 0;
    const long long rows = (long long)B * N;
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        const long long b = row / N;
        const int src = M - 1 - (int)(row - b * N);
        const bool in = src >= 0 && src < Tn;
        const long long from = in ? (b * Tn + src) * HD : 0;
        if (vec) {
            const uint4* xs = reinterpret_cast<const uint4*>(x + from);
            uint4* o = reinterpret_cast<uint4*>(out + row * HD);
            for (int i = threadIdx.x; i < HD / P; i += blockDim.x) {
                uint4 w = make_uint4(0u, 0u, 0u, 0u);
                if (in) {
                    w = xs[i];
                    if (c != S(1)) w = llb_scaled16<T, S>(w, c);
                }
                o[i] = w;
            }
        } else {
            T* o = out + row * HD;
#pragma unroll 4
            for (int i = threadIdx.x; i < HD; i += blockDim.x) o[i] = in ? llb_scaled(x[from + i], c) : T(0);
        }
    }
}

// g [B, Tn, H] → out [B, N, H] (llb_reverse_g above).
template <typename T> __device__ void llb_reverse_g(const T* g, T* out, int B, int Tn, int H, int N) {
    const long long n = (long long)B * N * H;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const int h = (int)(e % H);
        const long long bt = e / H;
        const int j = (int)(bt % N);
        const long long b = bt / N;
        out[e] = j == 0 || N - j >= Tn ? T(0) : g[(b * Tn + (N - j)) * H + h];
    }
}

// The decay gradient of linear attention's and Mamba-2's backward from the chunk boundaries
// (docs/math.md §2.7): dg_r = Σ_{s < r ≤ t} σ e^(G_t − G_s) (q_t·k_s)(dy_t·v_s), the pairs that
// straddle r. For r in chunk m (tokens t0 = m·C … t1 − 1), with b = t1 the next boundary,
//     dg_r = Σ_{r ≤ t < t1} (q_t·dq_t − k_t·dk_t) + dg_b,
//     dg_b = e^(g_b) ⟨Hq_{m+1}, Hk_{NC−1−m}⟩   (b < T),   dg_T = ⟨S̄_T, S_T⟩ (0 without S̄_T),
// where Hq_j is the dq run's state entering its chunk j, S_{jC−1} = Σ_{s < jC} e^(G_{jC−1} − G_s)
// v_s k_sᵀ (and S_0's term), and Hk_j the reversed dk run's state entering its chunk j, that run
// padded to NC·C rows so that its chunk NC − j starts at original token j·C: Σ_{t ≥ jC}
// e^(G_t − G_{jC}) σ dy_t q_tᵀ (and S̄_T's term) — both [Dv][Dk] in the same layout, so the inner
// product is entry by entry. The suffix sum runs inside one chunk, so the rounding of dq and dk
// (tf32 products) enters over at most C tokens instead of the rest of the sequence, where q·dq
// and k·dk cancel. One block of 256 threads per (chunk, b·h); every sum in a fixed order, in f64.
// hq, hk: [B·H][NC][Dk·Dv]; df the final state's cotangent [B·H][Dv][Dk], ft the final state
// transposed [B·H][Dk][Dv] (⟨S̄_T, S_T⟩ = Σ_{i, j} df[i][j] ft[j][i]); C ≤ 64. It reads q, dq, k,
// dk and two states per chunk once: 0.40 GB in 196 µs at (1, 16384, 16, 64) on the H200 (Nsight
// Compute, base clocks), about 2 TB/s; a variant with eight loads in flight a thread took 116
// registers and 237 µs.
template <typename V, typename T>
__device__ void llb_dg_chunk(const V* q, const V* dq, const V* k, const V* dk, const T* g, const T* hq, const T* hk,
                             const T* df, const T* ft, int has_tail, T* dg, int Tn, int H, int Dk, int Dv, int C,
                             int NC) {
    __shared__ double red[256];
    __shared__ double a[64];
    const int m = blockIdx.x, bh = blockIdx.y, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int b = bh / H, h = bh % H;
    const int t0 = m * C, t1 = min(Tn, t0 + C);
    const long long DD = (long long)Dk * Dv;
    double x = 0.0;
    if (m + 1 < NC) {
        const T* A = hq + ((long long)bh * NC + m + 1) * DD;
        const T* Bk = hk + ((long long)bh * NC + (NC - 1 - m)) * DD;
        for (long long e = tid; e < DD; e += blockDim.x) x += (double)A[e] * (double)Bk[e];
    } else if (has_tail) {
        const long long s0 = (long long)bh * DD;
        for (long long e = tid; e < DD; e += blockDim.x) {
            const long long i = e / Dk, j = e - i * Dk;
            x += (double)df[s0 + e] * (double)ft[s0 + j * Dv + i];
        }
    }
    red[tid] = x;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (tid < w) red[tid] += red[tid + w];
        __syncthreads();
    }
    for (int t = t0 + warp; t < t1; t += blockDim.x / 32) {
        const double y = llb_row_dg(q, dq, k, dk, ((long long)(b * Tn + t) * H + h) * Dk, Dk, lane);
        if (lane == 0) a[t - t0] = y;
    }
    __syncthreads();
    if (tid == 0) {
        double acc = red[0];
        if (m + 1 < NC) acc *= exp((double)g[((long long)b * Tn + t1) * H + h]);
        for (int t = t1 - 1; t >= t0; --t) {
            acc += a[t - t0];
            dg[((long long)b * Tn + t) * H + h] = (T)acc;
        }
    }
}

// The decay gradient dg_i = Σ_{t ≥ i} dG_t, dG_t = q_t·dq_t − k_t·dk_t, in four token-parallel
// launches, all in f64 and in a fixed order (the same bits every run). The scratch a [B·H, T]
// (f64) holds dG, and s [B·H, NT] the sums of tiles of L tokens (NT = ⌈T/L⌉, L from the host):
// - llb_dg_dot:  a warp per (b, t, h) row, grid-stride: lanes read the row's Dk entries
//                coalesced (d = lane + 32 j), the warp sums them; a[bh, t] = dG_t;
// - llb_dg_tile: a thread per (bh, tile): s[bh, c] = Σ over the tile's tokens, last to first;
// - llb_dg_scan: a thread per bh: s[bh, c] ← Σ_{c' > c} s[bh, c'] (exclusive suffix sums, last
//                tile to first);
// - llb_dg_out:  a thread per (bh, tile): walks its tokens last to first from s[bh, c],
//                dg[b, t, h] = s[bh, c] + Σ_{t ≤ t' < tile end} a[bh, t'] (one rounding to T).
template <typename T>
__device__ void llb_dg_dot(const T* q, const T* dq, const T* k, const T* dk, double* a, int B, int Tn, int H, int Dk) {
    const long long rows = (long long)B * Tn * H;
    const long long warps = (long long)gridDim.x * (blockDim.x / 32);
    const int lane = threadIdx.x % 32;
    for (long long row = gtid() / 32; row < rows; row += warps) {  // row = (b·T + t)·H + h
        const int h = (int)(row % H);
        const long long bt = row / H;
        const long long t = bt % Tn, b = bt / Tn;
        const double x = llb_row_dg(q, dq, k, dk, row * Dk, Dk, lane);
        if (lane == 0) a[(b * H + h) * Tn + t] = x;
    }
}

template <typename T> __device__ void llb_state_t(const T* x, T* out, int BH, int R, int C) {
    const long long n = (long long)BH * R * C;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {  // e = (bh·C + c)·R + r, the output's order
        const long long m = e / R;
        const int r = (int)(e - m * R);
        const long long bh = m / C;
        const int c = (int)(m - bh * C);
        out[e] = x[(bh * R + r) * C + c];
    }
}

template <typename T> __device__ void llb_state_decay(const T* x, const T* g, T* out, int B, int Tn, int H, int N) {
    const long long n = (long long)B * H * N;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {  // e = bh·N + i
        const long long bh = e / N;
        const long long b = bh / H;
        const int h = (int)(bh - b * H);
        out[e] = (T)mx_exp(g[b * Tn * H + h]) * x[e];
    }
}

__device__ void llb_dg_tile_sums(const double* a, double* s, int BH, int Tn, int L, int NT) {
    const long long n = (long long)BH * NT;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {  // e = bh·NT + c
        const long long bh = e / NT;
        const int c = (int)(e - bh * NT);
        const int t0 = c * L, t1 = min(Tn, t0 + L);
        double x = 0.0;
        for (int t = t1 - 1; t >= t0; --t) x += a[bh * Tn + t];
        s[e] = x;
    }
}

__device__ void llb_dg_scan_tiles(double* s, int BH, int NT) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long bh = gtid(); bh < BH; bh += stride) {
        double acc = 0.0;
        for (int c = NT - 1; c >= 0; --c) {
            const double x = s[bh * NT + c];
            s[bh * NT + c] = acc;
            acc += x;
        }
    }
}

template <typename T>
__device__ void llb_dg_out(const double* a, const double* s, T* dg, int BH, int Tn, int H, int L, int NT) {
    const long long n = (long long)BH * NT;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long e = gtid(); e < n; e += stride) {
        const long long bh = e / NT;
        const int c = (int)(e - bh * NT);
        const long long b = bh / H;
        const int h = (int)(bh % H);
        const int t0 = c * L, t1 = min(Tn, t0 + L);
        double acc = s[e];
        for (int t = t1 - 1; t >= t0; --t) {
            acc += a[bh * Tn + t];
            dg[(b * Tn + t) * H + h] = (T)acc;
        }
    }
}

#define LLB_EXPORT(T, S)                                                                                       \
    extern "C" __global__ void llb_reverse_##S(const T* x, T* out, int B, int Tn, int H, int D, int M, int N,   \
                                               T c) {                                                        \
        llb_reverse<T, T>(x, out, B, Tn, H, D, M, N, c);                                                     \
    }                                                                                                        \
    extern "C" __global__ void llb_reverse_g_##S(const T* g, T* out, int B, int Tn, int H, int N) {           \
        llb_reverse_g<T>(g, out, B, Tn, H, N);                                                               \
    }                                                                                                        \
    extern "C" __global__ void llb_dg_chunk_##S(const T* q, const T* dq, const T* k, const T* dk, const T* g,  \
                                                const T* hq, const T* hk, const T* df, const T* ft,           \
                                                int has_tail, T* dg, int Tn, int H, int Dk, int Dv, int C,     \
                                                int NC) {                                                    \
        llb_dg_chunk<T, T>(q, dq, k, dk, g, hq, hk, df, ft, has_tail, dg, Tn, H, Dk, Dv, C, NC);              \
    }                                                                                                        \
    extern "C" __global__ void llb_dg_dot_##S(const T* q, const T* dq, const T* k, const T* dk, double* a,     \
                                              int B, int Tn, int H, int Dk) {                              \
        llb_dg_dot<T>(q, dq, k, dk, a, B, Tn, H, Dk);                                                        \
    }                                                                                                        \
    extern "C" __global__ void llb_state_t_##S(const T* x, T* out, int BH, int R, int C) {                     \
        llb_state_t<T>(x, out, BH, R, C);                                                                    \
    }                                                                                                        \
    extern "C" __global__ void llb_state_decay_##S(const T* x, const T* g, T* out, int B, int Tn, int H,       \
                                                   int N) {                                                \
        llb_state_decay<T>(x, g, out, B, Tn, H, N);                                                          \
    }                                                                                                        \
    extern "C" __global__ void llb_dg_out_##S(const double* a, const double* s, T* dg, int BH, int Tn, int H,  \
                                              int L, int NT) {                                             \
        llb_dg_out<T>(a, s, dg, BH, Tn, H, L, NT);                                                              \
    }

LLB_EXPORT(float, f32)
LLB_EXPORT(double, f64)

// The bf16 mode's reversed runs on bf16 activations (their scale in f32) and its decay gradient
// from bf16 q, dq, k, dk with f32 log-decays and chunk states.
extern "C" __global__ void llb_reverse_bf16(const mx_bf16* x, mx_bf16* out, int B, int Tn, int H, int D, int M,
                                            int N, float c) {
    llb_reverse<mx_bf16, float>(x, out, B, Tn, H, D, M, N, c);
}
extern "C" __global__ void llb_dg_chunk_bf16(const mx_bf16* q, const mx_bf16* dq, const mx_bf16* k,
                                             const mx_bf16* dk, const float* g, const float* hq, const float* hk,
                                             const float* df, const float* ft, int has_tail, float* dg, int Tn, int H,
                                             int Dk, int Dv, int C, int NC) {
    llb_dg_chunk<mx_bf16, float>(q, dq, k, dk, g, hq, hk, df, ft, has_tail, dg, Tn, H, Dk, Dv, C, NC);
}

extern "C" __global__ void llb_dg_tile(const double* a, double* s, int BH, int Tn, int L, int NT) {
    llb_dg_tile_sums(a, s, BH, Tn, L, NT);
}
extern "C" __global__ void llb_dg_scan(double* s, int BH, int NT) { llb_dg_scan_tiles(s, BH, NT); }
