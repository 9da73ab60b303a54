// CPU harness of the scalar-decay chunk-state kernels on tensor cores (kernels/loglinear_ssd.cu):
// llc_states_tc_bf16 and llc_states_tc_f32 against the chunk states in f64 on the operands the
// kernels form (the decayed keys rounded to bf16, or tf32), and the walk over chunks
// (llc_walk_tc_hb, llc_walk_tc_f32) against the states + the scan (llc_scan_hb, llc_scan_f32)
// bit for bit, as the GPU test the_walk_over_chunks_equals_the_chunk_states_and_the_scan_bit_for_bit
// holds them — here with the tensor cores and ldmatrix emulated per warp (bench/gpu/cpu_cuda.h).
// Sizes off the tiles: a partial chunk, key and value dims that are not multiples of 64. Run from
// the repository root:
//   sed -e 's/extern __shared__ __align__(16) unsigned char llw_dyn\[\];/unsigned char* llw_dyn = g_dyn;/' \
//       -e 's/asm volatile(.*);/;/' mixer-cuda/kernels/loglinear_ssd.cu > /tmp/llc_ssd.cu &&
//   sed -e 's/void llc_cp_async\(16\)*(/void llc_cp_async\1_device(/' \
//       mixer-cuda/kernels/loglinear_common.cuh > /tmp/llc_common.cuh &&
//   g++ -std=c++20 -O2 -pthread -I/tmp bench/gpu/ssd_harness.cpp -o /tmp/ssd_harness && /tmp/ssd_harness
// It exits non-zero on a failure.
#define LLC_COMMON_SED
#include "cpu_cuda.h"
#include "llc_ssd.cu"

#include <cstdlib>
#include <cstring>

struct Case {
    int B, Tn, H, Dk, Dv;
};

// The chunk states Z_j = Σ_s K̂_s v_sᵀ in f64 on the bf16 kernels' operands: K̂_s = w_s k_s with
// w_s = e^{a_j − γ_s} in f32, the product rounded to bf16.
static std::vector<double> reference(const Case& c, const std::vector<mx_bf16>& k, const std::vector<mx_bf16>& v,
                                     const std::vector<float>& g, int nc) {
    const int CH = 64;
    std::vector<double> z((size_t)c.B * c.H * nc * c.Dk * c.Dv, 0.0);
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
            for (int j = 0; j < nc; ++j) {
                const int i0 = j * CH, n = std::min(CH, c.Tn - i0);
                std::vector<double> gam(CH, 0.0);
                double acc = 0.0;
                for (int s = 0; s < CH; ++s) {
                    if (s < n) acc += (double)g[((size_t)b * c.Tn + i0 + s) * c.H + h];
                    gam[s] = acc;
                }
                double* zj = &z[(((size_t)b * c.H + h) * nc + j) * c.Dk * c.Dv];
                for (int s = 0; s < n; ++s) {
                    const size_t row = ((size_t)b * c.Tn + i0 + s) * c.H + h;
                    const float w = expf((float)(gam[CH - 1] - gam[s]));
                    for (int kc = 0; kc < c.Dk; ++kc) {
                        const double kh = mx_bf16_f32(mx_f32_bf16(w * mx_bf16_f32(k[row * c.Dk + kc])));
                        for (int d = 0; d < c.Dv; ++d) zj[(size_t)kc * c.Dv + d] += kh * mx_bf16_f32(v[row * c.Dv + d]);
                    }
                }
            }
    return z;
}

template <typename T> static std::vector<unsigned> bits(const std::vector<T>& x) {
    std::vector<unsigned> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        unsigned u = 0;
        std::memcpy(&u, &x[i], sizeof(T));
        b[i] = u;
    }
    return b;
}

static void run(const Case& c) {
    const int nc = (c.Tn + 63) / 64, bh = c.B * c.H;
    const size_t nk = (size_t)c.B * c.Tn * c.H * c.Dk, nv = (size_t)c.B * c.Tn * c.H * c.Dv, dd = (size_t)c.Dk * c.Dv;
    std::vector<mx_bf16> kb(nk), vb(nv);
    std::vector<float> kf(nk), vf(nv), g((size_t)c.B * c.Tn * c.H);
    std::mt19937 rng(7 + c.Tn + c.Dk);
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    for (size_t i = 0; i < nk; ++i) kf[i] = mx_bf16_f32(kb[i] = mx_f32_bf16(U(rng)));
    for (size_t i = 0; i < nv; ++i) vf[i] = mx_bf16_f32(vb[i] = mx_f32_bf16(U(rng)));
    for (auto& x : g) x = -0.2f * (1.f + U(rng));
    const int tiles = ((c.Dk + 63) / 64) * ((c.Dv + 63) / 64);
    char what[160];
    auto dims = [&](const char* k) {
        std::snprintf(what, sizeof what, "%s B%d T%d H%d Dk%d Dv%d", k, c.B, c.Tn, c.H, c.Dk, c.Dv);
        return what;
    };
    // bf16: the states against the f64 reference.
    std::vector<float> F(bh * nc * dd, NAN);
    std::vector<double> A(bh * nc, NAN);
    launch(nc, bh, tiles, [&] {
        llc_states_tc_bf16(kb.data(), vb.data(), g.data(), 1, F.data(), A.data(), c.Tn, c.H, c.Dk, c.Dv, nc, nullptr, 0);
    }, 128);
    const auto z = reference(c, kb, vb, g, nc);
    double num = 0, den = 0;
    for (size_t i = 0; i < z.size(); ++i) num += (F[i] - z[i]) * (F[i] - z[i]), den += z[i] * z[i];
    check(dims("llc_states_tc_bf16 vs f64 (relative RMS)"), std::sqrt(num / den), 1e-6);
    // bf16: the walk's entering states and final state against the scan's, bit for bit.
    std::vector<mx_bf16> hb(bh * nc * dd, 0xffffu), hw(bh * nc * dd, 0xfffeu);
    std::vector<float> st(bh * dd, NAN), stw(bh * dd, NAN), zero(1, 0.f);
    launch((int)((dd + 255) / 256), bh, 1, [&] {
        llc_scan_hb(F.data(), hb.data(), A.data(), c.Dk, c.Dv, nc, zero.data(), 0, st.data(), 1, nullptr, 0, c.H);
    });
    std::vector<double> Aw(bh * nc, NAN);
    const int wt = ((c.Dk + 63) / 64) * ((c.Dv + LLW_VT - 1) / LLW_VT);
    launch(wt, bh, 1, [&] {
        llc_walk_tc_hb(kb.data(), vb.data(), g.data(), 1, hw.data(), Aw.data(), c.Tn, c.H, c.Dk, c.Dv, nc,
                       zero.data(), 0, stw.data(), 1, nullptr, 0);
    }, 128);
    size_t bad = 0;
    for (size_t i = 0; i < hb.size(); ++i) bad += hb[i] != hw[i];
    for (size_t i = 0; i < st.size(); ++i) bad += bits(std::vector<float>{st[i]})[0] != bits(std::vector<float>{stw[i]})[0];
    check(dims("llc_walk_tc_hb = llc_states_tc_bf16 + llc_scan_hb (entries differing)"), (double)bad, 0);
    // f32 (tf32 operands): the walk against the states + the scan, bit for bit.
    std::vector<float> F32(bh * nc * dd, NAN), Fw(bh * nc * dd, NAN), st32(bh * dd, NAN), stw32(bh * dd, NAN);
    launch(nc, bh, tiles, [&] {
        llc_states_tc_f32(kf.data(), vf.data(), g.data(), 1, F32.data(), A.data(), c.Tn, c.H, c.Dk, c.Dv, nc, nullptr, 0);
    }, 128);
    launch((int)((dd + 255) / 256), bh, 1, [&] {
        llc_scan_f32(F32.data(), A.data(), c.Dk, c.Dv, nc, zero.data(), 0, st32.data(), 1, nullptr, 0, c.H);
    });
    launch(wt, bh, 1, [&] {
        llc_walk_tc_f32(kf.data(), vf.data(), g.data(), 1, Fw.data(), Aw.data(), c.Tn, c.H, c.Dk, c.Dv, nc,
                        zero.data(), 0, stw32.data(), 1, nullptr, 0);
    }, 128);
    bad = 0;
    const auto b1 = bits(F32), b2 = bits(Fw), b3 = bits(st32), b4 = bits(stw32);
    for (size_t i = 0; i < b1.size(); ++i) bad += b1[i] != b2[i];
    for (size_t i = 0; i < b3.size(); ++i) bad += b3[i] != b4[i];
    check(dims("llc_walk_tc_f32 = llc_states_tc_f32 + llc_scan_f32 (entries differing)"), (double)bad, 0);
}

int main() {
    for (const Case& c : {Case{1, 150, 2, 72, 40}, Case{2, 64, 1, 64, 64}, Case{1, 37, 1, 16, 130}, Case{1, 70, 1, 24, 37}}) run(c);
    return harness_end();
}
