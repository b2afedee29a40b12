// Products of a few rows by a large weight matrix that read each weight once.
//
// Speculative decoding verifies gamma + 1 tokens in one target call (Leviathan et al.,
// ICML 2023, Algorithm 1): at batch 1 every weight matrix then meets a [k, in]
// activation with k <= 9. On a CPU such a product is bound by reading the weights, so
// it should cost what one token's matrix-vector product costs. XLA:CPU's general
// product does not: for 2 <= k <= 8 it streams the weights at about half the rate of
// its one-row path. This kernel keeps the k rows' partial sums of a 32-column tile in
// vector registers and reads the weights once, in order, from a tile-major copy
// (`specdec.backends.cpu.pack`: w [K, N] -> p [N / 32, K, 32], each tile contiguous, which
// the hardware prefetchers stream at full rate; a row-major [K, N] walked by tiles is
// a strided read at half the rate), with the tiles split over XLA's intra-op threads.
//
//   specdec_packed_matmul: y[M, N] = x[M, K] @ w[K, N], given p = pack(w) and N.
//   specdec_packed_matmul_bf16: the same with p = pack(w, bfloat16), for weights that
//     bfloat16 holds exactly (a model stored in bfloat16): half the bytes to read.
//     Each weight widens to float32 exactly (its 16 bits become the high half of a
//     float32), so the products and sums are the float32 kernel's, operation for
//     operation.
//
// float32 x and y, float32 accumulation in order over K, rows of x in blocks sized to
// the vector registers (below).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The vector width and the rows per pass are the target ISA's (the library is built
// with -march=native): all of a pass's accumulators, MB rows x (32 / kVec) vectors, must
// stay in registers, or every multiply-add goes through memory (a 64-byte vector built
// for AVX2 is lowered through the stack: 4x slower than XLA's product, measured).
//   AVX-512: 16-float vectors, 32 registers: 8 rows x 2 vectors = 16 accumulators.
//   AVX/AVX2: 8-float vectors, 16 registers: 3 rows x 4 vectors = 12 accumulators.
//   otherwise (SSE): 4-float vectors, 16 registers: 1 row x 8 vectors.
// Each column's sum is accumulated in the same order over K whatever the width, so
// builds with fused multiply-add (FMA: every AVX2 and AVX-512 CPU) compute the same
// numbers; without FMA (SSE, AVX) each product is rounded before its sum.
#if defined(__AVX512F__)
constexpr int kVec = 16;
constexpr int64_t kRowBlock = 8;
#elif defined(__AVX__)
constexpr int kVec = 8;
constexpr int64_t kRowBlock = 3;
#else
constexpr int kVec = 4;
constexpr int64_t kRowBlock = 1;
#endif

typedef float vf __attribute__((vector_size(4 * kVec)));
typedef float vfu __attribute__((vector_size(4 * kVec), aligned(4)));
typedef uint16_t hu __attribute__((vector_size(2 * kVec), aligned(2)));
typedef uint32_t wv __attribute__((vector_size(4 * kVec)));

constexpr int64_t kTile = 32;             // columns per tile (the packed layout's)
constexpr int kPerTile = kTile / kVec;    // vectors per tile row
// Floats ahead of the current weights that each step asks the caches for (8 KiB,
// both of the step's cache lines, into the outer caches: prefetcht2). With 8 rows a
// step is 16 multiply-adds per 128 bytes, and the out-of-order window alone then
// keeps too few cache misses in flight: measured on an AVX-512 CPU, 48 [1024, 2816]
// matrices cost 1.50x at 8 rows what they cost at one without it, 1.16x with it.
constexpr int64_t kPrefetchBytes = 2048 * 4;

// kVec weights of a tile row as float32: loaded, or widened from bfloat16 bits.
inline vf LoadVec(const float* w) { return *reinterpret_cast<const vfu*>(w); }
inline vf LoadVec(const uint16_t* w) {
  const wv wide = __builtin_convertvector(*reinterpret_cast<const hu*>(w), wv);
  return reinterpret_cast<vf>(wide << 16);
}

// Tile j of p (K x 32, contiguous) against MB rows of x; writes the tile's columns
// below N.
template <int MB, typename W>
inline void Tile(const float* __restrict x, const W* __restrict tile,
                 float* __restrict y, int64_t K, int64_t N, int64_t n0) {
  constexpr int64_t kAhead = kPrefetchBytes / sizeof(W);
  constexpr int64_t kLine = 64 / sizeof(W);  // weights per cache line
  vf acc[MB][kPerTile];
  for (int m = 0; m < MB; ++m)
    for (int v = 0; v < kPerTile; ++v) acc[m][v] = vf{};
  const W* wp = tile;
  for (int64_t i = 0; i < K; ++i, wp += kTile) {
    // Past the tile's end this reads ahead into the next one (tiles are contiguous);
    // past the array's end a prefetch is a no-op, never a fault.
    __builtin_prefetch(wp + kAhead, 0, 1);
    if (kLine < kTile) __builtin_prefetch(wp + kAhead + kLine, 0, 1);
    vf w[kPerTile];
    for (int v = 0; v < kPerTile; ++v) w[v] = LoadVec(wp + v * kVec);
    for (int m = 0; m < MB; ++m) {
      const float xs = x[m * K + i];
      for (int v = 0; v < kPerTile; ++v) acc[m][v] += xs * w[v];
    }
  }
  if (n0 + kTile <= N) {
    for (int m = 0; m < MB; ++m)
      for (int v = 0; v < kPerTile; ++v)
        *reinterpret_cast<vfu*>(y + m * N + n0 + v * kVec) = acc[m][v];
  } else {  // the last, partial tile (its padding columns are not written)
    for (int m = 0; m < MB; ++m)
      for (int64_t c = 0; c < N - n0; ++c) y[m * N + n0 + c] = acc[m][c / kVec][c % kVec];
  }
}

// Tile<MB> for the block's row count mb (1 <= mb <= kRowBlock).
template <int MB, typename W>
inline void TileRows(int64_t mb, const float* x, const W* tile, float* y, int64_t K,
                     int64_t N, int64_t n0) {
  if constexpr (MB < kRowBlock) {
    if (mb <= MB) return Tile<MB>(x, tile, y, K, N, n0);
    return TileRows<MB + 1>(mb, x, tile, y, K, N, n0);
  } else {
    Tile<MB>(x, tile, y, K, N, n0);
  }
}

template <typename W>
void Tiles(const float* x, const W* p, float* y, int64_t mb, int64_t K, int64_t N,
           int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) TileRows<1>(mb, x, p + t * K * kTile, y, K, N, t * kTile);
}

// Tiles in chunks taken from one counter by the caller and by tasks on XLA's pool. A
// task that starts late (or never, on a busy pool) finds the counter exhausted, so
// the caller waits only for chunks already taken, which are being computed: no
// deadlock however busy the pool is.
template <ffi::DataType WT>
ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                        ffi::Buffer<WT> p, ffi::ResultBuffer<ffi::F32> y) {
  using W = ffi::NativeType<WT>;
  const auto xd = x.dimensions();
  const auto pd = p.dimensions();
  const auto yd = y->dimensions();
  if (xd.size() != 2 || pd.size() != 3 || yd.size() != 2 || pd[2] != kTile ||
      pd[1] != xd[1] || yd[0] != xd[0] || yd[1] > pd[0] * kTile ||
      yd[1] <= (pd[0] - 1) * kTile) {
    return ffi::Error::InvalidArgument(
        "specdec_packed_matmul: expected x [M, K], p [ceil(N / 32), K, 32], y [M, N]");
  }
  const int64_t M = xd[0], K = xd[1], N = yd[1], tiles = pd[0];
  const float* xp = x.typed_data();
  const W* pp = p.typed_data();
  float* yp = y->typed_data();
  // About 256 KiB of weights per chunk: enough to amortize a task, enough chunks to
  // balance the threads.
  const int64_t per_chunk = std::max<int64_t>(1, (256 << 10) / (K * kTile * int64_t{sizeof(W)}));
  const int64_t chunks = (tiles + per_chunk - 1) / per_chunk;
  const int64_t helpers =
      std::max<int64_t>(0, std::min<int64_t>(pool.num_threads(), chunks) - 1);
  struct Counters {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto work = [=]() {
    int64_t c;
    while ((c = counters->next.fetch_add(1)) < chunks) {
      const int64_t t0 = c * per_chunk, t1 = std::min(tiles, t0 + per_chunk);
      for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
        Tiles(xp + m0 * K, pp, yp + m0 * N, std::min(kRowBlock, M - m0), K, N, t0, t1);
      }
      counters->done.fetch_add(1);
    }
  };
  for (int64_t h = 0; h < helpers; ++h) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  while (counters->done.load() < chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

// The build's vector width in floats and rows per pass (`specdec.backends.cpu.kernel_shape`).
extern "C" int specdec_kernel_vector_floats() { return kVec; }
extern "C" int specdec_kernel_row_block() { return static_cast<int>(kRowBlock); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmul, PackedMatmul<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecdecPackedMatmulBf16, PackedMatmul<ffi::BF16>,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::BF16>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
