// The elementwise work of a decode step for Llama-family layers, fused (taut.rollout.native).
//
// decode_attention:
// rotary on the new query and key heads, the new key and value written into the bf16 cache at
// column t, and single-query attention over columns 0..t for every row and key/value head, the
// head's G query heads sharing each key and value row read. Arithmetic in fp32 (bf16 inputs
// widened exactly); the output rounded to bf16 once. One work item per (row, key/value head),
// split over torch's threads.
//
// decode_attention_shared: the same, with the prompt's columns read from one buffer per prompt
// that the rows sampled from it share (a group's n rollouts), and each row's own buffer holding
// only the columns it generated. Column j < W of row r is column j of its prompt's buffer, column
// j >= W column j - W of its own: the same values in the same order as one buffer per row holding
// both, so the same result bit for bit, with the prompt's keys and values read from memory once
// per group instead of once per row.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

inline float widen(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t narrow(float f) {  // round to nearest even, as torch's float -> bfloat16 cast
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

constexpr int64_t LANES = 16;
constexpr float HIDDEN = -1e30f;   // finite: -ffast-math assumes no infinities

inline float dot(const float* a, const float* b, int64_t D) {
  float part[LANES] = {0};
  for (int64_t d = 0; d < D; d += LANES)
    for (int64_t l = 0; l < LANES; ++l) part[l] += a[d + l] * b[d + l];
  float sum = 0;
  for (int64_t l = 0; l < LANES; ++l) sum += part[l];
  return sum;
}

// x · cos + rotate_half(x) · sin, with the sign of sin's first half folded in (fast.py, _rotary)
inline void rotate(const uint16_t* x, const float* cos, const float* signed_sin, float* out, int64_t D) {
  const int64_t half = D / 2;   // the partner of d is d + half in the first half, d - half in the second
  for (int64_t d = 0; d < half; ++d) out[d] = widen(x[d]) * cos[d] + widen(x[d + half]) * signed_sin[d];
  for (int64_t d = half; d < D; ++d) out[d] = widen(x[d]) * cos[d] + widen(x[d - half]) * signed_sin[d];
}


#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define TAUT_AVX512_BF16 1

// lane i of the result: the sum of v[i]'s sixteen lanes (a transpose folded into the adds)
inline __m512 sum16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88), _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
}

// scores[g * T + j] = s · q_g · k_j for j < T: bf16 pairs multiplied exactly and summed in fp32,
// sixteen keys at a time; q holds G heads of D (a multiple of 32) bf16 values
// (scores[g * stride + j]: a segment of a longer row of scores)
inline void scores_avx512(const uint16_t* q, const uint16_t* k, const uint16_t* vpre, int64_t T, int64_t G, int64_t D, float s, float* scores,
                          int64_t stride) {
  constexpr int64_t MAXG = 8, MAXC = 8;           // up to 8 query heads per kv head, head_dim up to 256
  __m512bh qv[MAXG][MAXC];
  const int64_t chunks = D / 32;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < chunks; ++c) qv[g][c] = (__m512bh)_mm512_loadu_si512(q + g * D + c * 32);
  const __m512 scale = _mm512_set1_ps(s);
  for (int64_t j0 = 0; j0 < T; j0 += 16) {
    __m512 acc[MAXG][16];
    for (int64_t jj = 0; jj < 16; ++jj) {
      const int64_t j = j0 + jj;
      for (int64_t g = 0; g < G; ++g) acc[g][jj] = _mm512_setzero_ps();
      if (j >= T) continue;
      for (int64_t c = 0; c < chunks; ++c) _mm_prefetch(reinterpret_cast<const char*>(vpre + j * D + c * 32), _MM_HINT_T1);
      for (int64_t c = 0; c < chunks; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(k + (j + 16) * D + c * 32), _MM_HINT_T0);
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(k + j * D + c * 32);
        for (int64_t g = 0; g < G; ++g) acc[g][jj] = _mm512_dpbf16_ps(acc[g][jj], qv[g][c], kv);
      }
    }
    const int64_t n = std::min<int64_t>(16, T - j0);
    const __mmask16 keep = static_cast<__mmask16>((1u << n) - 1u);
    for (int64_t g = 0; g < G; ++g) _mm512_mask_storeu_ps(scores + g * stride + j0, keep, _mm512_mul_ps(sum16(acc[g]), scale));
  }
}

// acc_g += p_g[j] · v_j over j < T, fp32, the values of columns j < W from vp and of j >= W from
// v (column j - W); the accumulators hold each 128-bit lane's eight values as two interleaved
// halves (unpacked against zero), put back in order at the end
inline void values_avx512(const float* p, const uint16_t* vp, int64_t W, const uint16_t* v, const bool* ok, int64_t T, int64_t G,
                          int64_t D, float* out) {
  constexpr int64_t MAXG = 8, MAXC = 8;
  __m512 lo[MAXG][MAXC], hi[MAXG][MAXC];
  const int64_t chunks = D / 32;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < chunks; ++c) lo[g][c] = hi[g][c] = _mm512_setzero_ps();
  const __m512i zero = _mm512_setzero_si512();
  for (int64_t j = 0; j < T; ++j) {
    if (ok && !ok[j]) continue;
    const uint16_t* vj = j < W ? vp + j * D : v + (j - W) * D;
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512i x = _mm512_loadu_si512(vj + c * 32);
      const __m512 a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, x)), b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, x));
      for (int64_t g = 0; g < G; ++g) {
        const __m512 w = _mm512_set1_ps(p[g * T + j]);
        lo[g][c] = _mm512_fmadd_ps(w, a, lo[g][c]);
        hi[g][c] = _mm512_fmadd_ps(w, b, hi[g][c]);
      }
    }
  }
  alignas(64) float l[16], h[16];
  for (int64_t g = 0; g < G; ++g)
    for (int64_t c = 0; c < chunks; ++c) {
      _mm512_store_ps(l, lo[g][c]);
      _mm512_store_ps(h, hi[g][c]);
      float* o = out + g * D + c * 32;
      for (int64_t lane = 0; lane < 4; ++lane)        // 128-bit lane k holds values 8k..8k+3 (lo), 8k+4..8k+7 (hi)
        for (int64_t e = 0; e < 4; ++e) {
          o[8 * lane + e] = l[4 * lane + e];
          o[8 * lane + 4 + e] = h[4 * lane + e];
        }
    }
}
#endif

}  // namespace

namespace {

// The step for rows whose columns j < W are those of their prompt's buffer (pk, pv: [P, KV, W, D];
// W = 0: none) and j >= W those of their own (keys, values: [A, KV, C, D], the new column at t - W).
torch::Tensor attend(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                     const torch::Tensor& prompt_keys, const torch::Tensor& prompt_values, const torch::Tensor& prompt_of,
                     torch::Tensor& keys, torch::Tensor& values, const torch::Tensor& valid,
                     int64_t t, int64_t n_heads, double scale) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == torch::kBFloat16 && qkv.is_contiguous(),
              "qkv: contiguous bf16 [rows, (heads + 2 kv heads) * head_dim]");
  TORCH_CHECK(keys.dim() == 4 && keys.scalar_type() == torch::kBFloat16 && keys.is_contiguous() &&
                  values.sizes() == keys.sizes() && values.scalar_type() == torch::kBFloat16 && values.is_contiguous(),
              "keys, values: contiguous bf16 [rows, kv heads, capacity, head_dim]");
  const int64_t A = keys.size(0), KV = keys.size(1), C = keys.size(2), D = keys.size(3);
  TORCH_CHECK(D % LANES == 0 && n_heads % KV == 0 && qkv.size(0) == A && qkv.size(1) == (n_heads + 2 * KV) * D,
              "qkv's width must be (heads + 2 kv heads) * head_dim, head_dim a multiple of 16");
  const bool shared = prompt_keys.numel() > 0;
  int64_t W = 0, P = 0;
  if (shared) {
    TORCH_CHECK(prompt_keys.dim() == 4 && prompt_keys.scalar_type() == torch::kBFloat16 && prompt_keys.is_contiguous() &&
                    prompt_values.sizes() == prompt_keys.sizes() && prompt_values.scalar_type() == torch::kBFloat16 &&
                    prompt_values.is_contiguous() && prompt_keys.size(1) == KV && prompt_keys.size(3) == D,
                "prompt_keys, prompt_values: contiguous bf16 [prompts, kv heads, prompt width, head_dim]");
    TORCH_CHECK(prompt_of.scalar_type() == torch::kLong && prompt_of.is_contiguous() && prompt_of.numel() == A,
                "prompt_of: contiguous int64 [rows], each row's prompt");
    P = prompt_keys.size(0);
    W = prompt_keys.size(2);
  }
  TORCH_CHECK(W <= t && t - W < C, "column t outside the cache");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && signed_sin.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
                  signed_sin.is_contiguous() && cos.numel() == A * D && signed_sin.numel() == A * D,
              "cos, signed_sin: contiguous float32 [rows, head_dim]");
  const bool* visible = nullptr;
  if (valid.numel()) {
    TORCH_CHECK(valid.scalar_type() == torch::kBool && valid.is_contiguous() && valid.size(0) == A && valid.size(1) == W + C,
                "valid: contiguous bool [rows, prompt width + capacity]");
    visible = valid.data_ptr<bool>();
  }
  const int64_t* owner = shared ? prompt_of.data_ptr<int64_t>() : nullptr;
  if (shared)
    for (int64_t r = 0; r < A; ++r) TORCH_CHECK(0 <= owner[r] && owner[r] < P, "prompt_of: a row's prompt outside the prompts");
  const int64_t G = n_heads / KV, T = t + 1, width = qkv.size(1), own = t - W;
  auto out = torch::empty({A, n_heads * D}, qkv.options());
  const auto* in = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
  auto* kc = reinterpret_cast<uint16_t*>(keys.data_ptr());
  auto* vc = reinterpret_cast<uint16_t*>(values.data_ptr());
  const auto* pkc = shared ? reinterpret_cast<const uint16_t*>(prompt_keys.data_ptr()) : nullptr;
  const auto* pvc = shared ? reinterpret_cast<const uint16_t*>(prompt_values.data_ptr()) : nullptr;
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float* cs = cos.data_ptr<float>();
  const float* sn = signed_sin.data_ptr<float>();
  const float s = static_cast<float>(scale);
#ifdef TAUT_AVX512_BF16
  const bool fast = D % 32 == 0 && D <= 256 && G <= 8;
#endif

  at::parallel_for(0, A * KV, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(G * D), row(D), k_new(D), score(G * T), acc(G * D);
    std::vector<uint16_t> qb(G * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / KV, h = item % KV;
      const uint16_t* x = in + r * width;
      uint16_t* kr = kc + item * C * D;
      uint16_t* vr = vc + item * C * D;
      const uint16_t* pk = shared ? pkc + (owner[r] * KV + h) * W * D : nullptr;
      const uint16_t* pv = shared ? pvc + (owner[r] * KV + h) * W * D : nullptr;
      const float* c = cs + r * D;
      const float* sg = sn + r * D;
      rotate(x + (n_heads + h) * D, c, sg, k_new.data(), D);
      for (int64_t d = 0; d < D; ++d) kr[own * D + d] = narrow(k_new[d]);
      std::memcpy(vr + own * D, x + (n_heads + KV + h) * D, sizeof(uint16_t) * D);
      for (int64_t g = 0; g < G; ++g) rotate(x + (h * G + g) * D, c, sg, q.data() + g * D, D);
      for (int64_t e = 0; e < G * D; ++e) {         // queries in bf16, as the keys they meet
        qb[e] = narrow(q[e]);
        q[e] = widen(qb[e]);
      }
      const bool* ok = visible ? visible + r * (W + C) : nullptr;
#ifdef TAUT_AVX512_BF16
      if (fast) {
        if (W) scores_avx512(qb.data(), pk, pv, W, G, D, s, score.data(), T);
        scores_avx512(qb.data(), kr, vr, T - W, G, D, s, score.data() + W, T);
        if (ok)
          for (int64_t j = 0; j < T; ++j)
            if (!ok[j])
              for (int64_t g = 0; g < G; ++g) score[g * T + j] = HIDDEN;
      } else
#endif
      for (int64_t j = 0; j < T; ++j) {
        if (ok && !ok[j]) {                         // a padding column: a finite score far below any other,
          for (int64_t g = 0; g < G; ++g) score[g * T + j] = HIDDEN;   // whose exp is exactly 0
          continue;
        }
        const uint16_t* kj = j < W ? pk + j * D : kr + (j - W) * D;
        for (int64_t d = 0; d < D; ++d) row[d] = widen(kj[d]);
        for (int64_t g = 0; g < G; ++g) score[g * T + j] = dot(q.data() + g * D, row.data(), D) * s;
      }
      for (int64_t g = 0; g < G; ++g) {
        float* p = score.data() + g * T;
        float top = p[t];                           // column t, just written, is always visible
        for (int64_t j = 0; j < T; ++j) top = std::max(top, p[j]);
        float total = 0;
        for (int64_t j = 0; j < T; ++j) {
          p[j] = std::exp(p[j] - top);
          total += p[j];
        }
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < T; ++j) p[j] *= inv;
      }
#ifdef TAUT_AVX512_BF16
      if (fast) values_avx512(score.data(), pv, W, vr, ok, T, G, D, acc.data()); else {
#else
      {
#endif
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < T; ++j) {
        if (ok && !ok[j]) continue;
        const uint16_t* vj = j < W ? pv + j * D : vr + (j - W) * D;
        for (int64_t d = 0; d < D; ++d) row[d] = widen(vj[d]);
        for (int64_t g = 0; g < G; ++g) {
          const float p = score[g * T + j];
          float* a = acc.data() + g * D;
          for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
        }
      }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d) o[r * n_heads * D + (h * G + g) * D + d] = narrow(acc[g * D + d]);
    }
  });
  return out;
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                               torch::Tensor& keys, torch::Tensor& values, const torch::Tensor& valid,
                               int64_t t, int64_t n_heads, double scale) {
  const auto none = torch::empty({0}, keys.options());
  return attend(qkv, cos, signed_sin, none, none, torch::empty({0}, keys.options().dtype(torch::kLong)), keys, values, valid, t,
                n_heads, scale);
}

torch::Tensor decode_attention_shared(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
                                      const torch::Tensor& prompt_keys, const torch::Tensor& prompt_values,
                                      const torch::Tensor& prompt_of, torch::Tensor& keys, torch::Tensor& values,
                                      const torch::Tensor& valid, int64_t t, int64_t n_heads, double scale) {
  TORCH_CHECK(prompt_keys.numel() > 0, "prompt_keys: at least one prompt column (decode_attention takes none)");
  return attend(qkv, cos, signed_sin, prompt_keys, prompt_values, prompt_of, keys, values, valid, t, n_heads, scale);
}

// x += delta (in place, fp32), then the RMS norm of x times weight, rounded to bf16 once: a
// residual add, a norm and the cast for the next product in one pass. delta may be empty (no add).
torch::Tensor add_rms_norm(torch::Tensor& x, const torch::Tensor& delta, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "x: contiguous float32 [rows, hidden]");
  const int64_t A = x.size(0), H = x.size(1);
  TORCH_CHECK(weight.scalar_type() == torch::kFloat32 && weight.is_contiguous() && weight.numel() == H, "weight: float32 [hidden]");
  const bool add = delta.numel() > 0;
  if (add)
    TORCH_CHECK(delta.scalar_type() == torch::kBFloat16 && delta.is_contiguous() && delta.size(0) == A && delta.size(1) == H,
                "delta: contiguous bf16 [rows, hidden]");
  auto out = torch::empty({A, H}, x.options().dtype(torch::kBFloat16));
  float* xs = x.data_ptr<float>();
  const auto* ds = add ? reinterpret_cast<const uint16_t*>(delta.data_ptr()) : nullptr;
  const float* w = weight.data_ptr<float>();
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, A, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* xr = xs + r * H;
      if (add)
        for (int64_t i = 0; i < H; ++i) xr[i] += widen(ds[r * H + i]);
      float sum = 0;
      for (int64_t i = 0; i < H; ++i) sum += xr[i] * xr[i];
      const float scale = 1.0f / std::sqrt(sum / static_cast<float>(H) + static_cast<float>(eps));
      for (int64_t i = 0; i < H; ++i) o[r * H + i] = narrow(xr[i] * scale * w[i]);
    }
  });
  return out;
}

// silu(gate) * up for gate_up = [gate | up] (bf16 [rows, 2 I]), in fp32, rounded to bf16 once
torch::Tensor silu_mul(const torch::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == torch::kBFloat16 && gate_up.is_contiguous() &&
                  gate_up.size(1) % 2 == 0, "gate_up: contiguous bf16 [rows, 2 * intermediate]");
  const int64_t A = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({A, I}, gate_up.options());
  const auto* in = reinterpret_cast<const uint16_t*>(gate_up.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, A, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t i = 0; i < I; ++i) {
        const float g = widen(in[r * 2 * I + i]), u = widen(in[r * 2 * I + I + i]);
        o[r * I + i] = narrow(g / (1.0f + std::exp(-g)) * u);
      }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "rotary, cache write and single-query attention for one decode step");
  m.def("decode_attention_shared", &decode_attention_shared,
        "decode_attention with the prompt's columns in one buffer per prompt, shared by the rows sampled from it");
  m.def("add_rms_norm", &add_rms_norm, "x += delta; RMS norm of x times weight, in bf16");
  m.def("silu_mul", &silu_mul, "silu(gate) * up, in bf16");
}
