// softmax_xent: cross-entropy over materialized logits [N, V] (docs/specs/softmax_xent.md), raw CUDA, sm_90.
//
// Standalone: no torch headers. Everything is launched through the extern "C" functions at the
// bottom, which take raw pointers, sizes, element strides, a dtype code and a cudaStream_t, and
// return the cudaError_t of the launch (cudaGetLastError), so that a bad launch (e.g. blockDim > 1024)
// becomes an exception in Python instead of a silent no-op.
//
// Design (bytes for bf16 logits, N*V elements):
//  * xent_forward with dlogits != NULL (mean/sum, gradient wanted): the row's online max/sum (pass 1),
//    the per-row loss, and dlogits for an upstream gradient g = 1 (pass 2). Rows of 64 KB or more go to
//    the cluster kernel: C blocks hold the row in shared memory, so it is read once (the floor: one
//    read, one write; "one read" below). Shorter rows (and rows whose logits and dlogits vectors are
//    aligned differently) go to the row kernel: one block per row re-reading the row for pass 2
//    (read 2*N*V*2 + write N*V*2 bytes), with cache hints so that part of the re-read hits L2 ("L2
//    traffic" below).
//  * In place (dlogits == logits, the cuda-inplace backend): the same kernels; every element is read
//    before it is overwritten, by the thread that overwrites it.
//  * xent_backward recomputes dlogits = (mu g / D) ((1 + 2 lam LSE) p - (1-eps)[j==y] - eps/V) from
//    the saved per-row (max, log sum): read N*V*2 + write N*V*2. With skip_if_one it first reads g
//    on the device and returns at once when g == 1 (the forward's dlogits are then already right),
//    so the common loss.backward() costs no extra pass and needs no host synchronisation.
//    loss.backward() moves 2*N*V*2 bytes in all; a scaled loss (g != 1) 4*N*V*2.
//  * Without a wanted gradient (or for reduction "none", whose g is per row) the forward only reads
//    the logits (N*V*2) and the backward reads + writes (2*N*V*2).
//  * Loss reductions are deterministic: per-row losses go to a float buffer and one block sums them
//    in a fixed order. No float atomics anywhere; results are bitwise reproducible.
//  * Any blockDim <= 1024 works (grid-stride loops, partial-warp reductions); the launchers use
//    row_threads() threads (or the xent_tune override) and return the launch error otherwise.
//
// Numerics: float32 accumulation throughout; p = exp((z - m) - log1p(r)) keeps z - m exact for close
// values (extreme logits +-1e4); r excludes one max element so confident rows keep their digits; the
// target's p - 1 is expm1(log p) in float32, rounded to the output dtype once (no bf16 cancellation).
//
// Compensated (Kahan) summation: not used, because it does not help here. Measured on an H200
// (fp32 logits randn * {1, 2, 10}, V = 128256, N = 256): the kernel's LSE error against float64 is at
// most 5.8e-7, 3.8e-7, 1.2e-7 (under half an ulp of LSE) without it and 6.4e-7, 3.8e-7, 1.2e-7 with
// it (-DXENT_KAHAN), since each thread adds only ~V/blockDim terms before a fixed tree. The seed's
// single sequential float32 loop does lose digits: 2.8e-5 relative at V = 128256 (Kahan: 3.7e-8),
// but 9e-8 at its V = 34, so summation was not its 41% gradient error.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kMaxThreads = 1024;
// vectors in flight per thread (memory-level parallelism); measured on an H200 with the L2 hints
// below (V = 128256 bf16, 512 threads): 8 1.480 ms, 6 1.535, 4 1.606; 2 was slower still
constexpr int kUnroll = 8;

enum : int { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2 };
enum : int { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

// ---- dtype traits: 16-byte vectors of VEC elements ------------------------------------------------
// Host-callable too, so that scratch host programs can run the per-thread passes below.
// FAST: exp via exp2f(x * log2 e) (one MUFU op) for 16-bit dtypes, where its few-ulp float32 error
// is far below the output's rounding; float32 logits keep the accurate expf.

template <typename T> struct Ty;

template <> struct Ty<float> {
  static constexpr int VEC = 4;
  static constexpr bool FAST = false;
  __host__ __device__ static float to_f(float x) { return x; }
  __host__ __device__ static float from_f(float x) { return x; }
  __host__ __device__ static void unpack(const uint4& u, float* o) {
    const float4 f = *reinterpret_cast<const float4*>(&u);
    o[0] = f.x; o[1] = f.y; o[2] = f.z; o[3] = f.w;
  }
  __host__ __device__ static uint4 pack(const float* o) {
    const float4 f = make_float4(o[0], o[1], o[2], o[3]);
    return *reinterpret_cast<const uint4*>(&f);
  }
};

template <> struct Ty<__nv_bfloat16> {
  static constexpr int VEC = 8;
  static constexpr bool FAST = true;
  __host__ __device__ static float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  __host__ __device__ static __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
  __host__ __device__ static void unpack(const uint4& u, float* o) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      o[2 * k] = f.x; o[2 * k + 1] = f.y;
    }
  }
  __host__ __device__ static uint4 pack(const float* o) {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(o[2 * k], o[2 * k + 1]);
    return u;
  }
};

template <> struct Ty<__half> {
  static constexpr int VEC = 8;
  static constexpr bool FAST = true;
  __host__ __device__ static float to_f(__half x) { return __half2float(x); }
  __host__ __device__ static __half from_f(float x) { return __float2half_rn(x); }
  __host__ __device__ static void unpack(const uint4& u, float* o) {
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      o[2 * k] = f.x; o[2 * k + 1] = f.y;
    }
  }
  __host__ __device__ static uint4 pack(const float* o) {
    uint4 u;
    __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(o[2 * k], o[2 * k + 1]);
    return u;
  }
};

template <typename T> constexpr int vec_of() { return 16 / (int)sizeof(T); }

// ex2.approx.ftz: the bare MUFU instruction (exp2f adds a denormal-result fix-up around it; results
// below 2^-126 flush to 0 here, far under a 16-bit output's resolution)
__host__ __device__ __forceinline__ float ex2_approx(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

template <bool FAST> __host__ __device__ __forceinline__ float ex(float x) {
  if (FAST) return ex2_approx(x * 1.4426950408889634f);
  return expf(x);
}

// dlogits are written once and never re-read here: streaming stores keep them out of the way in L2
__host__ __device__ __forceinline__ void store_stream(uint4* p, const uint4& v) {
#ifdef __CUDA_ARCH__
  __stcs(p, v);
#else
  *p = v;
#endif
}

// ---- L2 traffic of the forward with gradient ----------------------------------------------------
// Pass 1 reads the row asking L2 to keep it (evict_last), pass 2 reads it back, last row vectors first
// (those pass 1 read last), marked evict-first, and the dlogits stores stream past L2: part of the
// re-read then hits L2. Measured on an H200 (N = 8192, bf16, loss.backward(), 512 threads and 8
// vectors in flight, as below): V = 128256 1.676 -> 1.480 ms (512 threads), V = 50257 (N = 4096)
// 0.383 -> 0.373 ms and V = 32000 0.453 -> 0.413 ms (both 256 threads); the gradient bits do not
// change with the hints. Without a gradient to write, pass 1 is the row's only read and loads plainly.

template <bool KEEP>
__host__ __device__ __forceinline__ uint4 load_pass1(const uint4* p) {
#ifdef __CUDA_ARCH__
  if (KEEP) {
    uint4 v;
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(pol));
    return v;
  }
#endif
  return *p;
}

__host__ __device__ __forceinline__ uint4 load_pass2(const uint4* p) {
#ifdef __CUDA_ARCH__
  return __ldcs(p);
#else
  return *p;
#endif
}

// ---- row addressing --------------------------------------------------------------------------------
// Row `row` of a [N, *] buffer with row stride `ls` elements. Every kernel reaches its rows through
// these two, so that the offset stays 64-bit everywhere (N*V exceeds 2^31 in the full preset).
template <typename T>
__device__ __forceinline__ const T* row_in(const T* base, int64_t row, int64_t ls) {
  return base + row * ls;  // 64-bit: N*V exceeds 2^31 in the full preset
}
template <typename T>
__device__ __forceinline__ T* row_out(T* base, int64_t row, int64_t ls) {
  return base + row * ls;
}

// ---- geometry: one block's share of a row ---------------------------------------------------------
// A row is: `h` scalar head elements up to the first 16-byte aligned address, `nb` aligned vectors
// of w elements, then a scalar tail. Body vectors are split evenly over `parts` blocks; part 0 also
// takes the head, the last part the tail. With w == 1 (no vector path) the head is empty.

struct Span {
  int64_t head_hi;  // head is [0, head_hi)
  int64_t base;     // element index of body vector 0
  int64_t v0, v1;   // this block's body vectors [v0, v1)
  int64_t tail_lo, tail_hi;
  int w;
};

__host__ __device__ inline Span make_span(uintptr_t row_addr, int es, int64_t V, int w, int parts,
                                          int part) {
  Span s;
  int64_t h = 0;
  if (w > 1) {
    h = (int64_t)(((16u - (unsigned)(row_addr & 15u)) & 15u) / (unsigned)es);
    if (h > V) h = V;
  }
  const int64_t nb = (V - h) / w;
  const int64_t cv = (nb + parts - 1) / parts;
  s.w = w;
  s.base = h;
  s.v0 = (int64_t)part * cv < nb ? (int64_t)part * cv : nb;
  s.v1 = s.v0 + cv < nb ? s.v0 + cv : nb;
  s.head_hi = part == 0 ? h : 0;
  s.tail_lo = h + nb * w;
  s.tail_hi = part == parts - 1 ? V : s.tail_lo;
  return s;
}

// ---- online (max, sum) with a fixed reduction tree -----------------------------------------------
// The sum leaves out one element at the max (its exp is exactly 1): r = sum_j exp(z_j - m) - 1, and
// log sum = log1p(r). In a confident row (p_y -> 1, r ~ 1e-8) the loss LSE - z_y = log1p(r) and the
// target's p - 1 keep their digits, where 1 + r would round to 1 in float32 and give exactly 0.

struct MS {
  float m;  // running max
  float r;  // sum of exp(z - m) over the elements seen, minus one element at the max
  float z;  // sum of z (label smoothing)
};

__host__ __device__ __forceinline__ MS ms_identity() { return MS{-INFINITY, 0.f, 0.f}; }

// exp(b - a), b <= a, for a factor that scales a whole partial sum: fl(b - a) is off by up to half an ulp
// of |b - a| (1e-6 at a gap of 27, a confident row's target against the rest), one relative error on the
// whole partial, where the per-element exponentials' errors average out. In float32 that put the loss of
// confident rows (N128-V1025-confident-none) at 1.6x its bound on an H200. TwoSum gives the subtraction's
// exact error e, and exp(d + e) = exp(d) (1 + e).
__host__ __device__ __forceinline__ float exp_diff(float b, float a) {
  const float d = b - a, bv = d + a, av = bv - d;
  const float e = (b - bv) + (av - a);
  const float f = expf(d);
  return d > -INFINITY ? fmaf(f, e, f) : f;  // d = -inf: 0 (e is NaN there); a NaN d stays NaN
}

__host__ __device__ __forceinline__ void ms_merge(MS& a, const MS& b) {
  a.z += b.z;
  if (b.m == -INFINITY) {  // b is empty or all -inf: adds nothing (but a NaN in b.r propagates)
    a.r += b.r;
    return;
  }
  if (a.m == -INFINITY) {
    a.r += b.r;
    a.m = b.m;
    return;
  }
  // the smaller side's excluded max element becomes an ordinary term: (r + 1) exp(m_small - m_big)
  if (a.m >= b.m) {
    a.r = a.r + (b.r + 1.f) * exp_diff(b.m, a.m);
  } else {
    a.r = b.r + (a.r + 1.f) * exp_diff(a.m, b.m);
    a.m = b.m;
  }
}

__host__ __device__ __forceinline__ void kahan_add(float& r, float& comp, float e) {
#ifdef XENT_KAHAN
  const float yk = e - comp;
  const float t = r + yk;
  comp = (t - r) - yk;
  r = t;
#else
  (void)comp;
  r += e;
#endif
}

// Per-thread accumulation of n values; `comp` is the Kahan compensation (only with XENT_KAHAN).
// ZS: also sum z (only label smoothing needs it; one add per element saved otherwise).
template <bool FAST, bool ZS>
__host__ __device__ __forceinline__ void ms_add(MS& a, float& comp, const float* x, int n) {
  float lm = x[0];
  for (int k = 1; k < n; ++k) lm = fmaxf(lm, x[k]);
  if (lm > a.m) {  // rare after the first vectors: new max, the old excluded element becomes a term
    const float f = exp_diff(a.m, lm);  // 0 when a.m = -inf (then r = 0 too)
    a.r = (a.r + 1.f) * f;
    comp *= f;
    a.m = lm;
    bool skip = true;
    for (int k = 0; k < n; ++k) {
      if (ZS) a.z += x[k];
      if (skip && x[k] == lm) {  // the new max itself is the excluded element
        skip = false;
        continue;
      }
      kahan_add(a.r, comp, x[k] == -INFINITY ? 0.f : ex<FAST>(x[k] - a.m));
    }
  } else if (a.m == -INFINITY) {  // only -inf (adds 0) or NaN (propagates) can be here
    for (int k = 0; k < n; ++k) {
      if (ZS) a.z += x[k];
      a.r += x[k] == -INFINITY ? 0.f : x[k];
    }
  } else {  // the common case: a finite max, exp(-inf - m) = 0 exactly
    for (int k = 0; k < n; ++k) {
      if (ZS) a.z += x[k];
      kahan_add(a.r, comp, ex<FAST>(x[k] - a.m));
    }
  }
}

// Reduce over the first `width` lanes of a warp (width may be < 32 in a partial last warp, which
// happens when blockDim is not a multiple of 32). Lane 0 gets the result.
__device__ __forceinline__ MS warp_reduce(MS v, int lane, int width) {
  const unsigned mask = width >= 32 ? 0xffffffffu : ((1u << width) - 1u);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    MS o;
    o.m = __shfl_down_sync(mask, v.m, off);
    o.r = __shfl_down_sync(mask, v.r, off);
    o.z = __shfl_down_sync(mask, v.z, off);
    if (lane + off < width) ms_merge(v, o);
  }
  return v;
}

// Block reduction for any blockDim <= 1024; every thread returns the block's result.
__device__ MS block_reduce(MS v, MS* wbuf, MS* out) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5;
  const int nw = (nt + 31) >> 5;
  v = warp_reduce(v, lane, min(32, nt - warp * 32));
  if (lane == 0) wbuf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    MS r = lane < nw ? wbuf[lane] : ms_identity();
    r = warp_reduce(r, lane, min(32, nt));
    if (lane == 0) *out = r;
  }
  __syncthreads();
  return *out;
}

// ---- per-element gradient ------------------------------------------------------------------------

struct Coef {
  float m, logs;  // p = exp((z - m) - logs)
  float a;        // 1 + 2 lam LSE
  float b;        // eps / V
  float t;        // 1 - eps
  float c;        // mu g / D
  float gy;       // the target's gradient (grad_target), computed once per row
  bool zero;      // ignored row (or D == 0): write exact zeros, read nothing
};

template <bool FAST>
__host__ __device__ __forceinline__ float grad_elem(float x, const Coef& k) {
  return k.c * (k.a * ex<FAST>((x - k.m) - k.logs) - k.b);  // z - m is exact for close values
}

// a p - (1-eps) - eps/V = a (p - 1) + (a - (1-eps)) - eps/V, with p - 1 = expm1(log p) in float32:
// no cancellation even where p rounds to 1 (confident rows), and one rounding to T by the caller.
__host__ __device__ __forceinline__ float grad_target(float xy, const Coef& k) {
  return k.c * (k.a * expm1f((xy - k.m) - k.logs) + ((k.a - k.t) - k.b));
}

__host__ __device__ __forceinline__ Coef make_coef(float m, float logs, bool valid, bool in_range, float gD,
                                                   float eps, float lam, int64_t V, float xy) {
  Coef k;
  k.m = m;
  k.logs = logs;
  k.a = lam != 0.f ? 1.f + 2.f * lam * (m + logs) : 1.f;
  k.b = eps != 0.f ? eps / (float)V : 0.f;
  k.t = 1.f - eps;
  // an out-of-range target (neither valid nor ignore_index) poisons its row with NaN
  k.c = in_range ? gD : NAN;
  k.zero = (!valid || gD == 0.f) && in_range;
  k.gy = grad_target(xy, k);
  return k;
}

// A row's loss l_i * mu_i from its (max, sum, z-sum), log sum and target logit: 0 for an ignored row, NaN
// for an out-of-range target.
__host__ __device__ __forceinline__ float loss_of_row(const MS& tot, float logs, float xy, bool valid, bool in_range,
                                                      float eps, float lam, int64_t V) {
  const float m = tot.m;
  if (valid && !in_range) return NAN;
  if (!valid) return 0.f;
  float l = (1.f - eps) * ((m - xy) + logs);
  if (eps != 0.f) l += eps * ((m - tot.z / (float)V) + logs);
  if (lam != 0.f) { const float lse = m + logs; l += lam * lse * lse; }
  return l;
}

// ---- the per-thread passes (threads tid, tid + nt, ... of a block) --------------------------------

// Pass 1: accumulate this thread's elements of the block's share.

#if defined(__CUDA_ARCH__) && !defined(XENT_KAHAN)
#define XENT_WARP_MAX 1
// Pass 1 over the body vectors with a warp-uniform running max. With a per-thread max, a thread
// that meets a new maximum takes the rescaling branch alone: in the first half of a row nearly every
// iteration has some lane doing so, and the warp runs both paths (measured on an H200: 23.6 of 32
// lanes active, the kernel compute-bound). Here the lanes agree on the max of the iteration first
// (5 shuffles per kUnroll * VEC elements), so the rescaling branch is uniform and rare (~ln of the
// iteration count). Exactly one lane (`own`) leaves out one element at the max, so the warp's sum of
// r keeps the MS convention. Needs whole warps (blockDim % 32 == 0) with all lanes converged; the
// caller checks. Returns the warp's MS in every lane.
template <typename T, bool ZS, bool KEEP>
__device__ MS pass1_body_warp(const T* __restrict__ x, const Span& sp, int tid, int nt) {
  constexpr bool FAST = Ty<T>::FAST;
  constexpr int W = Ty<T>::VEC;
  const unsigned full = 0xffffffffu;
  const int lane = tid & 31;
  float m = -INFINITY, r = 0.f, z = 0.f;
  bool own = false;
  for (int64_t i0 = sp.v0 + tid; __any_sync(full, i0 < sp.v1); i0 += (int64_t)kUnroll * nt) {
    uint4 u[kUnroll];
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      const int64_t i = i0 + (int64_t)q * nt;
      if (i < sp.v1) u[q] = load_pass1<KEEP>(reinterpret_cast<const uint4*>(x + sp.base + i * W));
    }
    float lm = -INFINITY;
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      if (i0 + (int64_t)q * nt < sp.v1) {
        float v[W];
        Ty<T>::unpack(u[q], v);
#pragma unroll
        for (int e = 0; e < W; ++e) lm = fmaxf(lm, v[e]);
      }
    }
    float wm = lm;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) wm = fmaxf(wm, __shfl_xor_sync(full, wm, off));
    bool excl = false;  // this lane leaves out one element equal to m in this iteration
    if (wm > m) {  // uniform: a new max for the warp
      const float f = exp_diff(m, wm);  // 0 when m = -inf (then r = 0 too)
      r = r * f + (own ? f : 0.f);   // the old excluded element becomes an ordinary term
      m = wm;
      const unsigned has = __ballot_sync(full, lm == wm);
      own = lane == __ffs(has) - 1;
      excl = own;
    }
#pragma unroll
    for (int q = 0; q < kUnroll; ++q) {
      if (i0 + (int64_t)q * nt < sp.v1) {
        float v[W];
        Ty<T>::unpack(u[q], v);
        if (m == -INFINITY) {  // uniform: only -inf (adds 0) or NaN (propagates) seen so far
#pragma unroll
          for (int e = 0; e < W; ++e) {
            if (ZS) z += v[e];
            r += v[e] == -INFINITY ? 0.f : v[e];
          }
        } else {
#pragma unroll
          for (int e = 0; e < W; ++e) {
            if (ZS) z += v[e];
            float t = ex<FAST>(v[e] - m);
            if (excl && v[e] == m) {  // predicated; only ever true in a new-max iteration
              excl = false;
              t = 0.f;
            }
            r += t;
          }
        }
      }
    }
  }
  // m is uniform: the warp's terms simply add (a fixed butterfly order: bitwise reproducible)
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    r += __shfl_xor_sync(full, r, off);
    if (ZS) z += __shfl_xor_sync(full, z, off);
  }
  return MS{m, r, z};
}
#endif

template <typename T, bool ZS, bool KEEP>
__host__ __device__ void pass1_thread(const T* __restrict__ x, const Span& sp, int tid, int nt, MS& acc,
                                      float& comp) {
  constexpr bool FAST = Ty<T>::FAST;
  for (int64_t j = tid; j < sp.head_hi; j += nt) {
    const float v = Ty<T>::to_f(x[j]);
    ms_add<FAST, ZS>(acc, comp, &v, 1);
  }
  for (int64_t j = sp.tail_lo + tid; j < sp.tail_hi; j += nt) {
    const float v = Ty<T>::to_f(x[j]);
    ms_add<FAST, ZS>(acc, comp, &v, 1);
  }
#ifdef XENT_WARP_MAX
  if (sp.w > 1 && (nt & 31) == 0) {
    const MS body = pass1_body_warp<T, ZS, KEEP>(x, sp, tid, nt);
    if ((tid & 31) == 0) ms_merge(acc, body);  // one lane carries the warp's body
    return;
  }
#endif
  if (sp.w > 1) {
    constexpr int W = Ty<T>::VEC;
    for (int64_t i0 = sp.v0 + tid; i0 < sp.v1; i0 += (int64_t)kUnroll * nt) {
      uint4 u[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t i = i0 + (int64_t)q * nt;
        if (i < sp.v1) u[q] = load_pass1<KEEP>(reinterpret_cast<const uint4*>(x + sp.base + i * W));
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t i = i0 + (int64_t)q * nt;
        if (i >= sp.v1) break;
        float v[W];
        Ty<T>::unpack(u[q], v);
        ms_add<FAST, ZS>(acc, comp, v, W);
      }
    }
  } else {
    for (int64_t i = sp.v0 + tid; i < sp.v1; i += nt) {
      const float v = Ty<T>::to_f(x[sp.base + i]);
      ms_add<FAST, ZS>(acc, comp, &v, 1);
    }
  }
#ifdef XENT_KAHAN
  acc.r -= comp;
#endif
}

// Pass 2: write dlogits for this thread's elements.
template <typename T>
__host__ __device__ void pass2_thread(const T* __restrict__ x, T* __restrict__ d, const Span& sp, int tid,
                                      int nt, int64_t y, const Coef& k) {
  constexpr bool FAST = Ty<T>::FAST;
  const T zero = Ty<T>::from_f(0.f);
  for (int64_t j = tid; j < sp.head_hi; j += nt)
    d[j] = k.zero ? zero : Ty<T>::from_f(j == y ? k.gy : grad_elem<FAST>(Ty<T>::to_f(x[j]), k));
  for (int64_t j = sp.tail_lo + tid; j < sp.tail_hi; j += nt)
    d[j] = k.zero ? zero : Ty<T>::from_f(j == y ? k.gy : grad_elem<FAST>(Ty<T>::to_f(x[j]), k));
  if (sp.w > 1) {
    constexpr int W = Ty<T>::VEC;
    const int64_t step = (int64_t)kUnroll * nt;
    const int64_t iters = sp.v1 > sp.v0 ? (sp.v1 - sp.v0 + step - 1) / step : 0;
    for (int64_t it = 0; it < iters; ++it) {
      // last vectors first: pass 1 read them last, so they are the likeliest to be in L2 still
      const int64_t i0 = sp.v0 + tid + (iters - 1 - it) * step;
      uint4 u[kUnroll];
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t i = i0 + (int64_t)q * nt;
        if (i < sp.v1 && !k.zero) u[q] = load_pass2(reinterpret_cast<const uint4*>(x + sp.base + i * W));
      }
#pragma unroll
      for (int q = 0; q < kUnroll; ++q) {
        const int64_t i = i0 + (int64_t)q * nt;
        if (i >= sp.v1) break;
        const int64_t j0 = sp.base + i * W;
        float v[W], o[W];
        if (k.zero) {
#pragma unroll
          for (int e = 0; e < W; ++e) o[e] = 0.f;
        } else {
          Ty<T>::unpack(u[q], v);
          const int64_t rel = y - j0;  // the target's slot in this vector, if any
#pragma unroll
          for (int e = 0; e < W; ++e) o[e] = rel == e ? k.gy : grad_elem<FAST>(v[e], k);
        }
        store_stream(reinterpret_cast<uint4*>(d + j0), Ty<T>::pack(o));
      }
    }
  } else {
    for (int64_t i = sp.v0 + tid; i < sp.v1; i += nt) {
      const int64_t j = sp.base + i;
      d[j] = k.zero ? zero : Ty<T>::from_f(j == y ? k.gy : grad_elem<FAST>(Ty<T>::to_f(x[j]), k));
    }
  }
}

// ---- kernels -------------------------------------------------------------------------------------

// Forward over rows: (max, log sum) per row, per-row loss, and, when dlog != NULL, dlogits for g = 1.
// Grid: one block per row. KEEP: pass 1 asks L2 to keep the row for pass 2 (dlog != NULL).
template <typename T, bool ZS, bool KEEP>
__global__ void __launch_bounds__(kMaxThreads)
xent_rows_kernel(const T* __restrict__ logits, int64_t V, int64_t ls, const int64_t* __restrict__ targets,
                 int64_t ts, int64_t ignore_index, float eps, float lam, const float* __restrict__ denom,
                 T* __restrict__ dlog, int64_t ds, int vec, float2* __restrict__ stats,
                 float* __restrict__ row_loss) {
  __shared__ MS wbuf[32];
  __shared__ MS red;
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t row = blockIdx.x;
  const T* x = row_in(logits, row, ls);
  const int64_t y = targets[row * ts];
  const bool valid = y != ignore_index;
  const bool in_range = !valid || (y >= 0 && y < V);
  const Span sp = make_span(reinterpret_cast<uintptr_t>(x), (int)sizeof(T), V, vec ? Ty<T>::VEC : 1, 1, 0);

  MS acc = ms_identity();
  float comp = 0.f;
  if (valid) pass1_thread<T, ZS, KEEP>(x, sp, tid, nt, acc, comp);  // ignored rows are never read
  // the target's logit, read before the reduction's barrier: in place, pass 2 may overwrite it after
  const float xy = valid && in_range ? Ty<T>::to_f(x[y]) : 0.f;
  const MS tot = block_reduce(acc, wbuf, &red);
  const float m = tot.m, logs = log1pf(tot.r);
  if (tid == 0) {
    stats[row] = make_float2(m, logs);
    row_loss[row] = loss_of_row(tot, logs, xy, valid, in_range, eps, lam, V);
  }
  if (dlog) {
    const float D = *denom;
    const Coef k = make_coef(m, logs, valid, in_range, D == 0.f ? 0.f : 1.f / D, eps, lam, V, xy);
    pass2_thread<T>(x, row_out(dlog, row, ds), sp, tid, nt, y, k);
  }
}

// ---- one read: a cluster of blocks holds the row in shared memory --------------------------------
// With a gradient to write, the row kernel above reads each row twice, and at V = 128256 bf16 most of
// the re-read misses L2 (blocks in flight hold ~100 MB of rows, L2 has 50). Here a cluster of C
// blocks splits the row (make_span with C parts), each block copies its share to shared memory once
// (cp.async: no register staging, every vector in flight at once), reduces it, and the C partial
// (max, sum)s meet through distributed shared memory; pass 2 then reads shared memory. DRAM moves
// the floor's bytes: one read and one write of the row. Each thread reads back only the vectors it
// copied itself, so only the reductions synchronise the block.
//
// In place (dlog == logits): every element is read before the cluster barrier and written after it,
// by the thread that read it, so no block overwrites what another has yet to read.
//
// Measured on an H100 (N = 8192, V = 128256 bf16, loss.backward(), .ci/xent-cluster-ab; the floor, a
// copy of the logits, 1.39 ms; the row kernel 1.89-1.92 ms in the same runs): this kernel (C = 4,
// 256 threads, 64 KB of shared memory a block, 3 blocks per SM) 1.86 ms. Slower: C = 5/6/8 (52/44/32
// KB a block) 1.92/1.89/2.07 ms; C = 2 with 512 threads (128 KB) 2.52-2.77; 512 threads at 64 KB 2.39;
// persistent clusters with two shares of shared memory, copying the next row while writing this one,
// 3.05 (512 threads, 1 block per SM) to 4.65 ms; 16-bit pass 2 in two FMAs, packed max and a per-vector
// target test: no gain (1.862 against 1.859), not kept. ncu (N = 2048): this kernel reaches 60% of DRAM
// bandwidth at 66% SM throughput (0.71 issued warps per scheduler), the row kernel 83% at 60%: the
// blocks here alternate copy, reduce, cluster barrier and write, and 24 warps per SM do not hide it.
// What would reach the floor: a warp-specialized pipeline (a producer warp feeding a ring of row
// shares by TMA while consumer warps reduce and write), not tried yet.

constexpr int kClusterMax = 8;  // the portable cluster size
constexpr int kClusterThreads = 256;
constexpr int64_t kClusterMinRowBytes = 64 * 1024;  // shorter rows stay in L2 between the two reads

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

// This thread's (max, sum) over its held vectors (tid, tid + nt, ... below nv): the max first (no
// rescaling branch), then the sum leaving out one element at the max (the MS convention). A thread
// holding only -inf (or nothing) keeps m = -inf and adds the values themselves, so that a NaN
// propagates, as ms_add does. (Reducing the first vectors while the last were still arriving, in
// groups of 2 or 4 per thread, measured slower on an H100: 2.20 and 2.02 ms against 1.89.)
template <typename T, bool ZS>
__device__ MS held_ms(const uint4* held, int64_t nv, int tid, int nt) {
  constexpr bool FAST = Ty<T>::FAST;
  constexpr int W = Ty<T>::VEC;
  float m = -INFINITY;
  for (int64_t i = tid; i < nv; i += nt) {
    float v[W];
    Ty<T>::unpack(held[i], v);
#pragma unroll
    for (int e = 0; e < W; ++e) m = fmaxf(m, v[e]);
  }
  float r = 0.f, z = 0.f;
  bool excl = m != -INFINITY;
  for (int64_t i = tid; i < nv; i += nt) {
    float v[W];
    Ty<T>::unpack(held[i], v);
#pragma unroll
    for (int e = 0; e < W; ++e) {
      if (ZS) z += v[e];
      float t;
      if (m == -INFINITY) {
        t = v[e] == -INFINITY ? 0.f : v[e];
      } else {
        t = ex<FAST>(v[e] - m);
        if (excl && v[e] == m) {
          excl = false;
          t = 0.f;
        }
      }
      r += t;
    }
  }
  return MS{m, r, z};
}

// The cluster's (max, sum) of a row: warp 0's lane q reads block q's share through distributed shared
// memory, lane 0 merges them in rank order (every block gets the same bits), and the block reads it.
__device__ MS cluster_total(const MS* mine, MS* out, int C) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    MS v = lane < C ? *cluster.map_shared_rank(mine, lane) : ms_identity();
    MS tot = ms_identity();
    for (int q = 0; q < C; ++q) {
      MS o;
      o.m = __shfl_sync(0xffffffffu, v.m, q);
      o.r = __shfl_sync(0xffffffffu, v.r, q);
      o.z = __shfl_sync(0xffffffffu, v.z, q);
      ms_merge(tot, o);
    }
    if (lane == 0) *out = tot;
  }
  __syncthreads();
  return *out;
}

// Grid: N clusters of C blocks, cluster `row` on row `row`; block `rank` of it takes make_span's part
// `rank` of the row.
template <typename T, bool ZS>
__global__ void __launch_bounds__(kClusterThreads)
xent_rows_cluster_kernel(const T* __restrict__ logits, int64_t V, int64_t ls, const int64_t* __restrict__ targets,
                         int64_t ts, int64_t ignore_index, float eps, float lam, const float* __restrict__ denom,
                         T* dlog, int64_t ds, float2* __restrict__ stats, float* __restrict__ row_loss) {
  extern __shared__ uint4 held[];
  __shared__ MS wbuf[32];
  __shared__ MS red;
  __shared__ MS mine;  // this block's (max, sum), read by the cluster's other blocks
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int C = (int)cluster.num_blocks();
  const int rank = (int)cluster.block_rank();
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t row = blockIdx.x / C;
  const T* x = row_in(logits, row, ls);
  const int64_t y = targets[row * ts];
  const bool valid = y != ignore_index;
  const bool in_range = !valid || (y >= 0 && y < V);
  const Span sp = make_span(reinterpret_cast<uintptr_t>(x), (int)sizeof(T), V, Ty<T>::VEC, C, rank);
  const int64_t nv = sp.v1 - sp.v0;

  if (valid) {  // ignored rows are never read
    const uint4* src = reinterpret_cast<const uint4*>(x + sp.base) + sp.v0;
    for (int64_t i = tid; i < nv; i += nt) cp_async16(held + i, src + i);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  // the target's logit, read before any block of the cluster may write the row (in place)
  const float xy = valid && in_range ? Ty<T>::to_f(x[y]) : 0.f;
  MS acc = ms_identity();
  float comp = 0.f;
  if (valid) {
    // the scalar head and tail: pass1_thread's loops with an empty body span
    Span ends = sp;
    ends.v1 = ends.v0;
    pass1_thread<T, ZS, false>(x, ends, tid, nt, acc, comp);
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    ms_merge(acc, held_ms<T, ZS>(held, nv, tid, nt));
  }
  const MS part = block_reduce(acc, wbuf, &red);
  if (tid == 0) mine = part;
  cluster.sync();  // every block's `mine` is written, and every block has read its share of the row
  const MS tot = cluster_total(&mine, &red, C);
  // a block's shared memory must outlive its peers' reads of it: arrive now, wait before exiting
  asm volatile("barrier.cluster.arrive.aligned;" ::: "memory");
  const float m = tot.m, logs = log1pf(tot.r);
  if (rank == 0 && tid == 0) {
    stats[row] = make_float2(m, logs);
    row_loss[row] = loss_of_row(tot, logs, xy, valid, in_range, eps, lam, V);
  }
  const float D = *denom;
  const Coef k = make_coef(m, logs, valid, in_range, D == 0.f ? 0.f : 1.f / D, eps, lam, V, xy);
  constexpr bool FAST = Ty<T>::FAST;
  constexpr int W = Ty<T>::VEC;
  T* d = row_out(dlog, row, ds);  // not __restrict__: in place, dlog is logits
  const T zero = Ty<T>::from_f(0.f);
  for (int64_t j = tid; j < sp.head_hi; j += nt)
    d[j] = k.zero ? zero : Ty<T>::from_f(j == y ? k.gy : grad_elem<FAST>(Ty<T>::to_f(x[j]), k));
  for (int64_t j = sp.tail_lo + tid; j < sp.tail_hi; j += nt)
    d[j] = k.zero ? zero : Ty<T>::from_f(j == y ? k.gy : grad_elem<FAST>(Ty<T>::to_f(x[j]), k));
  uint4* dst = reinterpret_cast<uint4*>(d + sp.base) + sp.v0;
  for (int64_t i = tid; i < nv; i += nt) {
    const int64_t j0 = sp.base + (sp.v0 + i) * W;
    float o[W];
    if (k.zero) {
#pragma unroll
      for (int e = 0; e < W; ++e) o[e] = 0.f;
    } else {
      float v[W];
      Ty<T>::unpack(held[i], v);
      const int64_t rel = y - j0;
#pragma unroll
      for (int e = 0; e < W; ++e) o[e] = rel == e ? k.gy : grad_elem<FAST>(v[e], k);
    }
    store_stream(dst + i, Ty<T>::pack(o));
  }
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

// In place, backward: dlogits (the forward's gradient for g = 1) scaled by g[row * gs] where that is
// not 1 (x * 1 == x exactly, so those rows are left alone). Grid: N * parts blocks over row pieces.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
xent_scale_kernel(T* d, int64_t V, int64_t ds, const float* __restrict__ g, int64_t gs, int vec, int parts) {
  const int64_t row = blockIdx.x / parts;
  const int part = (int)(blockIdx.x % parts);
  const float s = g[row * gs];
  if (s == 1.0f) return;
  T* r = row_out(d, row, ds);
  const Span sp = make_span(reinterpret_cast<uintptr_t>(r), (int)sizeof(T), V, vec ? Ty<T>::VEC : 1, parts, part);
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t j = tid; j < sp.head_hi; j += nt) r[j] = Ty<T>::from_f(Ty<T>::to_f(r[j]) * s);
  for (int64_t j = sp.tail_lo + tid; j < sp.tail_hi; j += nt) r[j] = Ty<T>::from_f(Ty<T>::to_f(r[j]) * s);
  constexpr int W = Ty<T>::VEC;
  if (sp.w > 1) {
    uint4* v = reinterpret_cast<uint4*>(r + sp.base);
    for (int64_t i = sp.v0 + tid; i < sp.v1; i += nt) {
      float o[W];
      Ty<T>::unpack(v[i], o);
#pragma unroll
      for (int e = 0; e < W; ++e) o[e] *= s;
      store_stream(v + i, Ty<T>::pack(o));
    }
  } else {
    for (int64_t i = sp.v0 + tid; i < sp.v1; i += nt) r[sp.base + i] = Ty<T>::from_f(Ty<T>::to_f(r[sp.base + i]) * s);
  }
}

// Backward: dlogits from the saved (max, log sum), for upstream gradient g[row * gs] (gs = 0: scalar).
// Grid: N * parts blocks, a row's body vectors split evenly over its `parts` blocks.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
xent_grad_kernel(const T* __restrict__ logits, int64_t V, int64_t ls, const int64_t* __restrict__ targets,
                 int64_t ts, int64_t ignore_index, float eps, float lam, const float2* __restrict__ stats,
                 const float* __restrict__ denom, const float* __restrict__ g, int64_t gs, int skip_if_one,
                 T* __restrict__ dlog, int64_t ds, int vec, int parts) {
  if (skip_if_one && g[0] == 1.0f) return;  // the forward already wrote dlogits for g = 1
  const int64_t row = blockIdx.x / parts;
  const int part = (int)(blockIdx.x % parts);
  const T* x = row_in(logits, row, ls);
  const int64_t y = targets[row * ts];
  const bool valid = y != ignore_index;
  const bool in_range = !valid || (y >= 0 && y < V);
  const Span sp = make_span(reinterpret_cast<uintptr_t>(x), (int)sizeof(T), V, vec ? Ty<T>::VEC : 1,
                            parts, part);
  const float D = *denom;
  const float2 st = stats[row];
  const float xy = valid && in_range ? Ty<T>::to_f(x[y]) : 0.f;
  const Coef k = make_coef(st.x, st.y, valid, in_range, D == 0.f || !valid ? 0.f : g[row * gs] / D, eps,
                           lam, V, xy);
  pass2_thread<T>(x, row_out(dlog, row, ds), sp, threadIdx.x, blockDim.x, y, k);
}

// D: the valid-token count (mean without normalizer) or a given value (normalizer, or 1).
__global__ void xent_denom_kernel(const int64_t* __restrict__ targets, int64_t N, int64_t ts,
                                  int64_t ignore_index, int count, float value, float* __restrict__ denom) {
  __shared__ unsigned long long total;
  if (threadIdx.x == 0) total = 0ull;
  __syncthreads();
  if (count) {
    unsigned long long c = 0;
    for (int64_t i = threadIdx.x; i < N; i += blockDim.x) c += targets[i * ts] != ignore_index;
    atomicAdd(&total, c);  // integer: exact in any order
  }
  __syncthreads();
  if (threadIdx.x == 0) *denom = count ? (float)total : value;
}

// Loss: sum of the per-row losses in a fixed order (thread-strided, then a fixed tree), over D.
__global__ void xent_finalize_kernel(const float* __restrict__ row_loss, int64_t N,
                                     const float* __restrict__ denom, int mean, float* __restrict__ out) {
  __shared__ float buf[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float s = 0.f;
  for (int64_t i = tid; i < N; i += blockDim.x) s += row_loss[i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
  if (lane == 0) buf[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < (int)(blockDim.x >> 5) ? buf[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) {
      const float D = *denom;
      *out = mean ? (D == 0.f ? NAN : s / D) : s;
    }
  }
}

// ---- host side -----------------------------------------------------------------------------------

// Defaults measured on an H200 (N = 8192, V = 128256, bf16, loss.backward()): one block of 256 threads
// per row re-reading the row for pass 2 took 2.26 ms; clusters of 2/4/8 blocks 2.37/2.71/3.13 ms,
// and parking the row in shared memory (cluster of 4) 3.10 ms: the cluster barrier and the lower
// occupancy cost more than the re-read saves. 512 threads: 2.31 ms, 1024: 2.56 ms. Then ex2.approx
// and no z-sum without label smoothing: 1.76 ms; the warp-uniform max of pass 1: 1.68 ms (torch
// F.cross_entropy 4.63 ms in the same runs). Measured again with that kernel (1.676 ms; torch 4.634):
// persistent grids of 1/2/4 blocks of 256 threads per SM 2.91/2.04/1.73 ms (512 threads, 2 per SM:
// 1.70; 1024, 1 per SM: 1.75), clusters of 2/4 blocks parking the row in shared memory 2.06-3.43 ms.
// Those variants were then removed from this file.
int g_block = 0;  // threads per block; 0: row_threads picks (a knob for tests: xent_tune)

// 512 threads for rows of 128 KB or more (bf16 V = 128256: 1.480 ms vs 1.585 with 256 on an H200,
// both with 8 vectors in flight), 256 below (V = 32000: 0.413 vs 0.463 ms).
int row_threads(int64_t V, int es) {
  if (g_block > 0) return g_block;
  return V * es >= 128 * 1024 ? 512 : 256;
}

bool vec_ok(const void* l, int64_t ls, const void* d, int64_t ds, int es, int64_t N) {
  // the vector path needs the logits row and the dlogits row equally aligned, on every row
  if (!d) return true;
  if (((uintptr_t)l & 15u) != ((uintptr_t)d & 15u)) return false;
  return N <= 1 || ((ls - ds) * es) % 16 == 0;
}

// The one-read cluster kernel (xent_tune_cluster): on or off, and the most shared memory per block,
// which sets the cluster size (64 KB: 3 blocks of 256 threads per SM).
int g_cluster = 1;
int g_cluster_bytes = 64 * 1024;

// The most body vectors one of C blocks holds (the head may shift the vector grid by up to one vector).
template <typename T>
int64_t held_vectors(int64_t V, int C) {
  return (V / Ty<T>::VEC + 1 + C - 1) / C;
}

// Blocks per row for the one-read cluster kernel, or 0 where it does not apply: no gradient to write,
// rows whose vectors are not aligned alike in logits and dlogits, rows short enough for L2 to keep them
// between two reads, or rows longer than kClusterMax blocks' shared memory.
template <typename T>
int cluster_size(int64_t V, int vec, bool has_dlog) {
#ifdef XENT_KAHAN
  return 0;
#endif
  if (!g_cluster || !has_dlog || !vec || V * (int64_t)sizeof(T) < kClusterMinRowBytes) return 0;
  for (int c = 2; c <= kClusterMax; ++c)
    if (held_vectors<T>(V, c) * (int64_t)sizeof(uint4) <= g_cluster_bytes) return c;
  return 0;
}

template <typename T>
cudaError_t launch_rows_cluster(int C, const void* logits, int64_t N, int64_t V, int64_t ls, const int64_t* targets,
                                int64_t ts, int64_t ignore_index, float eps, float lam, const float* denom,
                                void* dlog, int64_t ds, float* stats, float* row_loss, cudaStream_t st) {
  if (N * C > 0x7fffffffLL) return cudaErrorInvalidValue;
  const size_t smem = (size_t)held_vectors<T>(V, C) * sizeof(uint4);
  auto kern = eps != 0.f ? xent_rows_cluster_kernel<T, true> : xent_rows_cluster_kernel<T, false>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(N * C));
  cfg.blockDim = dim3(kClusterThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = (unsigned)C;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  e = cudaLaunchKernelEx(&cfg, kern, static_cast<const T*>(logits), V, ls, targets, ts, ignore_index, eps, lam,
                         denom, static_cast<T*>(dlog), ds, reinterpret_cast<float2*>(stats), row_loss);
  return e != cudaSuccess ? e : cudaGetLastError();
}

template <typename T>
cudaError_t launch_rows(const void* logits, int64_t N, int64_t V, int64_t ls, const int64_t* targets,
                        int64_t ts, int64_t ignore_index, float eps, float lam, const float* denom,
                        void* dlog, int64_t ds, float* stats, float* row_loss, cudaStream_t st) {
  const int vec = vec_ok(logits, ls, dlog, ds, (int)sizeof(T), N) ? 1 : 0;
  if (N > 0x7fffffffLL) return cudaErrorInvalidValue;
  const int C = cluster_size<T>(V, vec, dlog != nullptr);
  if (C > 0)
    return launch_rows_cluster<T>(C, logits, N, V, ls, targets, ts, ignore_index, eps, lam, denom, dlog, ds, stats,
                                  row_loss, st);
  auto kern = eps != 0.f ? (dlog ? xent_rows_kernel<T, true, true> : xent_rows_kernel<T, true, false>)
                         : (dlog ? xent_rows_kernel<T, false, true> : xent_rows_kernel<T, false, false>);
  kern<<<(unsigned)N, row_threads(V, (int)sizeof(T)), 0, st>>>(
      static_cast<const T*>(logits), V, ls, targets, ts, ignore_index, eps, lam, denom, static_cast<T*>(dlog), ds,
      vec, reinterpret_cast<float2*>(stats), row_loss);
  return cudaGetLastError();
}

// Blocks per row for the kernels that split rows (gradient, in-place scaling): about kUnroll vectors of
// w elements per thread, 1 to 64 blocks.
int64_t row_parts(int64_t V, int threads, int w) {
  const int64_t per_block = (int64_t)threads * kUnroll * w;
  const int64_t parts = (V + per_block - 1) / per_block;
  return parts < 1 ? 1 : (parts > 64 ? 64 : parts);
}

// The launch of a row-splitting kernel (xent_grad_kernel, xent_scale_kernel): vector access where both rows
// allow it, row_threads() threads, row_parts() blocks per row; ok is false where N * parts overflows the grid.
struct RowSplit {
  int vec;
  int threads;
  int64_t parts;
  bool ok;
};

template <typename T>
RowSplit row_split(const void* src, int64_t ss, const void* dst, int64_t ds, int64_t N, int64_t V) {
  const int es = (int)sizeof(T);
  const int vec = vec_ok(src, ss, dst, ds, es, N) ? 1 : 0;
  const int threads = row_threads(V, es);
  const int64_t parts = row_parts(V, threads, vec ? vec_of<T>() : 1);
  return {vec, threads, parts, N * parts <= 0x7fffffffLL};
}

template <typename T>
cudaError_t launch_grad(const void* logits, int64_t N, int64_t V, int64_t ls, const int64_t* targets,
                        int64_t ts, int64_t ignore_index, float eps, float lam, const float* stats,
                        const float* denom, const float* g, int64_t gs, int skip_if_one, void* dlog,
                        int64_t ds, cudaStream_t st) {
  const RowSplit r = row_split<T>(logits, ls, dlog, ds, N, V);
  if (!r.ok) return cudaErrorInvalidValue;
  xent_grad_kernel<T><<<(unsigned)(N * r.parts), r.threads, 0, st>>>(
      static_cast<const T*>(logits), V, ls, targets, ts, ignore_index, eps, lam,
      reinterpret_cast<const float2*>(stats), denom, g, gs, skip_if_one, static_cast<T*>(dlog), ds, r.vec,
      (int)r.parts);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_scale(void* dlog, int64_t N, int64_t V, int64_t ds, const float* g, int64_t gs, cudaStream_t st) {
  const RowSplit r = row_split<T>(dlog, ds, dlog, ds, N, V);
  if (!r.ok) return cudaErrorInvalidValue;
  xent_scale_kernel<T><<<(unsigned)(N * r.parts), r.threads, 0, st>>>(static_cast<T*>(dlog), V, ds, g, gs, r.vec,
                                                                       (int)r.parts);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

// Forward. dlog may be NULL (no gradient wanted now). stats: float [N, 2] (max, log sum);
// row_loss: float [N] (l_i * mu_i); denom: float [1]; loss_out: float [1] (unused for "none").
int xent_forward(const void* logits, int dtype, int64_t N, int64_t V, int64_t ls, const int64_t* targets,
                 int64_t ts, int64_t ignore_index, int reduction, int has_normalizer, double normalizer,
                 float eps, float lam, void* dlog, int64_t ds, float* stats, float* row_loss, float* denom,
                 float* loss_out, void* stream) {
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const int count = reduction == RED_MEAN && !has_normalizer;
  const float value = reduction == RED_MEAN && has_normalizer ? (float)normalizer : 1.f;
  xent_denom_kernel<<<1, kMaxThreads, 0, st>>>(targets, N, ts, ignore_index, count, value, denom);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return (int)e;
  if (N > 0) {
    switch (dtype) {
      case DT_F32: e = launch_rows<float>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, denom, dlog, ds, stats, row_loss, st); break;
      case DT_BF16: e = launch_rows<__nv_bfloat16>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, denom, dlog, ds, stats, row_loss, st); break;
      case DT_F16: e = launch_rows<__half>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, denom, dlog, ds, stats, row_loss, st); break;
      default: return (int)cudaErrorInvalidValue;
    }
    if (e != cudaSuccess) return (int)e;
  }
  if (reduction != RED_NONE) {
    xent_finalize_kernel<<<1, kMaxThreads, 0, st>>>(row_loss, N, denom, reduction == RED_MEAN, loss_out);
    e = cudaGetLastError();
  }
  return (int)e;
}

// Backward: dlogits [N, V] (row stride ds) for upstream gradient g (gs = 0: one scalar).
// skip_if_one: return at once when g[0] == 1 (dlog already holds the forward's g = 1 gradient).
int xent_backward(const void* logits, int dtype, int64_t N, int64_t V, int64_t ls, const int64_t* targets,
                  int64_t ts, int64_t ignore_index, float eps, float lam, const float* stats,
                  const float* denom, const float* g, int64_t gs, int skip_if_one, void* dlog, int64_t ds,
                  void* stream) {
  if (N <= 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  cudaError_t e;
  switch (dtype) {
    case DT_F32: e = launch_grad<float>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, stats, denom, g, gs, skip_if_one, dlog, ds, st); break;
    case DT_BF16: e = launch_grad<__nv_bfloat16>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, stats, denom, g, gs, skip_if_one, dlog, ds, st); break;
    case DT_F16: e = launch_grad<__half>(logits, N, V, ls, targets, ts, ignore_index, eps, lam, stats, denom, g, gs, skip_if_one, dlog, ds, st); break;
    default: return (int)cudaErrorInvalidValue;
  }
  return (int)e;
}

// In place: dlogits [N, V] (row stride ds), the forward's gradient for g = 1, scaled by g[row * gs]
// (gs = 0: one scalar) where that is not 1.
int xent_scale(void* dlog, int dtype, int64_t N, int64_t V, int64_t ds, const float* g, int64_t gs, void* stream) {
  if (N <= 0) return 0;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DT_F32: return (int)launch_scale<float>(dlog, N, V, ds, g, gs, st);
    case DT_BF16: return (int)launch_scale<__nv_bfloat16>(dlog, N, V, ds, g, gs, st);
    case DT_F16: return (int)launch_scale<__half>(dlog, N, V, ds, g, gs, st);
    default: return (int)cudaErrorInvalidValue;
  }
}

// The one-read cluster kernel (a knob for A/B measurements): on (1: where it applies, 0: never; < 0
// keeps it) and the most shared memory per block (<= 0 keeps it). Returns the on/off setting before.
int xent_tune_cluster(int on, int bytes) {
  const int old = g_cluster;
  if (on >= 0) g_cluster = on;
  if (bytes > 0) g_cluster_bytes = bytes;
  return old;
}

const char* xent_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

// Threads per block of the row kernels (a knob for tests and measurements): > 0 forces it, 0 goes back
// to row_threads' choice, < 0 keeps the setting. Returns the setting before the call.
int xent_tune(int block) {
  const int old = g_block;  // 0: automatic
  if (block >= 0) g_block = block;
  return old;
}

}  // extern "C"
