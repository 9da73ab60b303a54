// Element-wise helpers of device tensors: bfloat16 conversions and the input value checks.
//
// bf16 is handled as its 16 bits (unsigned short): f32 → bf16 rounds to nearest, ties to
// even, NaN kept quiet (the same rule as the host's round_bf16), bf16 → f32 is exact.

__device__ inline unsigned short f32_to_bf16_bits(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ inline float bf16_bits_to_f32(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }

extern "C" __global__ void bf16_to_f32(const unsigned short* a, float* out, long long n) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x) out[i] = bf16_bits_to_f32(a[i]);
}

extern "C" __global__ void f32_to_bf16(const float* a, unsigned short* out, long long n) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x) out[i] = f32_to_bf16_bits(a[i]);
}

// Value constraints (mixer_core::spec::Constraint): 0 finite, 1 finite and ≤ 0, 2 finite and
// in [0, 1], 3 finite and ≥ 0. The flag ends as n − i for the first violating flat index i
// (0 when none): atomicMax keeps the smallest i.
__device__ inline bool value_ok(double x, int c) {
    if (!isfinite(x)) return false;
    switch (c) {
        case 1: return x <= 0.0;
        case 2: return x >= 0.0 && x <= 1.0;
        case 3: return x >= 0.0;
        default: return true;
    }
}

template <typename T>
__device__ void check_values(const T* a, long long n, int c, long long* flag) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x)
        if (!value_ok((double)a[i], c)) atomicMax((unsigned long long*)flag, (unsigned long long)(n - i));
}

extern "C" __global__ void check_values_f32(const float* a, long long n, int c, long long* flag) {
    check_values<float>(a, n, c, flag);
}
extern "C" __global__ void check_values_f64(const double* a, long long n, int c, long long* flag) {
    check_values<double>(a, n, c, flag);
}
extern "C" __global__ void check_values_bf16(const unsigned short* a, long long n, int c, long long* flag) {
    for (long long i = gtid(); i < n; i += (long long)gridDim.x * blockDim.x)
        if (!value_ok((double)bf16_bits_to_f32(a[i]), c))
            atomicMax((unsigned long long*)flag, (unsigned long long)(n - i));
}
