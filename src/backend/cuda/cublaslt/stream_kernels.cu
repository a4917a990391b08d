// Our streams' kernels, compiled with NVRTC on first use (`kernels.rs`, which defines the flag
// words' indices `LOWP_FLAG_READY` and `LOWP_FLAG_TIMED_OUT` of `burn_lowp_kernels::stream_flags`
// before this source).
//
// lowp_fill_pointers: a pointer-array batch's three pointer arrays from the groups' device offsets
// (entry c takes A's group holding row `c * chunk_rows`; tail chunks the last group starting at
// or before it, whose zero rows make zero output), so the host never reads the splits.
// lowp_wait_ready: CubeCL's pool memory (`cuMemAllocAsync`) is refused by `cuStreamWaitValue32`
// (CUDA_ERROR_INVALID_VALUE, seen on an H100 with driver 580), so our stream polls CubeCL's READY
// flag with this kernel instead, recording the value it waited for in TIMED_OUT if it gives up.

extern "C" __global__ void lowp_fill_pointers(
    unsigned long long* arrays, unsigned int count, unsigned int stride,
    const unsigned int* group_start, const unsigned int* group_len, unsigned int groups,
    unsigned int chunk_rows,
    unsigned long long a, unsigned long long a_stride,
    unsigned long long b, unsigned long long b_stride,
    unsigned long long d, unsigned long long d_stride) {
    unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= count) return;
    unsigned long long row = (unsigned long long)c * chunk_rows;
    unsigned int lo = 0, hi = groups;
    while (hi - lo > 1) {
        unsigned int mid = (lo + hi) / 2;
        if (group_start[mid] <= row) lo = mid; else hi = mid;
    }
    (void)group_len;
    arrays[c] = a + lo * a_stride;
    arrays[stride + c] = b + c * b_stride;
    arrays[2 * stride + c] = d + c * d_stride;
}

extern "C" __global__ void lowp_wait_ready(unsigned int* flags, unsigned int value, unsigned int max_polls) {
    volatile unsigned int* ready = flags + LOWP_FLAG_READY;
    unsigned int polls = 0;
    while (*ready < value) {
        if (++polls >= max_polls) {
            ((volatile unsigned int*)flags)[LOWP_FLAG_TIMED_OUT] = value;
            return;
        }
        __nanosleep(128);
    }
    __threadfence();
}
