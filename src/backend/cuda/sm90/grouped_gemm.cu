// Grouped GEMM for Hopper (sm_90a), the graph-safe path of `GroupedLinear`: one persistent launch
// computes every expert's D_e = A_e · op(B_e) over the packed token layout, reading the experts'
// aligned row offsets on the device. Work past the rows the splits fill is never issued (those
// output rows, the grouped matrix's zero tail, are only zeroed, by the producer warpgroup's idle
// warps while the GEMM runs), which cuBLASLt's pointer-array batch cannot do: its batch count is
// fixed on the host, so without the splits there it computes the whole bound.
//
// Compiled at run time by NVRTC (arch sm_90a) with no headers (`backend::sm90_grouped`);
// `benches/sm90_probe/harness.cu` compiles the same file with nvcc for the probe on the GPU.
//
// Operands (row-major, as the crate stores them):
//   A  [P, K]      packed rows; expert e owns rows [group_start[e], group_start[e] + group_rows[e])
//   B  [E, N, K]   "TN": fprop with W, FP8 dgrad with the columnwise Wᵀ (both operands K-major;
//                  FP8 A is E4M3, or E5M2 for the hybrid recipes' gradient; B is E4M3)
//   B  [E, K, N]   "NN": BF16 dgrad with W itself (wgmma reads B MN-major)
//   D  [P, N]      bf16
// D_e = s_a[e] · s_b[e] · A_e · B_e + bias[e], scales and bias optional: TE's per-expert FP8
// scales are applied exactly, in FP32, before the one rounding to bf16.
//
// Structure (one CTA per SM, 384 threads, persistent over 128 x BN output tiles): warpgroup 0 is
// the producer (one thread issues TMA loads of 128-byte-wide K slices into a ring of
// shared-memory stages); warpgroups 1 and 2 consume them with wgmma, keeping one stage's wgmmas in
// flight, and store bf16 with TMA through two staging buffers each (`store_tile`).
// "Cooperative" kernels (BN = 256) split each tile between the two by rows; "pingpong" kernels
// (BN = 128) give each a whole tile in turn, so one stores while the other computes: the host
// takes FP8's where K is short (`sm90_grouped`).
// Shared-memory tiles use the 128-byte swizzle that TMA writes and the wgmma descriptors read.
// Each kernel has a twin in clusters of two CTAs that multicast the B tile (`CLUSTER` below),
// compiled only for the probe, as are the BF16 pingpong kernels.
//
// FP8 numerics: `SPLIT_ACC` adds each stage's (K = 128) partial products into a separate FP32
// accumulator, as TE's split accumulator does on Hopper; without it the products accumulate in
// the tensor core's reduced-precision FP32 ("fast accumulation").

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned, passed by value.
struct __align__(64) TensorMap {
    u64 opaque[16];
};

// The kernels' arguments besides the three tensor maps (one struct, so that the Rust launcher and
// the probe harness pass the same bytes).
struct GroupedGemmArgs {
    u16* d;                  // [capacity_chunks · 128, ldd] bf16 (its zero tail; tiles: D's map)
    const u32* group_start;  // [groups] first aligned row of each expert (multiples of 128)
    const u32* group_rows;   // [groups] aligned rows of each expert (multiples of 128)
    const float* scale_a;    // null, or A's dequantization scale of expert e at e · scale_a_step
    const float* scale_b;    // null, or B's dequantization scale of expert e at e · scale_b_step
    const u16* bias;         // null, or [groups, n] bf16
    int ldd;
    int groups;
    int capacity_chunks;     // chunks A and D hold: D's rows past the filled chunks are zeroed
    int n;                   // output columns
    int k;                   // reduction length
    int scale_a_step;
    int scale_b_step;
    int band;                // chunks per band of the tile order (unit_position)
};

#define LOWP_BM 128
#define LOWP_BK_BYTES 128
// MN-major B (BF16 NN): leading byte offset = stride between 64-column blocks, stride byte offset
// = stride between 8-row groups along K (the PTX ISA's canonical MN-major 128B-swizzle layout).
#define LOWP_MN_LEADING 8192
#define LOWP_MN_STRIDE 1024
// The operands' types (a kernel's TYPES): BF16 x BF16, E4M3 x E4M3, or E5M2 rows (A: the hybrid
// recipes' dY) x E4M3 weights (B).
#define LOWP_BF16 0
#define LOWP_E4M3 1
#define LOWP_E5M2_E4M3 2

__device__ __forceinline__ u32 shared_address(const void* p) {
    u32 a;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(a)
                 : "l"(p));
    return a;
}

// ---- mbarriers ---------------------------------------------------------------------------------

__device__ __forceinline__ void barrier_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void barrier_expect_bytes(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void barrier_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// Arrive on the mbarrier at the same shared-memory offset `bar` in cluster CTA `cta` (this CTA
// or its peer): a stage that a multicast fills is free only when both CTAs have consumed it.
// The default (CTA-scope) release: what the arrival orders is this warpgroup's reads of the stage,
// already complete (wgmma waited), before the producer's next TMA write. With `.release.cluster`
// the cluster kernels ran at half the speed (benches/results/sm90-cluster-h100, calls 1-2).
__device__ __forceinline__ void barrier_arrive_in_cta(u32 bar, u32 cta) {
    asm volatile(
        "{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1;"
        " mbarrier.arrive.shared::cluster.b64 _, [r]; }" ::"r"(bar),
        "r"(cta)
        : "memory");
}

// Every thread of the cluster (both CTAs) arrives and waits: after the mbarriers' init (before
// a peer may signal them) and at the end (before a CTA whose barriers the peer still signals
// exits). Not `.aligned`: the warps reach it from divergent roles.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void barrier_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// ---- TMA ---------------------------------------------------------------------------------------

__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, u32 bar, int c0,
                                            int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c0), "r"(c1)
        : "memory");
}

__device__ __forceinline__ void tma_load_3d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1,
                                            int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// The same box written to the same shared-memory offset of every CTA in `mask`, each of whose
// mbarriers at offset `bar` is signalled with the bytes it received.
__device__ __forceinline__ void tma_load_3d_multicast(u32 dst, const TensorMap* map, u32 bar,
                                                      int c0, int c1, int c2, u16 mask) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
        : "memory");
}

// One box of shared memory to global through the tensor map (the box clipped to the tensor's
// bounds), in this thread's current bulk async-group.
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, u32 src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(map),
                 "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit() {
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Until at most N of this thread's bulk async-groups are still reading their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Until every bulk async-group of this thread has completed (its writes done).
__device__ __forceinline__ void bulk_wait_all() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Orders this thread's generic-proxy writes to shared memory (stmatrix) before the async proxy's
// reads of it (a TMA store issued after the next barrier).
__device__ __forceinline__ void fence_shared_for_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------

// Shared-memory matrix descriptor: start address, leading and stride byte offsets (all >> 4) and
// the 128-byte swizzle mode (1 << 62).
__device__ __forceinline__ u64 smem_descriptor(u32 address, u32 leading_bytes, u32 stride_bytes) {
    u64 d = 0;
    d |= (u64)((address & 0x3FFFF) >> 4);
    d |= (u64)((leading_bytes & 0x3FFFF) >> 4) << 16;
    d |= (u64)((stride_bytes & 0x3FFFF) >> 4) << 32;
    d |= 1ull << 62;
    return d;
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// wgmma.mma_async with the accumulator in registers: m64nNk16 (bf16, B K-major or, with
// TRANS_B, MN-major) and m64nNk32 (FP8, both operands K-major), N = 256 or 128 (N / 2 f32
// registers a thread). Operand order as in the PTX ISA: D, A descriptor, B descriptor, scale-d,
// scale-a, scale-b[, trans-a, trans-b].
#define LOWP_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, " \
                 "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
                 "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
                 "%62, %63}"
#define LOWP_D128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, " \
                  "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
                  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
                  "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, " \
                  "%76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, " \
                  "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, " \
                  "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
                  "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
// The "+f" constraints of 64 accumulators from d[o].
#define LOWP_ACC64(d, o) "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), \
                         "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7]), \
                         "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]), "+f"(d[o + 11]), \
                         "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15]), \
                         "+f"(d[o + 16]), "+f"(d[o + 17]), "+f"(d[o + 18]), "+f"(d[o + 19]), \
                         "+f"(d[o + 20]), "+f"(d[o + 21]), "+f"(d[o + 22]), "+f"(d[o + 23]), \
                         "+f"(d[o + 24]), "+f"(d[o + 25]), "+f"(d[o + 26]), "+f"(d[o + 27]), \
                         "+f"(d[o + 28]), "+f"(d[o + 29]), "+f"(d[o + 30]), "+f"(d[o + 31]), \
                         "+f"(d[o + 32]), "+f"(d[o + 33]), "+f"(d[o + 34]), "+f"(d[o + 35]), \
                         "+f"(d[o + 36]), "+f"(d[o + 37]), "+f"(d[o + 38]), "+f"(d[o + 39]), \
                         "+f"(d[o + 40]), "+f"(d[o + 41]), "+f"(d[o + 42]), "+f"(d[o + 43]), \
                         "+f"(d[o + 44]), "+f"(d[o + 45]), "+f"(d[o + 46]), "+f"(d[o + 47]), \
                         "+f"(d[o + 48]), "+f"(d[o + 49]), "+f"(d[o + 50]), "+f"(d[o + 51]), \
                         "+f"(d[o + 52]), "+f"(d[o + 53]), "+f"(d[o + 54]), "+f"(d[o + 55]), \
                         "+f"(d[o + 56]), "+f"(d[o + 57]), "+f"(d[o + 58]), "+f"(d[o + 59]), \
                         "+f"(d[o + 60]), "+f"(d[o + 61]), "+f"(d[o + 62]), "+f"(d[o + 63])
#define LOWP_ACC128(d) LOWP_ACC64(d, 0), LOWP_ACC64(d, 64)

template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n256_bf16(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " LOWP_D128
                 ", %128, %129, p, 1, 1, 0, %131;\n}\n"
                 : LOWP_ACC128(d)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}


template <int TRANS_B>
__device__ __forceinline__ void wgmma_m64n128_bf16(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LOWP_D64
                 ", %64, %65, p, 1, 1, 0, %67;\n}\n"
                 : LOWP_ACC64(d, 0)
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}


// FP8 wgmma with A of type ATYPE ("e4m3" or "e5m2") and B E4M3, both K-major, m64nNk32 for
// N = 256 and 128: NAME##_n256 and NAME##_n128.
#define LOWP_WGMMA_FP8(NAME, ATYPE)                                                                \
    __device__ __forceinline__ void NAME##_n256(float* d, u64 desc_a, u64 desc_b, int scale_d) {   \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                  \
                     "wgmma.mma_async.sync.aligned.m64n256k32.f32." ATYPE ".e4m3 " LOWP_D128        \
                     ", %128, %129, p, 1, 1;\n}\n"                                                  \
                     : LOWP_ACC128(d)                                                              \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                    \
    }                                                                                              \
    __device__ __forceinline__ void NAME##_n128(float* d, u64 desc_a, u64 desc_b, int scale_d) {   \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                   \
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32." ATYPE ".e4m3 " LOWP_D64         \
                     ", %64, %65, p, 1, 1;\n}\n"                                                    \
                     : LOWP_ACC64(d, 0)                                                            \
                     : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                    \
    }
LOWP_WGMMA_FP8(wgmma_e4m3, "e4m3")
LOWP_WGMMA_FP8(wgmma_e5m2_e4m3, "e5m2")

// One k-step of FP8 wgmma for a kernel's operand types and tile width.
template <int TYPES, int BN>
__device__ __forceinline__ void wgmma_fp8(float* d, u64 desc_a, u64 desc_b, int scale_d) {
    if constexpr (TYPES == LOWP_E5M2_E4M3) {
        if constexpr (BN == 256) wgmma_e5m2_e4m3_n256(d, desc_a, desc_b, scale_d);
        else wgmma_e5m2_e4m3_n128(d, desc_a, desc_b, scale_d);
    } else {
        if constexpr (BN == 256) wgmma_e4m3_n256(d, desc_a, desc_b, scale_d);
        else wgmma_e4m3_n128(d, desc_a, desc_b, scale_d);
    }
}

// ---- the kernel body ---------------------------------------------------------------------------

__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf16_to_float(u16 v) {
    float f;
    asm("mov.b32 %0, %1;" : "=f"(f) : "r"(((u32)v) << 16));
    return f;
}

// Four 8 x 8 b16 matrices from the warp's registers to shared memory: lane l gives the address
// of row l % 8 of matrix l / 8, and holds (row l / 4, columns 2(l % 4), +1) of each matrix.
__device__ __forceinline__ void store_matrix_x4(u32 address, const u32* r) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(address),
                 "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// The 128 threads of consumer warpgroup c meet (named barrier 1 + c; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_sync(int consumer) {
    asm volatile("bar.sync %0, 128;" ::"r"(1 + consumer) : "memory");
}

__device__ __forceinline__ void store_16_bytes(u16* p, const u32* w) {
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w[0]), "r"(w[1]),
                 "r"(w[2]), "r"(w[3])
                 : "memory");
}

// (NVRTC compiles this file without CUDA's headers, so no `min`.)
__device__ __forceinline__ int smaller(int a, int b) { return a < b ? a : b; }

// Work unit -> (chunk, column unit). Units run through bands of `band` chunks, and within a band
// the chunks change fastest: the CTAs in flight share a few column panels of B (one expert's
// weights) and a band of A rows, so both stay in L2. `band` = 1 is chunk-major order.
__device__ __forceinline__ void unit_position(int unit, int chunks, int col_units, int band,
                                              int& chunk, int& col_unit) {
    const int per_band = band * col_units;
    const int b = unit / per_band;
    const int r = unit - b * per_band;
    const int rows = smaller(band, chunks - b * band);
    col_unit = r / rows;
    chunk = b * band + (r - col_unit * rows);
}

// The expert that owns aligned row `row`: the last one whose first row is at or before it (an
// empty expert starts where the next one does, so the last of equal starts owns the rows).
__device__ __forceinline__ int group_of_row(const u32* group_start, int groups, u32 row) {
    int lo = 0, hi = groups;  // the count of experts starting at or before `row`
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (group_start[mid] <= row) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

// A consumer warpgroup is done with a stage: with clusters, in both CTAs (the producers of both
// write into it).
template <int CLUSTER>
__device__ __forceinline__ void release_stage(u32 bar) {
    if constexpr (CLUSTER == 1) {
        barrier_arrive(bar);
    } else {
        barrier_arrive(bar);
        barrier_arrive_in_cta(bar, cluster_rank() ^ 1);
    }
}

// Bytes of shared memory each consumer warpgroup stages its output through: two buffers of 64
// rows x 64 bf16, the box of D's tensor map.
#define LOWP_STAGING_BYTES 16384
#define LOWP_STAGING_BUFFER 8192

// Epilogue of one consumer warpgroup: D rows [row0, row0 + 64·MI) x columns [col0, col0 + BN)
// from its accumulators (the m64nBN fragment: thread (warp w, lane l) holds rows 16w + l/4 and
// +8 and, per 8-column step j, columns 8j + 2(l%4), +1), times `scale` plus the bias row when
// `transform`, rounded once to bf16. It goes out in rounds of 64 x 64 boxes, through the
// warpgroup's two staging buffers in turn: stmatrix writes the fragments as rows in the layout of
// D's tensor map (128-byte rows, their 16-byte pieces XOR-swizzled by row % 8, so that the eight
// rows of an 8 x 8 matrix fall in distinct banks), then one thread stores the box with TMA and
// the warpgroup goes on. Before a buffer is written again, the store issued from it two rounds
// earlier has read it; its writes to global memory overlap the next rounds and the next tile's
// mainloop. The TMA store clips the columns past n. (Transposing the fragments with shuffles took
// ~11,000 cycles a tile on the H100; storing from the staging buffer with each thread's 16-byte
// global stores, ~3,700.)
// Every tile takes an even number of rounds (4, or 2 in the split-accumulator kernel), so each
// tile starts on buffer 0.
template <int BN, int MI>
__device__ __forceinline__ void store_tile(const GroupedGemmArgs& args, const TensorMap* tm_d,
                                           const float (&acc)[MI][BN / 2], u32 staging,
                                           int consumer, int row0, int col0, bool transform,
                                           float scale, const u16* bias_row) {
    static_assert((MI * BN / 64) % 2 == 0, "an even number of rounds a tile");
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x / 32) % 4;
    const bool issuer = threadIdx.x % 128 == 0;
    // stmatrix: this lane's row of the 8 x 8 matrix it addresses (matrix q = lane / 8 of four:
    // steps j, j, j + 1, j + 1 at rows +0, +8, +0, +8 of the warp's 16).
    const int q = lane / 8;
    const int st_row = warp * 16 + lane % 8 + 8 * (q % 2);
#pragma unroll
    for (int m = 0; m < MI; ++m) {
#pragma unroll
        for (int h = 0; h < BN / 64; ++h) {
            const u32 buffer = staging + ((m * (BN / 64) + h) % 2) * LOWP_STAGING_BUFFER;
            const int box_col = col0 + 64 * h;
            // The store issued from this buffer two rounds ago has read it.
            if (issuer) bulk_wait_read<1>();
            warpgroup_sync(consumer);
            if (box_col < args.n) {
#pragma unroll
                for (int j2 = 0; j2 < 4; ++j2) {
                    u32 r[4];
#pragma unroll
                    for (int p = 0; p < 4; ++p) {
                        const int j = h * 8 + 2 * j2 + p / 2;  // 8-column step in the tile
                        float v0 = acc[m][4 * j + 2 * (p % 2)];
                        float v1 = acc[m][4 * j + 2 * (p % 2) + 1];
                        if (transform) {
                            const int col = col0 + 8 * j + 2 * (lane % 4);
                            float b0 = 0.0f, b1 = 0.0f;
                            if (bias_row != nullptr && col < args.n) {
                                const u32 bb = *reinterpret_cast<const u32*>(bias_row + col);
                                b0 = bf16_to_float((u16)(bb & 0xFFFF));
                                b1 = bf16_to_float((u16)(bb >> 16));
                            }
                            v0 = v0 * scale + b0;
                            v1 = v1 * scale + b1;
                        }
                        r[p] = bf16x2(v0, v1);
                    }
                    const int piece = 2 * j2 + q / 2;  // 16-byte piece of the 128-byte row
                    store_matrix_x4(buffer + st_row * 128 + ((piece ^ (st_row % 8)) * 16), r);
                }
                fence_shared_for_async();
                warpgroup_sync(consumer);
                if (issuer) tma_store_2d(tm_d, buffer, box_col, row0 + 64 * m);
            }
            // (An empty group where the box is past n: the rounds' groups stay two per tile.)
            if (issuer) bulk_commit();
        }
    }
}

// A consumer warpgroup of `grouped_gemm_body`: wgmma over the stages the producer fills, then the
// epilogue (scales, bias, bf16 stores).
template <int BN, int TYPES, bool B_MN_MAJOR, bool SPLIT_ACC, int STAGES, bool PINGPONG,
          int CLUSTER>
__device__ __forceinline__ void grouped_gemm_consume(const GroupedGemmArgs& args,
                                                     const TensorMap* tm_d, u32 base,
                                                     u32 staging, u32 full, u32 empty, u32 order,
                                                     int chunks, int units, int row_units,
                                                     int n_tiles, int band, int first_unit,
                                                     int unit_step, u32 rank, int k_blocks,
                                                     int consumer) {
    constexpr bool FP8 = TYPES != LOWP_BF16;
    constexpr u32 A_BYTES = LOWP_BM * LOWP_BK_BYTES;
    constexpr u32 B_BYTES = BN * LOWP_BK_BYTES;
    constexpr u32 STAGE_BYTES = A_BYTES + B_BYTES;
    constexpr int ACC = BN / 2;
    constexpr int MI = PINGPONG ? 2 : 1;
    const int groups = args.groups;
    const int n = args.n;
    // Cooperative: this warpgroup's rows of each tile are [64·consumer, 64·consumer + 64).
    const u32 row_block = PINGPONG ? 0 : consumer * 64;
    float acc[MI][ACC];
    float part[SPLIT_ACC ? ACC : 1];
    // Stage 0's wgmma descriptors: A (this warpgroup's rows), B K-major or MN-major.
    const u64 desc_a = smem_descriptor(base + row_block * LOWP_BK_BYTES, 16, 1024);
    const u64 desc_b = B_MN_MAJOR ? smem_descriptor(base + A_BYTES, LOWP_MN_LEADING, LOWP_MN_STRIDE)
                                  : smem_descriptor(base + A_BYTES, 16, 1024);
    int stage = 0;
    u32 phase = 0;
    int turn = 0;  // pingpong: tiles this warpgroup has taken
    int local = 0;
    for (int unit = first_unit; unit < units; unit += unit_step, ++local) {
        if (PINGPONG && (local & 1) != consumer) {
            // The other warpgroup's tile: step over its stages in the ring.
            const int next = stage + k_blocks;
            phase ^= (u32)((next / STAGES) & 1);
            stage = next % STAGES;
            continue;
        }
        int row_unit, col_tile;
        unit_position(unit, row_units, n_tiles, band, row_unit, col_tile);
        const int chunk = row_unit * CLUSTER + (int)rank;
        const int col0 = col_tile * BN;
        if constexpr (PINGPONG) {
            // Warpgroup 0 starts; after that each waits for the other's mainloop to end.
            if (consumer == 1) barrier_wait(order + 8, turn & 1);
            else if (turn > 0) barrier_wait(order, (turn - 1) & 1);
        }
#pragma unroll
        for (int m = 0; m < MI; ++m)
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc[m][i] = 0.0f;
        int previous = -1;  // the stage whose wgmmas may still be in flight
        for (int kb = 0; kb < k_blocks; ++kb) {
            barrier_wait(full + 8 * stage, phase);
            // The stage's descriptors are the first stage's plus its offset (in 16-byte units:
            // the address field cannot carry, shared memory ends below 2^18 bytes). Computing
            // each from its address costs ~15 instructions a wgmma.
            const u64 stage_offset = (u64)((stage * STAGE_BYTES) >> 4);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
                for (int m = 0; m < MI; ++m) {
                    const u64 da = desc_a + stage_offset + (u64)((m * 64 * LOWP_BK_BYTES + ks * 32) >> 4);
                    // MN-major B: 16 K rows of 128 bytes per step (64-column blocks 8 KiB apart).
                    const u64 db = desc_b + stage_offset + (u64)((B_MN_MAJOR ? ks * 2048 : ks * 32) >> 4);
                    if constexpr (FP8) {
                        if constexpr (SPLIT_ACC) wgmma_fp8<TYPES, BN>(part, da, db, ks > 0);
                        else wgmma_fp8<TYPES, BN>(acc[m], da, db, 1);
                    } else {
                        if constexpr (BN == 256) wgmma_m64n256_bf16<B_MN_MAJOR>(acc[m], da, db, 1);
                        else wgmma_m64n128_bf16<B_MN_MAJOR>(acc[m], da, db, 1);
                    }
                }
            }
            wgmma_commit();
            if constexpr (SPLIT_ACC) {
                // The partial sums are read right away: this stage's wgmmas must be done.
                wgmma_wait<0>();
#pragma unroll
                for (int i = 0; i < ACC; ++i) acc[0][i] += part[i];
                if (threadIdx.x % 128 == 0) release_stage<CLUSTER>(empty + 8 * stage);
            } else {
                // Keep this stage's wgmmas in flight; the previous stage's are done after this.
                wgmma_wait<1>();
                if (previous >= 0 && threadIdx.x % 128 == 0) release_stage<CLUSTER>(empty + 8 * previous);
                previous = stage;
            }
            if (++stage == STAGES) {
                stage = 0;
                phase ^= 1;
            }
        }
        if constexpr (!SPLIT_ACC) {
            wgmma_wait<0>();
            if (previous >= 0 && threadIdx.x % 128 == 0) release_stage<CLUSTER>(empty + 8 * previous);
        }
        if constexpr (PINGPONG) {
            // The other warpgroup may take the ring while this one stores its tile.
            if (threadIdx.x % 128 == 0) barrier_arrive(order + 8 * (consumer ^ 1));
            ++turn;
        }

        // A cluster's second chunk past the filled ones computed nothing to store.
        if (chunk >= chunks) continue;

        const u16* __restrict__ bias = args.bias;
        const bool per_group = args.scale_a || args.scale_b || bias;
        const int group = per_group ? group_of_row(args.group_start, groups, chunk * LOWP_BM) : 0;
        float scale = 1.0f;
        if (args.scale_a) scale *= args.scale_a[group * args.scale_a_step];
        if (args.scale_b) scale *= args.scale_b[group * args.scale_b_step];
        store_tile<BN, MI>(args, tm_d, acc, staging + consumer * LOWP_STAGING_BYTES, consumer,
                           chunk * LOWP_BM + (int)row_block, col0, per_group, scale,
                           bias ? bias + (long long)group * n : nullptr);
    }
    // The shared memory the last stores read, and the CTA, stay until they have completed.
    if (threadIdx.x % 128 == 0) bulk_wait_all();
}

// What the producer needs of a work unit: the A chunk it loads, B's first column and expert, and
// (clusters) whether the pair shares B.
struct ProducerTile {
    int chunk;
    int col0;
    int group;
    bool multicast;
};

template <int BN, int CLUSTER>
__device__ __forceinline__ ProducerTile producer_tile(const GroupedGemmArgs& args, int unit,
                                                      int chunks, int row_units, int n_tiles,
                                                      int band, u32 rank) {
    int row_unit, col_tile;
    unit_position(unit, row_units, n_tiles, band, row_unit, col_tile);
    ProducerTile t;
    t.col0 = col_tile * BN;
    // A cluster's second chunk past the filled ones (an odd count) is computed on the last
    // filled chunk's rows and not stored: the pair's stages stay in step.
    t.chunk = smaller(row_unit * CLUSTER + (int)rank, chunks - 1);
    t.group = group_of_row(args.group_start, args.groups, t.chunk * LOWP_BM);
    t.multicast = false;
    if constexpr (CLUSTER > 1) {
        const int other = smaller(row_unit * CLUSTER + (int)(rank ^ 1), chunks - 1);
        t.multicast = group_of_row(args.group_start, args.groups, other * LOWP_BM) == t.group;
    }
    return t;
}

// B_MN_MAJOR: B is [E, K, N] (N contiguous); else [E, N, K] (K contiguous).
// PINGPONG: each consumer warpgroup computes whole 128 x BN tiles, the two taking turns, so that
// one's epilogue runs while the other's wgmmas keep the tensor cores busy (an order barrier lets
// only one of them consume the stage ring at a time). Otherwise ("cooperative") both split every
// tile by rows, and the tensor cores wait while they store it: that costs most where K is short.
// CLUSTER = 2: clusters of two CTAs compute the two chunks of a pair (2p, 2p + 1) at the same
// column tile. Where both chunks belong to one expert (they share B), each CTA loads half of the
// B tile and multicasts it to both, so that a CTA reads 32 KiB a stage from L2 instead of 48
// (128 x 256 tiles), as PyTorch's CUTLASS grouped GEMM does with its 2 x 1 clusters. A pair that
// straddles two experts loads B in each CTA. Each stage's empty barrier then counts both CTAs'
// consumers, since the peer's multicast writes into this CTA's stage.
template <int BN, int TYPES, bool B_MN_MAJOR, bool SPLIT_ACC, int STAGES, bool PINGPONG,
          int CLUSTER>
__device__ __forceinline__ void grouped_gemm_body(const TensorMap* tm_a, const TensorMap* tm_b,
                                                  const TensorMap* tm_d,
                                                  const GroupedGemmArgs& args) {
    constexpr int BK = TYPES != LOWP_BF16 ? 128 : 64;  // elements per 128-byte row
    constexpr u32 A_BYTES = LOWP_BM * LOWP_BK_BYTES;
    constexpr u32 B_BYTES = BN * LOWP_BK_BYTES;
    constexpr u32 STAGE_BYTES = A_BYTES + B_BYTES;
    constexpr int ACC = BN / 2;  // f32 accumulators per thread of a 64 x BN warpgroup tile
    constexpr int MI = PINGPONG ? 2 : 1;  // 64-row blocks of the tile per consumer warpgroup
    // K-major B is loaded in boxes of B_BOX rows: a cluster's CTAs load one half each.
    constexpr int B_BOX = CLUSTER > 1 ? BN / 2 : BN;
    static_assert(!(PINGPONG && SPLIT_ACC), "the split accumulator needs the registers of both");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "pairs of CTAs at most");

    extern __shared__ unsigned char smem_raw[];
    const u32 base = (shared_address(smem_raw) + 1023u) & ~1023u;
    const u32 staging = base + STAGES * STAGE_BYTES;  // the consumers' staging buffers
    const u32 full = staging + 2 * LOWP_STAGING_BYTES;  // STAGES mbarriers: stage loaded
    const u32 empty = full + STAGES * 8;           // STAGES mbarriers: stage consumed
    const u32 order = empty + STAGES * 8;          // 2 mbarriers: consumer c may run its mainloop

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            barrier_init(full + 8 * s, 1);
            // One arrival per consumer warpgroup that reads the stage, in each CTA of the cluster.
            barrier_init(empty + 8 * s, (PINGPONG ? 1 : 2) * CLUSTER);
        }
        barrier_init(order, 1);
        barrier_init(order + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (CLUSTER > 1) cluster_sync();
    else __syncthreads();

    const int groups = args.groups;
    const int n = args.n;
    // The chunks the splits fill, read on the device (and never more than the buffers hold).
    const int chunks =
        smaller((int)((args.group_start[groups - 1] + args.group_rows[groups - 1]) / LOWP_BM),
            args.capacity_chunks);
    const int n_tiles = (n + BN - 1) / BN;
    // Work units: (chunk, column tile), or with clusters (chunk pair, column tile), one a cluster.
    const int row_units = (chunks + CLUSTER - 1) / CLUSTER;
    const int units = row_units * n_tiles;
    const int band = CLUSTER > 1 ? (args.band + 1) / 2 : args.band;
    const int first_unit = blockIdx.x / CLUSTER;
    const int unit_step = gridDim.x / CLUSTER;
    const u32 rank = CLUSTER > 1 ? cluster_rank() : 0;
    const int k_blocks = (args.k + BK - 1) / BK;
    const int warpgroup = threadIdx.x / 128;

    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x >= 32) {
            // Warps 1-3 write the zero tail (the rows past the filled chunks), 16 bytes a store,
            // spread over every CTA, while the GEMM runs: DRAM is mostly idle then.
            const long long words_per_row = n / 8;
            const long long first_row = (long long)chunks * LOWP_BM;
            const long long words =
                ((long long)args.capacity_chunks * LOWP_BM - first_row) * words_per_row;
            const u32 zero[4] = {0u, 0u, 0u, 0u};
            for (long long w = (long long)blockIdx.x * 96 + (threadIdx.x - 32); w < words;
                 w += (long long)gridDim.x * 96) {
                const long long row = first_row + w / words_per_row;
                store_16_bytes(args.d + row * args.ldd + (w % words_per_row) * 8, zero);
            }
        } else if (threadIdx.x == 0) {
            int stage = 0;
            u32 phase = 0;
            ProducerTile next = {};
            if (first_unit < units)
                next = producer_tile<BN, CLUSTER>(args, first_unit, chunks, row_units, n_tiles, band, rank);
            for (int unit = first_unit; unit < units; unit += unit_step) {
                const ProducerTile cur = next;
                const int following = unit + unit_step;
                for (int kb = 0; kb < k_blocks; ++kb) {
                    barrier_wait(empty + 8 * stage, phase ^ 1);
                    const u32 bar = full + 8 * stage;
                    const u32 sa = base + stage * STAGE_BYTES;
                    const u32 sb = sa + A_BYTES;
                    // All of the stage's bytes land here: a multicast sends the peer's half.
                    barrier_expect_bytes(bar, STAGE_BYTES);
                    tma_load_2d(sa, tm_a, bar, kb * BK, cur.chunk * LOWP_BM);
                    if constexpr (B_MN_MAJOR) {
                        // [64 K rows] x [64 N] boxes, one per 64 columns of the tile.
                        constexpr int BOXES = BN / 64;
                        if (cur.multicast) {
#pragma unroll
                            for (int j = 0; j < BOXES / 2; ++j) {
                                const int box = (int)rank * (BOXES / 2) + j;
                                tma_load_3d_multicast(sb + box * 8192, tm_b, bar, cur.col0 + 64 * box,
                                                      kb * BK, cur.group, 3);
                            }
                        } else {
#pragma unroll
                            for (int j = 0; j < BOXES; ++j)
                                tma_load_3d(sb + j * 8192, tm_b, bar, cur.col0 + 64 * j, kb * BK,
                                            cur.group);
                        }
                    } else if (cur.multicast) {
                        tma_load_3d_multicast(sb + rank * (B_BYTES / 2), tm_b, bar, kb * BK,
                                              cur.col0 + (int)rank * (BN / 2), cur.group, 3);
                    } else {
#pragma unroll
                        for (int h = 0; h < BN / B_BOX; ++h)
                            tma_load_3d(sb + h * B_BOX * LOWP_BK_BYTES, tm_b, bar, kb * BK,
                                        cur.col0 + h * B_BOX, cur.group);
                    }
                    // The next tile's position and expert (dependent global loads) are looked up
                    // while this tile's first loads are in flight, not in front of the next
                    // tile's. (k >= 1: the host never launches an empty reduction.)
                    if (kb == 0 && following < units)
                        next = producer_tile<BN, CLUSTER>(args, following, chunks, row_units, n_tiles, band, rank);
                    if (++stage == STAGES) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        grouped_gemm_consume<BN, TYPES, B_MN_MAJOR, SPLIT_ACC, STAGES, PINGPONG, CLUSTER>(
            args, tm_d, base, staging, full, empty, order, chunks, units, row_units, n_tiles, band, first_unit,
            unit_step, rank, k_blocks, warpgroup - 1);
    }
    // Neither CTA of a cluster exits while its peer may still signal its barriers.
    if constexpr (CLUSTER > 1) cluster_sync();
}

#define LOWP_GROUPED_GEMM(NAME, BN, TYPES, MN, SPLIT, STAGES, PINGPONG)                            \
    extern "C" __global__ void __launch_bounds__(384, 1)                                           \
        NAME(const __grid_constant__ TensorMap tm_a, const __grid_constant__ TensorMap tm_b,       \
             const __grid_constant__ TensorMap tm_d,                                               \
             const __grid_constant__ GroupedGemmArgs args) {                                       \
        grouped_gemm_body<BN, TYPES, MN, SPLIT, STAGES, PINGPONG, 1>(&tm_a, &tm_b, &tm_d, args);   \
    }
// The same kernel in clusters of two CTAs (B multicast), the cluster size fixed at compile time
// so that a plain launch of an even grid runs it.
#define LOWP_GROUPED_GEMM_X2(NAME, BN, TYPES, MN, SPLIT, STAGES, PINGPONG)                         \
    extern "C" __global__ void __launch_bounds__(384, 1) __attribute__((cluster_dims(2, 1, 1)))    \
        NAME(const __grid_constant__ TensorMap tm_a, const __grid_constant__ TensorMap tm_b,       \
             const __grid_constant__ TensorMap tm_d,                                               \
             const __grid_constant__ GroupedGemmArgs args) {                                       \
        grouped_gemm_body<BN, TYPES, MN, SPLIT, STAGES, PINGPONG, 2>(&tm_a, &tm_b, &tm_d, args);   \
    }

// Dynamic shared memory of a kernel: STAGES · (128 + BN) · 128 bytes, two 16 KiB staging
// buffers, 1024 bytes of alignment slack and 16 bytes of mbarriers per stage plus 16
// (224 KiB + 1 KiB + barriers for all of these).
LOWP_GROUPED_GEMM(lowp_grouped_gemm_bf16_tn_256, 256, LOWP_BF16, false, false, 4, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_bf16_nn_256, 256, LOWP_BF16, true, false, 4, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e4m3_tn_256, 256, LOWP_E4M3, false, false, 4, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e4m3_tn_split_128, 128, LOWP_E4M3, false, true, 6, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e4m3_tn_128_pingpong, 128, LOWP_E4M3, false, false, 6, true)
// The hybrid recipes' dgrad: E5M2 gradient rows x E4M3 columnwise weights.
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e5m2_tn_256, 256, LOWP_E5M2_E4M3, false, false, 4, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e5m2_tn_split_128, 128, LOWP_E5M2_E4M3, false, true, 6, false)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_e5m2_tn_128_pingpong, 128, LOWP_E5M2_E4M3, false, false, 6, true)
// Kernels only the probe compiles (`benches/sm90_probe` defines this), which the crate does not
// launch: BF16 pingpong, which the cooperative kernels overtook once their epilogue went through
// shared memory, and the cluster twins, which on the H100 ran no faster than the kernels above
// although they cut the L2 traffic by a fifth (MEASUREMENTS.md, stop 47).
#ifdef LOWP_GROUPED_GEMM_PROBE_KERNELS
LOWP_GROUPED_GEMM(lowp_grouped_gemm_bf16_tn_128_pingpong, 128, LOWP_BF16, false, false, 6, true)
LOWP_GROUPED_GEMM(lowp_grouped_gemm_bf16_nn_128_pingpong, 128, LOWP_BF16, true, false, 6, true)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_bf16_tn_256_x2, 256, LOWP_BF16, false, false, 4, false)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_bf16_nn_256_x2, 256, LOWP_BF16, true, false, 4, false)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_e4m3_tn_256_x2, 256, LOWP_E4M3, false, false, 4, false)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_e4m3_tn_split_128_x2, 128, LOWP_E4M3, false, true, 6, false)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_bf16_tn_128_pingpong_x2, 128, LOWP_BF16, false, false, 6, true)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_bf16_nn_128_pingpong_x2, 128, LOWP_BF16, true, false, 6, true)
LOWP_GROUPED_GEMM_X2(lowp_grouped_gemm_e4m3_tn_128_pingpong_x2, 128, LOWP_E4M3, false, false, 6, true)
#endif
