// The temperature-0 token and the validity flag of each row of logits, in one kernel.
//
// At temperature 0 speculative decoding reduces to comparing the draft's tokens with
// the target's argmax at each of the gamma + 1 positions (Leviathan et al., ICML 2023,
// Section 2.3 with one-hot p and q). The comparison itself is trivial; finding the
// argmax over a 32,128-token vocabulary is not, on XLA's CPU backend: the portable
// version (`specdec.distributions.greedy_tokens_checked`) is a block max-reduce, a max
// over the block maxima, a conditional and a search within one block, each a separate
// thunk of several microseconds, ~0.1 ms per verification at V = 32,128. This kernel
// reads each row once, in order, 16 values per step.
//
//   specdec_greedy_checked: logits float32 [M, V] ->
//     tokens int32 [M]: the first argmax of the sanitized row (NaN and -inf as -1e30,
//       +inf as 1e30, every finite value as itself), as `greedy_tokens`;
//     bad bool [M]: the row's maximum is not finite (some NaN or +inf, or no finite
//       value at all), as `nonfinite`.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t i16 __attribute__((vector_size(64)));
constexpr int kLanes = 16;

constexpr float kLogitMax = 1e30f;  // specdec.distributions._LOGIT_MAX

inline float Sanitized(float v) {
  // NaN compares false: it takes the -1e30 branch.
  if (!(v > -INFINITY)) return -kLogitMax;
  if (v == INFINITY) return kLogitMax;
  return v;
}

// One row: the first argmax of the sanitized values, and whether the row is bad.
// Lane l of the vector loop keeps the maximum of values l, l + 16, ... and the first
// index holding it (strict >); the row's first argmax is the least index among the
// lanes that hold the overall maximum. Branch-free in the loop.
inline void Row(const float* __restrict row, int64_t V, int32_t* token, bool* bad) {
  const v16 neg_inf = v16{} - INFINITY, pos_inf = v16{} + INFINITY;
  const v16 low = v16{} - kLogitMax, high = v16{} + kLogitMax;
  v16 top = low;
  i16 first = i16{}, index;
  i16 flags = i16{}, finite = i16{};
  for (int l = 0; l < kLanes; ++l) index[l] = l;
  bool any_lane = false;
  int64_t v = 0;
  for (; v + kLanes <= V; v += kLanes) {
    const v16 x = *reinterpret_cast<const v16u*>(row + v);
    v16 s = x > neg_inf ? x : low;     // NaN and -inf -> -1e30
    s = x == pos_inf ? high : s;      // +inf -> 1e30
    const i16 better = s > top;
    top = better ? s : top;
    first = better ? index : first;
    flags |= (x != x) | (x == pos_inf);
    finite |= (x - x) == (v16{});     // inf - inf and NaN - NaN are NaN
    index += kLanes;
    any_lane = true;
  }
  float best = -INFINITY;
  int64_t arg = V;
  bool nan_or_posinf = false, any_finite = false;
  if (any_lane) {
    // A lane whose values were all below -1e30 still holds the -1e30 start: it never
    // wins unless every lane does, and then the scalar pass below decides.
    for (int l = 0; l < kLanes; ++l) {
      if (top[l] > best || (top[l] == best && first[l] < arg)) {
        best = top[l];
        arg = first[l];
      }
      nan_or_posinf |= flags[l] != 0;
      any_finite |= finite[l] != 0;
    }
  }
  for (int64_t u = v; u < V; ++u) {  // the tail
    const float s = Sanitized(row[u]);
    if (s > best) {
      best = s;
      arg = u;
    }
    nan_or_posinf |= (row[u] != row[u]) | (row[u] == INFINITY);
    any_finite |= std::isfinite(row[u]);
  }
  // The vector lanes start at -1e30, as if a value -1e30 sat at each lane's index
  // 0..15; that is exact unless the maximum is <= -1e30 (every value NaN, -inf or a
  // finite value <= -1e30), where the first index of the true maximum is found by a
  // plain scan.
  if (!(best > -kLogitMax)) {
    best = Sanitized(row[0]);
    for (int64_t u = 1; u < V; ++u) best = std::max(best, Sanitized(row[u]));
    arg = 0;
    while (Sanitized(row[arg]) != best) ++arg;
  }
  *token = static_cast<int32_t>(arg);
  *bad = nan_or_posinf || !any_finite;
}

ffi::Error GreedyChecked(ffi::Buffer<ffi::F32> logits, ffi::ResultBuffer<ffi::S32> tokens,
                         ffi::ResultBuffer<ffi::PRED> bad) {
  const auto d = logits.dimensions();
  if (d.size() != 2 || d[1] < 1 || tokens->dimensions().size() != 1 ||
      tokens->dimensions()[0] != d[0] || bad->dimensions().size() != 1 ||
      bad->dimensions()[0] != d[0]) {
    return ffi::Error::InvalidArgument(
        "specdec_greedy_checked: expected logits [M, V >= 1], tokens [M], bad [M]");
  }
  const int64_t M = d[0], V = d[1];
  for (int64_t m = 0; m < M; ++m) {
    Row(logits.typed_data() + m * V, V, tokens->typed_data() + m,
        bad->typed_data() + m);
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecGreedyChecked, GreedyChecked,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::PRED>>());
