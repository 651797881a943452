// One decode step's attention for Llama-family layers, fused (taut.rollout.native):
// rotary on the new query and key heads, the new key and value written into the bf16 cache at
// column t, and single-query attention over columns 0..t for every row and key/value head, the
// head's G query heads sharing each key and value row read. Arithmetic in fp32 (bf16 inputs
// widened exactly); the output rounded to bf16 once. One work item per (row, key/value head),
// split over torch's threads.
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
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) out[d] = widen(x[d]) * cos[d] + widen(x[(d + half) % D]) * signed_sin[d];
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& signed_sin,
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
  TORCH_CHECK(0 <= t && t < C, "column t outside the cache");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && signed_sin.scalar_type() == torch::kFloat32 && cos.is_contiguous() &&
                  signed_sin.is_contiguous() && cos.numel() == A * D && signed_sin.numel() == A * D,
              "cos, signed_sin: contiguous float32 [rows, head_dim]");
  const bool* visible = nullptr;
  if (valid.numel()) {
    TORCH_CHECK(valid.scalar_type() == torch::kBool && valid.is_contiguous() && valid.size(0) == A && valid.size(1) == C,
                "valid: contiguous bool [rows, capacity]");
    visible = valid.data_ptr<bool>();
  }
  const int64_t G = n_heads / KV, T = t + 1, width = qkv.size(1);
  auto out = torch::empty({A, n_heads * D}, qkv.options());
  const auto* in = reinterpret_cast<const uint16_t*>(qkv.data_ptr());
  auto* kc = reinterpret_cast<uint16_t*>(keys.data_ptr());
  auto* vc = reinterpret_cast<uint16_t*>(values.data_ptr());
  auto* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float* cs = cos.data_ptr<float>();
  const float* sn = signed_sin.data_ptr<float>();
  const float s = static_cast<float>(scale);

  at::parallel_for(0, A * KV, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(G * D), row(D), k_new(D), score(G * T), acc(G * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / KV, h = item % KV;
      const uint16_t* x = in + r * width;
      uint16_t* kr = kc + item * C * D;
      uint16_t* vr = vc + item * C * D;
      const float* c = cs + r * D;
      const float* sg = sn + r * D;
      rotate(x + (n_heads + h) * D, c, sg, k_new.data(), D);
      for (int64_t d = 0; d < D; ++d) kr[t * D + d] = narrow(k_new[d]);
      std::memcpy(vr + t * D, x + (n_heads + KV + h) * D, sizeof(uint16_t) * D);
      for (int64_t g = 0; g < G; ++g) rotate(x + (h * G + g) * D, c, sg, q.data() + g * D, D);
      const bool* ok = visible ? visible + r * C : nullptr;
      for (int64_t j = 0; j < T; ++j) {
        if (ok && !ok[j]) continue;                 // a padding column: its weight is set to 0 below
        for (int64_t d = 0; d < D; ++d) row[d] = widen(kr[j * D + d]);
        for (int64_t g = 0; g < G; ++g) score[g * T + j] = dot(q.data() + g * D, row.data(), D) * s;
      }
      for (int64_t g = 0; g < G; ++g) {
        float* p = score.data() + g * T;
        float top = p[t];                           // column t, just written, is always visible
        for (int64_t j = 0; j < T; ++j)
          if (!ok || ok[j]) top = p[j] > top ? p[j] : top;
        float total = 0;
        for (int64_t j = 0; j < T; ++j) {
          p[j] = (!ok || ok[j]) ? std::exp(p[j] - top) : 0.0f;
          total += p[j];
        }
        const float inv = 1.0f / total;
        for (int64_t j = 0; j < T; ++j) p[j] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < T; ++j) {
        if (ok && !ok[j]) continue;
        for (int64_t d = 0; d < D; ++d) row[d] = widen(vr[j * D + d]);
        for (int64_t g = 0; g < G; ++g) {
          const float p = score[g * T + j];
          float* a = acc.data() + g * D;
          for (int64_t d = 0; d < D; ++d) a[d] += p * row[d];
        }
      }
      for (int64_t g = 0; g < G; ++g)
        for (int64_t d = 0; d < D; ++d) o[r * n_heads * D + (h * G + g) * D + d] = narrow(acc[g * D + d]);
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "rotary, cache write and single-query attention for one decode step");
}
