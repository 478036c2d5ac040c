// The shared helpers of cpu_common.h that are compiled once.
#include "cpu_common.h"

namespace mlxs::detail {

size_t worker_count() {
  static const size_t n = [] {
    size_t count = std::thread::hardware_concurrency();
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) count = CPU_COUNT(&set);
#endif
    return std::max<size_t>(1, std::min<size_t>(count, 8));
  }();
  return n;
}

MLXS_VECTOR_CLONES float row_max(const float* x, size_t n) {
  constexpr size_t kLanes = 8;
  float lane[kLanes];
  for (size_t l = 0; l < kLanes; ++l) lane[l] = -__builtin_inff();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
  float m = -__builtin_inff();
  for (size_t l = 0; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m == -__builtin_inff() ? 0.0f : m;
}

// e = exp(x − m), summed in 8 lanes; `e` may be `x` itself. What lies more than 87 below m
// weighs 0 (−inf for a masked score).
MLXS_VECTOR_CLONES float exp_shifted(const float* x, float* e, size_t n, float m) {
  constexpr size_t kLanes = 8;
  float lane[kLanes] = {};
  auto one = [m](float v) {
    float d = v - m;
    float y = exp_bounded(d < -87.0f ? -87.0f : d);
    return d < -87.0f ? 0.0f : y;
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) {
      float y = one(x[i + l]);
      e[i + l] = y;
      lane[l] += y;
    }
  float total = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) total += lane[l];
  for (; i < n; ++i) {
    float y = one(x[i]);
    e[i] = y;
    total += y;
  }
  return total;
}

// Softmax's numerator and denominator for each row of `x`: e = exp(x − max(row)) and
// sum(e). One read of the row for the max and one for the exponentials, while it is in cache.
void softmax_row_parts(const float* x, float* e, size_t n, float* sum) { *sum = exp_shifted(x, e, n, row_max(x, n)); }

MLXS_VECTOR_CLONES float sum_squares(const float* __restrict x, size_t n) {
  constexpr size_t kLanes = 16;
  float lane[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (size_t l = 0; l < kLanes; ++l) lane[l] += x[i + l] * x[i + l];
  float total = 0.0f;
  for (size_t l = 0; l < kLanes; ++l) total += lane[l];
  for (; i < n; ++i) total += x[i] * x[i];
  return total;
}

// y = (residual +) x · inv · w, rounding as MLX's composition does: (x · inv) · w.
MLXS_VECTOR_CLONES void norm_row(const float* __restrict x, const float* __restrict w, float inv,
                                 const float* __restrict residual, float* __restrict y, size_t n) {
  if (residual) {
    for (size_t i = 0; i < n; ++i) y[i] = residual[i] + x[i] * inv * w[i];
  } else {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
  }
}

std::shared_ptr<std::vector<float>> patch_scratch(const mx::Stream& stream, size_t floats) {
  static std::mutex mutex;
  static std::unordered_map<int, std::shared_ptr<std::vector<float>>> by_stream;
  std::lock_guard<std::mutex> lock(mutex);
  auto& buffer = by_stream[stream.index];
  if (!buffer || buffer->size() < floats) buffer = std::make_shared<std::vector<float>>(floats);
  return buffer;
}

bool cpu_float32(const mx::Stream& stream, std::initializer_list<const mx::array*> xs) {
  if (stream.device != mx::Device::cpu) return false;
  for (auto* x : xs)
    if (x->dtype() != mx::float32) return false;
  return true;
}

}  // namespace mlxs::detail
