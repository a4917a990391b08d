// Probe harness for src/backend/sm90/grouped_gemm.cu on the GPU machine (nvcc there, no Rust):
// builds the tensor maps as `backend::sm90_grouped` does and launches one of the kernels on a
// caller's stream (`lowp_probe_launch`: the fprop/dgrad kernels; `lowp_probe_wgrad_launch`: the
// K-grouped weight gradient); `probe.py` loads it with ctypes and compares with PyTorch
// (`probe.py --build` runs this command itself). Build:
//   nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90a,code=sm_90a \
//        -o libprobe.so harness.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

// The kernels the crate does not launch too: BF16 pingpong and the cluster twins.
#define LOWP_GROUPED_GEMM_PROBE_KERNELS
#include "../../src/backend/cuda/sm90/grouped_gemm.cu"

typedef void (*Kernel)(const TensorMap, const TensorMap, const TensorMap, const GroupedGemmArgs);

struct Variant {
    const char* name;
    Kernel kernel;
    int bn;
    bool fp8;
    bool mn_major;
    int stages;
    int cluster;  // CTAs per cluster (2: B multicast, K-major B loaded in boxes of bn / 2 rows)
};

static const Variant VARIANTS[] = {
    {"bf16_tn_256", lowp_grouped_gemm_bf16_tn_256, 256, false, false, 4, 1},
    {"bf16_nn_256", lowp_grouped_gemm_bf16_nn_256, 256, false, true, 4, 1},
    {"e4m3_tn_256", lowp_grouped_gemm_e4m3_tn_256, 256, true, false, 4, 1},
    {"e4m3_tn_split_128", lowp_grouped_gemm_e4m3_tn_split_128, 128, true, false, 6, 1},
    {"bf16_tn_128_pingpong", lowp_grouped_gemm_bf16_tn_128_pingpong, 128, false, false, 6, 1},
    {"bf16_nn_128_pingpong", lowp_grouped_gemm_bf16_nn_128_pingpong, 128, false, true, 6, 1},
    {"e4m3_tn_128_pingpong", lowp_grouped_gemm_e4m3_tn_128_pingpong, 128, true, false, 6, 1},
    {"e5m2_tn_256", lowp_grouped_gemm_e5m2_tn_256, 256, true, false, 4, 1},
    {"e5m2_tn_split_128", lowp_grouped_gemm_e5m2_tn_split_128, 128, true, false, 6, 1},
    {"e5m2_tn_128_pingpong", lowp_grouped_gemm_e5m2_tn_128_pingpong, 128, true, false, 6, 1},
    {"bf16_tn_256_x2", lowp_grouped_gemm_bf16_tn_256_x2, 256, false, false, 4, 2},
    {"bf16_nn_256_x2", lowp_grouped_gemm_bf16_nn_256_x2, 256, false, true, 4, 2},
    {"e4m3_tn_256_x2", lowp_grouped_gemm_e4m3_tn_256_x2, 256, true, false, 4, 2},
    {"e4m3_tn_split_128_x2", lowp_grouped_gemm_e4m3_tn_split_128_x2, 128, true, false, 6, 2},
    {"bf16_tn_128_pingpong_x2", lowp_grouped_gemm_bf16_tn_128_pingpong_x2, 128, false, false, 6, 2},
    {"bf16_nn_128_pingpong_x2", lowp_grouped_gemm_bf16_nn_128_pingpong_x2, 128, false, true, 6, 2},
    {"e4m3_tn_128_pingpong_x2", lowp_grouped_gemm_e4m3_tn_128_pingpong_x2, 128, true, false, 6, 2},
};

static int encode(TensorMap* out, CUtensorMapDataType type, cuuint32_t rank, void* base,
                  const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
    cuuint32_t elem[3] = {1, 1, 1};
    CUresult r = cuTensorMapEncodeTiled(reinterpret_cast<CUtensorMap*>(out), type, rank, base,
                                        dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        const char* s = nullptr;
        cuGetErrorString(r, &s);
        fprintf(stderr, "cuTensorMapEncodeTiled: %s\n", s ? s : "?");
        return -1;
    }
    return 0;
}

extern "C" const char* lowp_probe_name(int v) { return VARIANTS[v].name; }
extern "C" int lowp_probe_bn(int v) { return VARIANTS[v].bn; }
extern "C" int lowp_probe_count() { return sizeof(VARIANTS) / sizeof(VARIANTS[0]); }

// a: [p, k]; b: [e, n, k] (TN) or [e, k, n] (NN); d: [p, ldd]; group_start / group_rows: u32 [e].
extern "C" int lowp_probe_launch(int v, void* a, void* b, void* d, int ldd,
                                 const unsigned* group_start, const unsigned* group_rows,
                                 int groups, int p, int n, int k, const float* scale_a,
                                 int scale_a_step, const float* scale_b, int scale_b_step,
                                 const void* bias, int grid, void* stream) {
    const Variant& var = VARIANTS[v];
    const int es = var.fp8 ? 1 : 2;
    const int bk = 128 / es;
    const CUtensorMapDataType type =
        var.fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    TensorMap ma, mb, md;
    {
        cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)p};
        cuuint64_t strides[1] = {(cuuint64_t)k * es};
        cuuint32_t box[2] = {(cuuint32_t)bk, 128};
        if (encode(&ma, type, 2, a, dims, strides, box)) return -1;
    }
    if (var.mn_major) {
        cuuint64_t dims[3] = {(cuuint64_t)n, (cuuint64_t)k, (cuuint64_t)groups};
        cuuint64_t strides[2] = {(cuuint64_t)n * es, (cuuint64_t)n * k * es};
        cuuint32_t box[3] = {64, 64, 1};
        if (encode(&mb, type, 3, b, dims, strides, box)) return -2;
    } else {
        cuuint64_t dims[3] = {(cuuint64_t)k, (cuuint64_t)n, (cuuint64_t)groups};
        cuuint64_t strides[2] = {(cuuint64_t)k * es, (cuuint64_t)n * k * es};
        cuuint32_t box[3] = {(cuuint32_t)bk, (cuuint32_t)(var.bn / var.cluster), 1};
        if (encode(&mb, type, 3, b, dims, strides, box)) return -2;
    }
    {
        // D [p, ldd] bf16, written in boxes of 64 columns by 64 rows.
        cuuint64_t dims[2] = {(cuuint64_t)n, (cuuint64_t)p};
        cuuint64_t strides[1] = {(cuuint64_t)ldd * 2};
        cuuint32_t box[2] = {64, 64};
        if (encode(&md, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, d, dims, strides, box)) return -6;
    }
    const int smem = var.stages * (128 + var.bn) * 128 + 2 * 16384 + 1024 + var.stages * 16 + 16;
    cudaError_t e = cudaFuncSetAttribute((const void*)var.kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        fprintf(stderr, "set smem: %s\n", cudaGetErrorString(e));
        return -3;
    }
    const char* band = getenv("LOWP_BAND");
    GroupedGemmArgs args = {};
    args.d = (u16*)d;
    args.group_start = group_start;
    args.group_rows = group_rows;
    args.scale_a = scale_a;
    args.scale_b = scale_b;
    args.bias = (const u16*)bias;
    args.ldd = ldd;
    args.groups = groups;
    args.capacity_chunks = p / 128;
    args.n = n;
    args.k = k;
    args.scale_a_step = scale_a_step;
    args.scale_b_step = scale_b_step;
    args.band = band ? atoi(band) : 1;
    if (var.cluster > 1) {
        // The resident clusters of two (the cluster size is the kernel's, fixed at compile time).
        static int clusters[sizeof(VARIANTS) / sizeof(VARIANTS[0])] = {};
        if (clusters[v] == 0) {
            cudaLaunchConfig_t config = {};
            config.gridDim = dim3(grid, 1, 1);
            config.blockDim = dim3(384, 1, 1);
            config.dynamicSmemBytes = smem;
            e = cudaOccupancyMaxActiveClusters(&clusters[v], (const void*)var.kernel, &config);
            if (e != cudaSuccess || clusters[v] <= 0) {
                fprintf(stderr, "max active clusters: %s (%d)\n", cudaGetErrorString(e), clusters[v]);
                return -5;
            }
            fprintf(stderr, "%s: %d resident clusters\n", var.name, clusters[v]);
        }
        grid = 2 * clusters[v];
    }
    var.kernel<<<grid, 384, smem, (cudaStream_t)stream>>>(ma, mb, md, args);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "launch: %s\n", cudaGetErrorString(e));
        return -4;
    }
    return 0;
}

// ---- The K-grouped weight gradient (`grouped_wgrad_body`) ----------------------------------------

typedef void (*WgradKernel)(const TensorMap, const TensorMap, const GroupedWgradArgs);

struct WgradVariant {
    const char* name;
    WgradKernel kernel;
    int bn;
    bool fp8;
    int stages;
};

static const WgradVariant WGRAD_VARIANTS[] = {
    {"wgrad_bf16_256", lowp_grouped_wgrad_bf16_256, 256, false, 4},
    {"wgrad_e4m3_256", lowp_grouped_wgrad_e4m3_256, 256, true, 4},
    {"wgrad_e4m3_split_128", lowp_grouped_wgrad_e4m3_split_128, 128, true, 6},
    {"wgrad_e5m2_256", lowp_grouped_wgrad_e5m2_256, 256, true, 4},
    {"wgrad_e5m2_split_128", lowp_grouped_wgrad_e5m2_split_128, 128, true, 6},
};

extern "C" const char* lowp_probe_wgrad_name(int v) { return WGRAD_VARIANTS[v].name; }
extern "C" int lowp_probe_wgrad_count() {
    return sizeof(WGRAD_VARIANTS) / sizeof(WGRAD_VARIANTS[0]);
}

// dW [groups, m, n] (f32 where flags & 1, else bf16; flags & 2 accumulates into it) from
// BF16: a = dY [p, m], b = X [p, n]; FP8: a = dYᵀ [m, p], b = Xᵀ [n, p] (whole transposes).
extern "C" int lowp_probe_wgrad_launch(int v, void* a, void* b, void* d,
                                       const unsigned* group_start, const unsigned* group_rows,
                                       int groups, int p, int m, int n, const float* scale_a,
                                       int scale_a_step, const float* scale_b, int scale_b_step,
                                       int flags, int grid, void* stream) {
    const WgradVariant& var = WGRAD_VARIANTS[v];
    TensorMap ma, mb;
    if (var.fp8) {
        // [rows, p] u8, p contiguous: 128 bytes of K by 128 (A) or bn (B) rows.
        cuuint64_t dims_a[2] = {(cuuint64_t)p, (cuuint64_t)m};
        cuuint64_t dims_b[2] = {(cuuint64_t)p, (cuuint64_t)n};
        cuuint64_t strides[1] = {(cuuint64_t)p};
        cuuint32_t box_a[2] = {128, 128};
        cuuint32_t box_b[2] = {128, (cuuint32_t)var.bn};
        if (encode(&ma, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, a, dims_a, strides, box_a)) return -1;
        if (encode(&mb, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, b, dims_b, strides, box_b)) return -2;
    } else {
        // [p, cols] bf16, cols contiguous: 64 columns by 64 K rows a box.
        cuuint64_t dims_a[2] = {(cuuint64_t)m, (cuuint64_t)p};
        cuuint64_t dims_b[2] = {(cuuint64_t)n, (cuuint64_t)p};
        cuuint64_t strides_a[1] = {(cuuint64_t)m * 2};
        cuuint64_t strides_b[1] = {(cuuint64_t)n * 2};
        cuuint32_t box[2] = {64, 64};
        if (encode(&ma, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, a, dims_a, strides_a, box)) return -1;
        if (encode(&mb, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, b, dims_b, strides_b, box)) return -2;
    }
    const int smem = var.stages * (128 + var.bn) * 128 + 1024 + var.stages * 16;
    cudaError_t e = cudaFuncSetAttribute((const void*)var.kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        fprintf(stderr, "set smem: %s\n", cudaGetErrorString(e));
        return -3;
    }
    GroupedWgradArgs args = {};
    args.d = d;
    args.group_start = group_start;
    args.group_rows = group_rows;
    args.scale_a = scale_a;
    args.scale_b = scale_b;
    args.groups = groups;
    args.m = m;
    args.n = n;
    args.scale_a_step = scale_a_step;
    args.scale_b_step = scale_b_step;
    args.flags = flags;
    var.kernel<<<grid, 384, smem, (cudaStream_t)stream>>>(ma, mb, args);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "launch: %s\n", cudaGetErrorString(e));
        return -4;
    }
    return 0;
}
