// mhc_pre forward in one read of x: a thread-block cluster shares the per-token sums on chip
// (docs/specs/mhc_pre.md, issue 27). Raw CUDA, sm_90; standalone (no torch headers), launched through the
// extern "C" functions at the bottom, which return the launch's cudaError_t (or kUnsupported).
//
// Why clusters: h_in = sum_k h_pre_k x_k needs h_pre, which needs the whole token row (n*D features)
// reduced against phi. A block cannot hold enough token rows to amortise phi's loads, so the row is
// split over the C blocks of a cluster; their partial sums meet through distributed shared memory
// (DSMEM), and each block then mixes the slice of x it still holds in shared memory. x leaves DRAM
// once (the two-pass Triton forward reads it twice).
//
// Grid: (C, ceil(T / BT)) with clusters of (C, 1, 1). Block `rank` of cluster `tb` holds tokens
// [tb*BT, tb*BT + BT) x every stream x features [rank*DS, rank*DS + DS) of each stream:
//   1. copy that tile to shared memory (cp.async, 16-byte vectors, all in flight; element loads where
//      x's strides or D do not allow vectors), zeros past T and past D;
//   2. partial h_mix = tile @ W^T and the sum of squares: bf16 MMAs (m16n8k16) on exact parts, as the
//      Triton kernels do (W = phi * gamma as three bf16 parts, x in 1/2/3 parts for bf16/fp16/fp32;
//      the products a_i w_j with i + j <= 2 in float32, every chain one 128-feature tile long, the
//      a_0 w_0 terms in a chain of their own, chains added with rounding adds). W comes from a copy in
//      the MMAs' fragment order (mhc_wfrag_kernel). Warp job (nt, ks) owns MMA column tile nt and the
//      ks-th share of the K tiles; the shares are added in a fixed order;
//   3. cluster barrier; every block sums the C partials of its tokens' pre columns and squares in rank
//      order (every block gets the same bits), block (t mod C) the whole row of token t, which it
//      writes out (h_mix, inv_rms, h_pre, h_post, h_res);
//   4. h_in for its feature slice from the tile in shared memory; a second cluster barrier keeps
//      every block's partials alive until the cluster's last reader is done.
// Deterministic: fixed-order sums, no atomics.
//
// Measured on an H100 (bf16, T = 16384, n = 4; .ci/mhc-cluster-ab at 8002ed4, the Triton forward and a
// copy of x in the same run; fractions of copy bandwidth use the floor's bytes): x is read once (ncu:
// 547 MB of DRAM reads, 152 MB of writes at D = 4096), but the kernel takes 1.01 ms at D = 4096 (24%;
// Triton 0.605, 40%) and 1.85 ms at D = 7168 (22%; Triton 0.892, 45%). Where the time goes (the same
// run, phases left out through mhc_tune): without the MMAs 0.52 / 0.80 ms (46% / 50%), the copy alone
// 0.45 / 0.71 ms. Plans: the default (3 blocks per SM: C = 8, 16 tokens at D = 4096) beat 32 tokens
// with C = 16 (2 per SM: 1.10 ms), 16 tokens with C = 16 (1.17) and 1 block per SM (2.79 at 128 KB).
// Earlier steps at D = 4096: W read from the [3, MP, nD] parts (8 rows x 16 bytes per warp load) 1.98
// ms; W in fragment order 1.35; a warp per copied row with token offsets computed once, and every DSMEM
// load of a sum in flight together 1.37 (no gain); ldmatrix A fragments and K tiles stepped without
// divisions 1.01. ncu at 8002ed4: 325 M warp instructions (124 M without the MMAs, at 820829a), tensor pipe 9%
// active, warps stalled mostly on barriers (3.2 cycles per issue) and fixed-latency dependencies (2.2):
// the phases run one after another in each block, and 3 blocks per SM do not hide them.
// What would reach 70% of copy bandwidth: see docs/kernels/cuda-mhc_pre.md (its section of that name).

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

namespace cg = cooperative_groups;

constexpr int kUnsupported = -1;  // the shape does not fit the cluster's shared memory
constexpr int kChain = 8;         // K tiles (16 features) per MMA chain: 128 features, as in Triton
constexpr int kSmemLimit = 227 * 1024;

enum : int { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };

// ---- dtypes: exact bf16 parts of element pairs ----------------------------------------------------

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __halves2bfloat162(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// v = p[0] + p[1] + ... exactly, each part a bf16 pair (PARTS 3 holds float32's 24 bits)
template <int PARTS>
__device__ __forceinline__ void split_pair(float a, float b, uint32_t (&p)[3]) {
  float ra = a, rb = b;
#pragma unroll
  for (int i = 0; i < PARTS; ++i) {
    const float ha = __bfloat162float(__float2bfloat16_rn(ra));
    const float hb = __bfloat162float(__float2bfloat16_rn(rb));
    p[i] = pack_bf16(ha, hb);
    ra -= ha;
    rb -= hb;
  }
}

template <typename T> struct Ty;

template <> struct Ty<float> {
  static constexpr int PARTS = 3;
  static constexpr int VEC = 4;
  __device__ static float f(float v) { return v; }
  __device__ static float from(float v) { return v; }
  // the pair at p (8-byte aligned) as floats and as bf16 parts
  __device__ static void pair(const float* p, float& a, float& b, uint32_t (&parts)[3]) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    a = v.x;
    b = v.y;
    split_pair<3>(a, b, parts);
  }
};

template <> struct Ty<__nv_bfloat16> {
  static constexpr int PARTS = 1;
  static constexpr int VEC = 8;
  __device__ static float f(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
  __device__ static void pair(const __nv_bfloat16* p, float& a, float& b, uint32_t (&parts)[3]) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(p);
    parts[0] = u;  // bf16 is its own single part
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&u);
    a = __low2float(v);
    b = __high2float(v);
  }
};

template <> struct Ty<__half> {
  static constexpr int PARTS = 2;  // 11 significant bits: two bf16 parts, exponents always fit
  static constexpr int VEC = 8;
  __device__ static float f(__half v) { return __half2float(v); }
  __device__ static __half from(float v) { return __float2half_rn(v); }
  __device__ static void pair(const __half* p, float& a, float& b, uint32_t (&parts)[3]) {
    const __half2 v = *reinterpret_cast<const __half2*>(p);
    a = __low2float(v);
    b = __high2float(v);
    split_pair<2>(a, b, parts);
  }
};

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

constexpr int kMaxCluster = 16;  // non-portable on sm_90 (the portable limit is 8)

// sum over the cluster's blocks q = 0 .. C-1 of their value at `p` (a shared-memory address), in rank
// order: every remote load in flight before the first add (one DSMEM round trip, not C)
__device__ __forceinline__ float cluster_sum(const cg::cluster_group& cluster, const float* p, int C) {
  float v[kMaxCluster];
#pragma unroll
  for (int q = 0; q < kMaxCluster; ++q) v[q] = q < C ? *cluster.map_shared_rank(p, q) : 0.f;
  float s = 0.f;
#pragma unroll
  for (int q = 0; q < kMaxCluster; ++q)
    if (q < C) s += v[q];
  return s;
}

// ---- the launch plan: cluster size, feature slice, tokens per block -------------------------------

struct Plan {
  int C = 0;       // blocks per cluster (feature slices)
  int64_t DS = 0;  // features of each stream per block (a multiple of 16)
  int mt = 0;      // 16-token MMA row tiles per block (BT = 16 * mt)
  int warps = 0;
  size_t smem = 0;
  bool ok = false;
};

// phases left out, for A/B measurements of where the time goes (mhc_tune): the MMAs, the cluster's
// meeting (each block keeps its own partial sums), the h_in mix. Results are wrong with any of them.
enum : int { kSkipGemm = 1, kSkipMeet = 2, kSkipMix = 4 };
int g_skip = 0;

int g_budget = 74 * 1024;  // shared memory per block to aim for: 3 blocks per SM
int g_cmax = kMaxCluster;
int g_mt = 2;

constexpr int kWarps = 8;

// MMA work of a block: column tiles (8 of W's rows each) x K shares, one job per warp at a time; with
// few column tiles the K tiles are shared out so that every warp has a job
struct Jobs {
  int nt, ks;
  __host__ __device__ explicit Jobs(int M) : nt((M + 7) / 8), ks(nt >= kWarps ? 1 : kWarps / nt) {}
  __host__ __device__ int count() const { return nt * ks; }
  __host__ __device__ int mc() const { return nt * 8 + 1; }  // columns of `mine`: h_mix's, then squares
};

// token rows of the tile are padded by 16 bytes: MMA fragment loads of 8 tokens hit 8 bank groups
__host__ __device__ inline int64_t token_stride(int n, int64_t DS, int es) { return n * DS + 16 / es; }

__host__ __device__ inline size_t up16(size_t v) { return (v + 15) / 16 * 16; }

// shared memory, in bytes from the start: the tile, each job's sums [job][2][32 lanes][4], the column
// tile 0 jobs' squares [ks][2][16], the block's partial rows, the cluster's sums, h_pre and inv_rms,
// x's offsets of the tile's tokens
struct Layout {
  size_t part, sq, mine, hsum, rows, tok, total;
  __host__ __device__ Layout(int n, int64_t DS, int es, int mt, Jobs J) {
    const int BT = 16 * mt;
    part = up16((size_t)BT * token_stride(n, DS, es) * es);
    sq = up16(part + (size_t)J.count() * 2 * 128 * 4);
    mine = up16(sq + (size_t)J.ks * 2 * 16 * 4);
    hsum = up16(mine + (size_t)BT * J.mc() * 4);
    rows = up16(hsum + (size_t)BT * (n + 1) * 4);
    tok = up16(rows + (size_t)BT * (n + 1) * 4);
    total = up16(tok + (size_t)BT * 8);
  }
};

Plan plan(int64_t D, int n, int M, int es) {
  auto make = [&](int c, int mt) {
    const int64_t DS = ((D + c - 1) / c + 15) / 16 * 16;
    return Plan{(int)((D + DS - 1) / DS), DS, mt, kWarps * 32, Layout(n, DS, es, mt, Jobs(M)).total, true};
  };
  // the most tokens per block, then the fewest blocks per cluster, within the budget
  for (int mt = g_mt; mt >= 1; --mt)
    for (int c = 1; c <= g_cmax; ++c) {
      const Plan p = make(c, mt);
      if (p.smem <= (size_t)g_budget) return p;
    }
  // nothing within it: the largest cluster, with the most tokens that fit at all
  for (int mt = g_mt; mt >= 1; --mt) {
    const Plan p = make(g_cmax, mt);
    if (p.smem <= (size_t)kSmemLimit) return p;
  }
  return Plan{};
}

// ---- the kernel -----------------------------------------------------------------------------------

struct Args {
  const void* x;
  int64_t T, S, D, sxb, sxs, sxn, sxd;
  int n, M, MP;
  const uint2* wf;  // W's MMA fragments (mhc_wfrag_kernel)
  const float* alpha;
  const float* bias;
  float norm_eps, hc_eps, post_mult;
  void* h_in;  // [T, D], x's dtype
  float* h_post;  // [T, n]
  float* h_res;  // [T, n, n]
  float* h_mix;  // [T, MP]
  float* inv;  // [T]
  float* h_pre;  // [T, n]
  int vec_x;  // x's tile copies as 16-byte vectors
  int vec_out;  // h_in stores as 16-byte vectors
};

// 1. the tile: tokens [t0, t0 + BT) x n streams x features [d0, d0 + valid) at xs[t * TS + k * DS + c];
// zeros in the rows past T and, in the last K tile, past `valid` (the MMAs read whole 16-feature tiles).
// A warp copies one (token, stream) row at a time, its lanes along the features: index arithmetic once
// per row (token offsets once per token: a 64-bit division each), not per element.
template <typename T>
__device__ void load_tile(const Args& a, T* xs, int64_t* tok, int64_t t0, int64_t d0, int DS, int valid, int BT,
                          int TS) {
  constexpr int V = Ty<T>::VEC;
  const T* x = static_cast<const T*>(a.x);
  const int n = a.n, span = (valid + 15) / 16 * 16, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nw = blockDim.x >> 5, rows = a.T - t0 < BT ? (int)(a.T - t0) : BT;
  for (int t = threadIdx.x; t < rows; t += blockDim.x) {
    const int64_t tt = t0 + t, b = tt / a.S;
    tok[t] = b * a.sxb + (tt - b * a.S) * a.sxs;
  }
  __syncthreads();
  const T zero = Ty<T>::from(0.f);
  for (int r = warp; r < BT * n; r += nw) {
    const int t = r / n, k = r - (r / n) * n;
    T* dst = xs + t * TS + k * DS;
    if (t >= rows) {
      for (int c = lane; c < span; c += 32) dst[c] = zero;
      continue;
    }
    const T* src = x + tok[t] + k * a.sxn;
    if (a.vec_x) {
      for (int c = lane * V; c < valid; c += 32 * V) cp_async16(dst + c, src + d0 + c);
    } else {
      for (int c = lane; c < valid; c += 32) dst[c] = src[(d0 + c) * a.sxd];
    }
    for (int c = valid + lane; c < span; c += 32) dst[c] = zero;
  }
  if (a.vec_x) asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
}

// W's B fragments, in the order the MMAs take them: for K tile ft (16 features of one stream: ft = k *
// ceil(D/16) + d/16), column tile nt and part p, lane (g, tig) holds rows nt*8 + g, k pairs 2*tig and
// 2*tig + 8 as one uint2, zeros past D: a warp loads 256 contiguous bytes per part (the [3, MP, nD] parts
// gave 8 rows x 16 bytes per load, half of each sector)
__global__ void mhc_wfrag_kernel(const __nv_bfloat16* __restrict__ w, int MP, int n, int64_t D, int NT,
                                 uint2* __restrict__ wf) {
  const int64_t nd16 = (D + 15) / 16, total = (int64_t)n * nd16 * NT * 3 * 32;
  const unsigned short* wb = reinterpret_cast<const unsigned short*>(w);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int lane = (int)(i % 32), p = (int)(i / 32 % 3), nt = (int)(i / 96 % NT);
    const int64_t ft = i / (96 * NT), k = ft / nd16, d = (ft % nd16) * 16;
    const int m = nt * 8 + lane / 4, tig = lane % 4;
    const unsigned short* row = wb + ((int64_t)p * MP + m) * (n * D) + k * D;
    unsigned e[4];
    const int k4[4] = {2 * tig, 2 * tig + 1, 8 + 2 * tig, 9 + 2 * tig};
#pragma unroll
    for (int q = 0; q < 4; ++q) e[q] = d + k4[q] < D ? row[d + k4[q]] : 0u;
    wf[i] = make_uint2(e[0] | (e[1] << 16), e[2] | (e[3] << 16));
  }
}

// The A fragment (rows g, g + 8 of a 16-token row tile; columns 2*tig (+1) and 2*tig + 8 (+1) of a K tile
// at `tile`) as bf16 parts, and its elements as floats (for the squares). bf16: one ldmatrix, the data is
// its own single part.
template <typename T>
__device__ __forceinline__ void a_frag(const T* tile, int TS, uint32_t (&ap)[4][3], float (&v)[4][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  const T* base = tile + g * TS + 2 * tig;
  const T* at[4] = {base, base + 8 * TS, base + 8, base + 8 * TS + 8};
#pragma unroll
  for (int r = 0; r < 4; ++r) Ty<T>::pair(at[r], v[r][0], v[r][1], ap[r]);
}

template <>
__device__ __forceinline__ void a_frag<__nv_bfloat16>(const __nv_bfloat16* tile, int TS, uint32_t (&ap)[4][3],
                                                      float (&v)[4][2]) {
  const int lane = threadIdx.x & 31;
  // lane l addresses row l % 16, columns (l / 16) * 8 .. +7: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15)
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(tile + (lane & 15) * TS + (lane >> 4) * 8));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(ap[0][0]), "=r"(ap[1][0]), "=r"(ap[2][0]), "=r"(ap[3][0])
               : "r"(addr));
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    v[r][0] = __uint_as_float(ap[r][0] << 16);
    v[r][1] = __uint_as_float(ap[r][0] & 0xffff0000u);
  }
}

// acc[c][mt] += (row tile mt of the K tile at xs_tile) @ B: class 0 the terms a_i w_j with i + j >= 1,
// class 1 a_0 w_0 (apart, so that the small terms never round against the large partial sums); sq gets
// the squares of the fragment's elements (rows g and g + 8)
template <typename T, int MT>
__device__ __forceinline__ void tile_mma(const T* xs_tile, int TS, int mt_used, const uint32_t (&b)[3][2],
                                         float (&acc)[2][MT][4], float (&sq)[MT][2], bool squares) {
  constexpr int XP = Ty<T>::PARTS;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    if (mt >= mt_used) break;
    uint32_t ap[4][3];
    float v[4][2];
    a_frag<T>(xs_tile + mt * 16 * TS, TS, ap, v);
    if (squares) {
      sq[mt][0] += v[0][0] * v[0][0] + v[0][1] * v[0][1] + v[2][0] * v[2][0] + v[2][1] * v[2][1];
      sq[mt][1] += v[1][0] * v[1][0] + v[1][1] * v[1][1] + v[3][0] * v[3][0] + v[3][1] * v[3][1];
    }
    uint32_t A[3][4];
#pragma unroll
    for (int i = 0; i < 3; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) A[i][r] = ap[r][i];
    // smallest first within class 0
    if (XP >= 3) mma(acc[0][mt], A[2], b[0][0], b[0][1]);
    if (XP >= 2) mma(acc[0][mt], A[1], b[1][0], b[1][1]);
    mma(acc[0][mt], A[0], b[2][0], b[2][1]);
    if (XP >= 2) mma(acc[0][mt], A[1], b[0][0], b[0][1]);
    mma(acc[0][mt], A[0], b[1][0], b[1][1]);
    mma(acc[1][mt], A[0], b[0][0], b[0][1]);
  }
}

// 2. this warp's share of the K tiles against column tile wn: one chain of MMAs per kChain K tiles, the
// chains added with rounding float32 adds. W's fragments G K tiles at a time (G round trips to L2 in
// flight; G < kChain where registers are short). K tile u is stream k = u / nj, tile j = u % nj of the
// slice; (k, j) step along without divisions.
template <typename T, int MT, int G>
__device__ void warp_gemm(const Args& a, const T* xs, int TS, int DS, int64_t d0, int valid, int wn, int ks, int KS,
                          int mt_used, float (&acc)[MT][4], float (&sq)[MT][2]) {
  // (no early exits below: every lane of the warp takes part in the MMAs and shuffles)
  const int nj = (valid + 15) / 16, units = nj * a.n, NT = (a.M + 7) / 8;
  const int nd16 = (int)((a.D + 15) / 16), f0 = (int)(d0 / 16);
  const int u_lo = units * ks / KS, u_hi = units * (ks + 1) / KS;
  const uint2* wbase = a.wf + wn * 96 + (threadIdx.x & 31);
  const bool squares = wn == 0;
  int k = u_lo / nj, j = u_lo - k * nj;
  for (int u = u_lo; u < u_hi; u += kChain) {
    float ch[2][MT][4] = {};
    for (int v = u; v < u + kChain && v < u_hi; v += G) {
      uint32_t b[G][3][2];
      int xo[G];  // the K tiles' offsets in the tile (32-bit: fewer registers than pointers)
#pragma unroll
      for (int i = 0; i < G; ++i) {
        if (v + i < u_hi) {
          const uint2* w = wbase + (k * nd16 + f0 + j) * NT * 96;
#pragma unroll
          for (int p = 0; p < 3; ++p) {
            const uint2 q = __ldg(w + p * 32);
            b[i][p][0] = q.x;
            b[i][p][1] = q.y;
          }
          xo[i] = k * DS + j * 16;
          if (++j == nj) {
            j = 0;
            ++k;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < G; ++i)
        if (v + i < u_hi) tile_mma<T, MT>(xs + xo[i], TS, mt_used, b[i], ch, sq, squares);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][i] += ch[0][mt][i] + ch[1][mt][i];
  }
  // the rows' squares: the quad's four lanes hold different columns of the same rows
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sq[mt][h] += __shfl_xor_sync(0xffffffffu, sq[mt][h], 1);
      sq[mt][h] += __shfl_xor_sync(0xffffffffu, sq[mt][h], 2);
    }
}

// this block's partial rows -> mine[t * MC + col] (the squares in column nt * 8): each column tile's K
// shares, parked per job, added in share order
template <typename T, int G>
__device__ void block_partials(const Args& a, const T* xs, int TS, int DS, int64_t d0, int valid, int mt_used,
                               Jobs J, float* part, float* sqp, float* mine) {
  constexpr int MT = 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
  for (int job = warp; job < J.count(); job += kWarps) {
    const int wn = job % J.nt, ks = job / J.nt;
    float acc[MT][4] = {}, sq[MT][2] = {};
    warp_gemm<T, MT, G>(a, xs, TS, DS, d0, valid, wn, ks, J.ks, mt_used, acc, sq);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      *reinterpret_cast<float4*>(part + ((job * MT + mt) * 32 + lane) * 4) =
          make_float4(acc[mt][0], acc[mt][1], acc[mt][2], acc[mt][3]);
    if (wn == 0 && tig == 0)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        sqp[(ks * MT + mt) * 16 + g] = sq[mt][0];
        sqp[(ks * MT + mt) * 16 + g + 8] = sq[mt][1];
      }
  }
  __syncthreads();
  // element (row tile mt, column tile wn, lane, i) of the MMA layout is row mt*16 + lane/4 + 8*(i/2),
  // column wn*8 + 2*(lane%4) + i%2
  const int MC = J.mc(), BT = 16 * mt_used;
  for (int e = threadIdx.x; e < J.nt * mt_used * 128; e += blockDim.x) {
    const int i = e % 4, l = (e / 4) % 32, mt = (e / 128) % mt_used, wn = e / (128 * mt_used);
    float s = 0.f;
    for (int ks = 0; ks < J.ks; ++ks) s += part[(((ks * J.nt + wn) * MT + mt) * 32 + l) * 4 + i];
    mine[(mt * 16 + l / 4 + 8 * (i / 2)) * MC + wn * 8 + 2 * (l % 4) + i % 2] = s;
  }
  for (int t = threadIdx.x; t < BT; t += blockDim.x) {
    const int mt = t / 16, r = t % 16;
    float s = 0.f;
    for (int ks = 0; ks < J.ks; ++ks) s += sqp[(ks * MT + mt) * 16 + r];
    mine[t * MC + J.nt * 8] = s;
  }
}

// MINB: blocks per SM the registers must allow (3 where the shared memory lets 3 blocks in)
template <typename T, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB)
mhc_fwd_cluster_kernel(Args a, int DS, int mt_used, int skip) {
  const Jobs J(a.M);
  const int MC = J.mc();
  extern __shared__ __align__(16) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
  const int BT = 16 * mt_used, n = a.n, es = (int)sizeof(T), tid = threadIdx.x, nth = blockDim.x;
  const int TS = (int)token_stride(n, DS, es);
  const Layout L(n, DS, es, mt_used, J);
  T* xs = reinterpret_cast<T*>(smem);
  float* mine = reinterpret_cast<float*>(smem + L.mine);
  float* hsum = reinterpret_cast<float*>(smem + L.hsum);
  float* rows = reinterpret_cast<float*>(smem + L.rows);  // [t][k]: h_pre, [t][n]: inv_rms

  const int64_t t0 = (int64_t)blockIdx.y * BT, d0 = (int64_t)rank * DS;
  const int valid = a.D - d0 < DS ? (int)(a.D - d0) : DS;  // features of each stream in this slice
  load_tile<T>(a, xs, reinterpret_cast<int64_t*>(smem + L.tok), t0, d0, DS, valid, BT, TS);

  if (!(skip & kSkipGemm)) block_partials<T, MINB == 3 ? kChain / 2 : kChain>(a, xs, TS, DS, d0, valid, mt_used, J, reinterpret_cast<float*>(smem + L.part),
                    reinterpret_cast<float*>(smem + L.sq), mine);

  // 3. the cluster's sums, in rank order: pre columns and squares of every token
  cluster.sync();
  for (int i = tid; i < BT * (n + 1); i += nth) {
    const int t = i / (n + 1), j = i % (n + 1);
    const int col = j < n ? j : J.nt * 8;
    hsum[i] = skip & kSkipMeet ? mine[t * MC + col] : cluster_sum(cluster, mine + t * MC + col, C);
  }
  __syncthreads();
  const float nDf = (float)((int64_t)n * a.D);
  for (int t = tid; t < BT; t += nth) {
    const float inv = 1.f / sqrtf(hsum[t * (n + 1) + n] / nDf + a.norm_eps);
    rows[t * (n + 1) + n] = inv;
    for (int k = 0; k < n; ++k)
      rows[t * (n + 1) + k] = sigmoid(a.alpha[0] * (hsum[t * (n + 1) + k] * inv) + a.bias[k]) + a.hc_eps;
  }
  __syncthreads();
  // whole rows of tokens t = rank mod C: h_mix (zeros past M), inv_rms, h_pre, h_post, h_res
  const int own = BT > rank ? (BT - rank + C - 1) / C : 0;
  for (int i = tid; i < own * a.MP; i += nth) {
    const int t = rank + (i / a.MP) * C, m = i % a.MP;
    const int64_t tt = t0 + t;
    if (tt >= a.T) continue;
    const float hm = m >= a.M ? 0.f : skip & kSkipMeet ? mine[t * MC + m] : cluster_sum(cluster, mine + t * MC + m, C);
    a.h_mix[tt * a.MP + m] = hm;
    if (m >= a.M) continue;
    const float inv = rows[t * (n + 1) + n];
    if (m == 0) a.inv[tt] = inv;
    const int sec = (m >= n) + (m >= 2 * n);
    const float z = a.alpha[sec] * (hm * inv) + a.bias[m];
    if (sec == 0)
      a.h_pre[tt * n + m] = rows[t * (n + 1) + m];
    else if (sec == 1)
      a.h_post[tt * n + (m - n)] = a.post_mult * sigmoid(z);
    else
      a.h_res[tt * n * n + (m - 2 * n)] = z;
  }
  // this block has read every partial it needs; the others may leave once they have too
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");

  // 4. h_in = sum_k h_pre_k x_k over this slice
  T* out = static_cast<T*>(a.h_in);
  const int live = a.T - t0 < BT ? (int)(a.T - t0) : BT;
  const int warp = tid >> 5, lane = tid & 31;
  for (int t = warp; t < (skip & kSkipMix ? 0 : live); t += nth >> 5) {
    const float* hp = rows + t * (n + 1);
    const T* xt = xs + t * TS;
    T* ot = out + (t0 + t) * a.D + d0;
    if (a.vec_out) {
      constexpr int V = Ty<T>::VEC;
      for (int c = lane * V; c < valid; c += 32 * V) {
        float o[V] = {};
        for (int k = 0; k < n; ++k) {
          const uint4 raw = *reinterpret_cast<const uint4*>(xt + k * DS + c);
          const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int q = 0; q < V; ++q) o[q] += hp[k] * Ty<T>::f(e[q]);
        }
        uint4 packed;
        T* pe = reinterpret_cast<T*>(&packed);
#pragma unroll
        for (int q = 0; q < V; ++q) pe[q] = Ty<T>::from(o[q]);
        *reinterpret_cast<uint4*>(ot + c) = packed;
      }
    } else {
      for (int c = lane; c < valid; c += 32) {
        float o = 0.f;
        for (int k = 0; k < n; ++k) o += hp[k] * Ty<T>::f(xt[k * DS + c]);
        ot[c] = Ty<T>::from(o);
      }
    }
  }
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The plan of a forward over T tokens (not ok: the row does not fit a cluster, or the token blocks overflow
// gridDim.y)
Plan launch_plan(int dtype, int n, int64_t D, int64_t T) {
  Plan p = plan(D, n, n * n + 2 * n, dtype == DT_F32 ? 4 : 2);
  if (p.ok && (T + 16 * p.mt - 1) / (16 * p.mt) > 65535) p.ok = false;
  return p;
}

void write_plan(const Plan& p, int64_t* out) {
  if (!out) return;
  out[0] = p.C;
  out[1] = p.DS;
  out[2] = 16 * p.mt;
  out[3] = p.warps;
  out[4] = (int64_t)p.smem;
}

template <typename T>
cudaError_t launch(const Args& a, const Plan& p, cudaStream_t st) {
  const int64_t nb = (a.T + 16 * p.mt - 1) / (16 * p.mt);
  // 1 KB of each block's shared memory is the system's; 228 KB per SM
  auto kern = 3 * (p.smem + 1024) <= 228 * 1024 ? mhc_fwd_cluster_kernel<T, 3> : mhc_fwd_cluster_kernel<T, 2>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)p.smem);
  if (e != cudaSuccess) return e;
  if (p.C > 8) {
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)p.C, (unsigned)nb);
  cfg.blockDim = dim3((unsigned)p.warps);
  cfg.dynamicSmemBytes = p.smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)p.C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, kern, a, (int)p.DS, p.mt, g_skip);
  return e != cudaSuccess ? e : cudaGetLastError();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

extern "C" {

// The forward. x: [B, S, n, D] with element strides sx*; w: phi * gamma as bf16 parts [3, MP, n*D]; wf:
// scratch of mhc_wfrag_bytes(n, D) bytes for W's MMA fragments;
// outputs as in docs/specs/mhc_pre.md plus h_mix [T, MP], inv_rms [T], h_pre [T, n] (dense float32), h_in
// [T, D] dense in x's dtype. plan_out (may be NULL): C, DS, tokens per block, threads, shared memory.
// Returns 0, a cudaError_t, or -1 where the shape does not fit a cluster's shared memory.
int mhc_fwd(const void* x, int dtype, int64_t B, int64_t S, int n, int64_t D, int64_t sxb, int64_t sxs,
            int64_t sxn, int64_t sxd, const void* w, int MP, void* wf, const float* alpha, const float* bias, float norm_eps,
            float hc_eps, float post_mult, void* h_in, float* h_post, float* h_res, float* h_mix, float* inv,
            float* h_pre, int64_t* plan_out, void* stream) {
  Args a{};
  a.x = x;
  a.T = B * S;
  a.S = S;
  a.D = D;
  a.sxb = sxb;
  a.sxs = sxs;
  a.sxn = sxn;
  a.sxd = sxd;
  a.n = n;
  a.M = n * n + 2 * n;
  a.MP = MP;
  a.wf = static_cast<const uint2*>(wf);
  a.alpha = alpha;
  a.bias = bias;
  a.norm_eps = norm_eps;
  a.hc_eps = hc_eps;
  a.post_mult = post_mult;
  a.h_in = h_in;
  a.h_post = h_post;
  a.h_res = h_res;
  a.h_mix = h_mix;
  a.inv = inv;
  a.h_pre = h_pre;
  if (a.T <= 0 || n < 1 || n > 8 || D < 1 || MP < a.M || dtype < DT_F32 || dtype > DT_F16)
    return (int)cudaErrorInvalidValue;
  const int es = dtype == DT_F32 ? 4 : 2, V = 16 / es;
  // a B of 1 or an S of 1 makes that stride irrelevant
  const bool strides_vec = (B == 1 || sxb % V == 0) && (S == 1 || sxs % V == 0) && (n == 1 || sxn % V == 0);
  a.vec_x = sxd == 1 && D % V == 0 && strides_vec && aligned16(x);
  a.vec_out = D % V == 0 && aligned16(h_in);
  const Plan p = launch_plan(dtype, n, D, a.T);
  write_plan(p, plan_out);
  if (!p.ok) return kUnsupported;  // before any launch
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int NT = (a.M + 7) / 8;
  const int64_t frags = (int64_t)n * ((D + 15) / 16) * NT * 96;
  mhc_wfrag_kernel<<<(unsigned)((frags + 255) / 256 < 4096 ? (frags + 255) / 256 : 4096), 256, 0, st>>>(
      static_cast<const __nv_bfloat16*>(w), MP, n, D, NT, static_cast<uint2*>(wf));
  cudaError_t le = cudaGetLastError();
  if (le != cudaSuccess) return (int)le;
  switch (dtype) {
    case DT_F32: return (int)launch<float>(a, p, st);
    case DT_BF16: return (int)launch<__nv_bfloat16>(a, p, st);
    case DT_F16: return (int)launch<__half>(a, p, st);
    default: return (int)cudaErrorInvalidValue;
  }
}

// The plan mhc_fwd would launch (plan_out as there), without launching anything: 0, or -1 where the shape
// does not fit a cluster's shared memory (the caller takes another forward before allocating for this one).
int mhc_plan(int dtype, int n, int64_t D, int64_t T, int64_t* plan_out) {
  const Plan p = launch_plan(dtype, n, D, T);
  write_plan(p, plan_out);
  return p.ok ? 0 : kUnsupported;
}

// Bytes of the scratch for W's MMA fragments (mhc_fwd's wf).
int64_t mhc_wfrag_bytes(int n, int64_t D) {
  return (int64_t)n * ((D + 15) / 16) * ((n * n + 2 * n + 7) / 8) * 96 * (int64_t)sizeof(uint2);
}

// Knobs for A/B measurements (< 0 keeps a setting, 0 restores the default): the shared memory per block
// to aim for, the largest cluster, 16-token row tiles per block (1 or 2), phases to leave out (kSkip*
// bits: wrong results). Returns the budget before the call.
int mhc_tune(int budget, int cmax, int mt, int skip) {
  const int old = g_budget;
  if (budget >= 0) g_budget = budget ? budget : 74 * 1024;
  if (cmax >= 0) g_cmax = cmax && cmax < kMaxCluster ? cmax : kMaxCluster;
  if (mt >= 0) g_mt = mt == 1 ? 1 : 2;
  if (skip >= 0) g_skip = skip;
  return old;
}

const char* mhc_error_string(int code) {
  return code == kUnsupported ? "the shape does not fit a cluster's shared memory"
                              : cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // extern "C"
