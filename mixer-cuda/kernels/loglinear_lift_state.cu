// The lifts' `fast` form from a state (src/loglinear/lift_state.rs, docs/math.md §7.1): the rows
// of one segment's base-mixer run and what is read back from it.
//
// A segment [c, e) of the run (absolute positions) is run twice: by the lift from zero on its own
// tokens, and by the base mixer over R = nh + no batch rows per batch row b (row b·R + r):
// - held rows r < nh, one per live level state at c (slot i = the r-th set bit of `held`): the
//   slot as the initial state, q scaled by λ_t^(i+1), v = 0 — the slot transported to each token
//   and read at its level;
// - own rows r ≥ nh, one per slot d (the (r − nh)-th set bit of `own`) that the segment's tokens
//   fill at e (token s goes to slot bitlen(e ⊕ s) − 1): zero initial state, q = 0, v kept on the
//   tokens of that slot only — their final state is the slot's new content.
//
// Sizes: the run's tensors are [B, Tn, H, w] (w the row width: Dk, Dv or 1), the segment's rows
// r0 … r0 + n − 1 of them (r0 = c − a); the row tensors [B·R, n, H, w]; λ [B, Tn, H, L]; level
// states [B, H, L, W] (W = Dv·Dk); row states [B·R, H, W].

__device__ inline int lls_bitlen(unsigned long long x) { return x == 0ull ? 0 : 64 - __clzll(x); }

// The position of the n-th set bit (from 0) of m, or −1.
__device__ inline int lls_nth_bit(unsigned long long m, int n) {
    for (int i = 0; i < 64; ++i) {
        if ((m >> i) & 1ull) {
            if (n == 0) return i;
            --n;
        }
    }
    return -1;
}

// The index of bit i among the set bits of m (its row), or −1 when bit i is clear.
__device__ inline int lls_rank(unsigned long long m, int i) {
    if (i < 0 || i >= 64 || !((m >> i) & 1ull)) return -1;
    return __popcll(m & ((1ull << i) - 1ull));
}

// The slot a token at absolute position s < e fills at e.
__device__ inline int lls_slot_of(long long s, long long e) {
    return lls_bitlen((unsigned long long)(e ^ s)) - 1;
}

// Where the held slot i goes at e (docs/math.md §7.1: token e sees the bucket of slot i at level
// max(i + 1, bitlen(e ⊕ c))).
__device__ inline int lls_dest(int i, int ub) { return (i + 1 > ub ? i + 1 : ub) - 1; }

// The row tensors from the run's. kind 0: every row a copy (k, g, β); 1: held rows
// λ_t^(slot+1) · x, own rows 0 (q); 2: held rows 0, own row d: x where the token fills slot d, else
// 0 (v); 3: held rows x, own rows 0 (the cotangent of y).
template <typename T>
__device__ void lls_spread(const T* x, const T* lam, T* out, int nb, long long tn, long long r0, int n, int h,
                           int w, int nl, unsigned long long held, unsigned long long own, long long c, long long e,
                           int kind) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * rows * n * h * w;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        long long rest = i;
        const int col = (int)(rest % w);
        rest /= w;
        const int head = (int)(rest % h);
        rest /= h;
        const int t = (int)(rest % n);
        rest /= n;
        const int r = (int)(rest % rows);
        const int b = (int)(rest / rows);
        const long long src = (((long long)b * tn + r0 + t) * h + head) * w + col;
        T val = x[src];
        if (kind == 1) {
            val = r < nh ? lam[(((long long)b * tn + r0 + t) * h + head) * nl + lls_nth_bit(held, r) + 1] * val : T(0);
        } else if (kind == 2) {
            val = (r >= nh && lls_slot_of(c + t, e) == lls_nth_bit(own, r - nh)) ? val : T(0);
        } else if (kind == 3) {
            val = r < nh ? val : T(0);
        }
        out[i] = val;
    }
}

// dst[b, r0 + t, h, col] = init[b, t, h, col] + the rows' sum. kind 0: every row (y, and the
// gradients of k, g, β); 1: held rows weighted by λ_t^(slot+1) (the gradient of q); 2: the own
// row of the token's slot (the gradient of v).
template <typename T>
__device__ void lls_gather(const T* rows_in, const T* init, const T* lam, T* dst, int nb, long long tn, long long r0,
                           int n, int h, int w, int nl, unsigned long long held, unsigned long long own, long long c,
                           long long e, int kind) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * n * h * w;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        long long rest = i;
        const int col = (int)(rest % w);
        rest /= w;
        const int head = (int)(rest % h);
        rest /= h;
        const int t = (int)(rest % n);
        const int b = (int)(rest / n);
        // Element (row r, token t, head, col) of the row tensors.
        auto at = [&](int r) { return rows_in[((((long long)b * rows + r) * n + t) * h + head) * w + col]; };
        T acc = init[i];
        if (kind == 0) {
            for (int r = 0; r < rows; ++r) acc += at(r);
        } else if (kind == 1) {
            const T* l = lam + (((long long)b * tn + r0 + t) * h + head) * nl;
            for (int r = 0; r < nh; ++r) acc += l[lls_nth_bit(held, r) + 1] * at(r);
        } else {
            const int r = lls_rank(own, lls_slot_of(c + t, e));
            if (r >= 0) acc += at(nh + r);
        }
        dst[(((long long)b * tn + r0 + t) * h + head) * w + col] = acc;
    }
}

// dlam[b, r0 + t, h, slot + 1] += Σ_col q[b, r0 + t, h, col] · dq_rows[(b, r), t, h, col] for the
// held rows r (the read weights' gradient), one thread per (b, t, h, held row).
template <typename T>
__device__ void lls_dlambda(const T* q, const T* dq_rows, T* dlam, int nb, long long tn, long long r0, int n, int h,
                            int dk, int nl, unsigned long long held, unsigned long long own) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * n * h * nh;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        long long rest = i;
        const int r = (int)(rest % nh);
        rest /= nh;
        const int head = (int)(rest % h);
        rest /= h;
        const int t = (int)(rest % n);
        const int b = (int)(rest / n);
        const T* qr = q + (((long long)b * tn + r0 + t) * h + head) * dk;
        const T* gr = dq_rows + ((((long long)b * rows + r) * n + t) * h + head) * dk;
        T acc = T(0);
        for (int col = 0; col < dk; ++col) acc += qr[col] * gr[col];
        dlam[(((long long)b * tn + r0 + t) * h + head) * nl + lls_nth_bit(held, r) + 1] += acc;
    }
}

// The row states from the level states: held row r starts from slot r-th-set-bit(held), own rows
// from zero.
template <typename T>
__device__ void lls_load(const T* slots, T* rows_out, int nb, int h, int nl, long long ws, unsigned long long held,
                         unsigned long long own) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * rows * h * ws;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        const long long x = i % ws;
        const int head = (int)((i / ws) % h);
        const int r = (int)((i / ws / h) % rows);
        const int b = (int)(i / ws / h / rows);
        rows_out[i] = r < nh ? slots[(((long long)b * h + head) * nl + lls_nth_bit(held, r)) * ws + x] : T(0);
    }
}

// The level states at e from the rows' final states: slot i is the sum of the held rows whose slot
// goes to i (lls_dest with ub = bitlen(e ⊕ c)) and of the own row of slot i.
template <typename T>
__device__ void lls_merge(const T* fin_rows, T* slots, int nb, int h, int nl, long long ws, unsigned long long held,
                          unsigned long long own, int ub) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * h * nl * ws;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        const long long x = i % ws;
        const int slot = (int)((i / ws) % nl);
        const int head = (int)((i / ws / nl) % h);
        const int b = (int)(i / ws / nl / h);
        auto fin = [&](int r) { return fin_rows[(((long long)b * rows + r) * h + head) * ws + x]; };
        T acc = T(0);
        for (int r = 0; r < nh; ++r)
            if (lls_dest(lls_nth_bit(held, r), ub) == slot) acc += fin(r);
        const int o = lls_rank(own, slot);
        if (o >= 0) acc += fin(nh + o);
        slots[i] = acc;
    }
}

// The adjoint of lls_merge: each row's final state gets the cotangent of the slot it went to.
template <typename T>
__device__ void lls_merge_adjoint(const T* dslots, T* dfin_rows, int nb, int h, int nl, long long ws,
                                  unsigned long long held, unsigned long long own, int ub) {
    const int nh = __popcll(held), rows = nh + __popcll(own);
    const long long total = (long long)nb * rows * h * ws;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        const long long x = i % ws;
        const int head = (int)((i / ws) % h);
        const int r = (int)((i / ws / h) % rows);
        const int b = (int)(i / ws / h / rows);
        const int slot = r < nh ? lls_dest(lls_nth_bit(held, r), ub) : lls_nth_bit(own, r - nh);
        dfin_rows[i] = dslots[(((long long)b * h + head) * nl + slot) * ws + x];
    }
}

// The adjoint of lls_load: slot i's cotangent is its held row's initial-state gradient (zero for a
// slot that is not held).
template <typename T>
__device__ void lls_load_adjoint(const T* ds0_rows, T* dslots, int nb, int h, int nl, long long ws,
                                 unsigned long long held, unsigned long long own) {
    const int rows = __popcll(held) + __popcll(own);
    const long long total = (long long)nb * h * nl * ws;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = gtid(); i < total; i += stride) {
        const long long x = i % ws;
        const int slot = (int)((i / ws) % nl);
        const int head = (int)((i / ws / nl) % h);
        const int b = (int)(i / ws / nl / h);
        const int r = lls_rank(held, slot);
        dslots[i] = r >= 0 ? ds0_rows[(((long long)b * rows + r) * h + head) * ws + x] : T(0);
    }
}

#define LLS_TYPED(T, S)                                                                                            \
    extern "C" __global__ void lls_spread_##S(const T* x, const T* lam, T* out, int nb, long long tn, long long r0,  \
                                              int n, int h, int w, int nl, unsigned long long held,                \
                                              unsigned long long own, long long c, long long e, int kind) {        \
        lls_spread<T>(x, lam, out, nb, tn, r0, n, h, w, nl, held, own, c, e, kind);                                \
    }                                                                                                              \
    extern "C" __global__ void lls_gather_##S(const T* rows_in, const T* init, const T* lam, T* dst, int nb,        \
                                              long long tn, long long r0, int n, int h, int w, int nl,             \
                                              unsigned long long held, unsigned long long own, long long c,        \
                                              long long e, int kind) {                                             \
        lls_gather<T>(rows_in, init, lam, dst, nb, tn, r0, n, h, w, nl, held, own, c, e, kind);                    \
    }                                                                                                              \
    extern "C" __global__ void lls_dlambda_##S(const T* q, const T* dq_rows, T* dlam, int nb, long long tn,         \
                                               long long r0, int n, int h, int dk, int nl, unsigned long long held, \
                                               unsigned long long own) {                                           \
        lls_dlambda<T>(q, dq_rows, dlam, nb, tn, r0, n, h, dk, nl, held, own);                                     \
    }                                                                                                              \
    extern "C" __global__ void lls_load_##S(const T* slots, T* rows_out, int nb, int h, int nl, long long ws,       \
                                            unsigned long long held, unsigned long long own) {                     \
        lls_load<T>(slots, rows_out, nb, h, nl, ws, held, own);                                                    \
    }                                                                                                              \
    extern "C" __global__ void lls_merge_##S(const T* fin_rows, T* slots, int nb, int h, int nl, long long ws,      \
                                             unsigned long long held, unsigned long long own, int ub) {            \
        lls_merge<T>(fin_rows, slots, nb, h, nl, ws, held, own, ub);                                               \
    }                                                                                                              \
    extern "C" __global__ void lls_merge_adjoint_##S(const T* dslots, T* dfin_rows, int nb, int h, int nl,          \
                                                     long long ws, unsigned long long held,                        \
                                                     unsigned long long own, int ub) {                             \
        lls_merge_adjoint<T>(dslots, dfin_rows, nb, h, nl, ws, held, own, ub);                                     \
    }                                                                                                              \
    extern "C" __global__ void lls_load_adjoint_##S(const T* ds0_rows, T* dslots, int nb, int h, int nl,            \
                                                    long long ws, unsigned long long held, unsigned long long own) { \
        lls_load_adjoint<T>(ds0_rows, dslots, nb, h, nl, ws, held, own);                                           \
    }

LLS_TYPED(float, f32)
LLS_TYPED(double, f64)
