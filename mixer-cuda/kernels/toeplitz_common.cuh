// What the Toeplitz kernel sources share (prepended by the host to kernels/toeplitz.cu and
// kernels/toeplitz_backward.cu). Channel maps of the kernel width Kw (docs/math.md §3), within
// a head of CH channels: output channel e reads, through tap row i, the channel
// src(e, i) = e + i − (Kw − 1); conversely input channel c is read through tap row i by the
// output channel src_adj(c, i) = c + (Kw − 1 − i). Both are −1 where the channel falls
// outside the head.

// Source channel of tap i for output channel e, or −1 outside e's head.
__device__ inline int tz_src(int e, int i, int Kw, int CH) {
    int c = e + i - (Kw - 1);
    int h0 = (e / CH) * CH;
    return (c >= h0 && c < h0 + CH) ? c : -1;
}

// The output channel that reads input channel c through tap i, or −1 outside c's head.
__device__ inline int tz_src_adj(int c, int i, int Kw, int CH) {
    int e = c + (Kw - 1 - i);
    int h0 = (c / CH) * CH;
    return (e >= h0 && e < h0 + CH) ? e : -1;
}
