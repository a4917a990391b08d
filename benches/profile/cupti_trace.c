// A CUPTI activity tracer for any CUDA process, loaded by the driver through
// `CUDA_INJECTION64_PATH` (no change to the program traced; the GPU machine has no Nsight
// Systems). It records every kernel, memcpy and memset with its GPU start and end and its stream,
// and the driver API calls that enqueue or wait (launches, copies, event records and waits,
// synchronizations) with their CPU start and end, all on CUPTI's one clock, and writes them as CSV
// to `$LOWP_CUPTI_TRACE` (default `cupti-trace.csv`) when the process exits.
// `benches/profile/cupti_summary.py` turns that into busy time, idle gaps and what each gap waited
// for (the host, or ordering on the GPU).
//
// Build (on the GPU machine; CUPTI's headers and library come with the CUDA toolkit):
//   gcc -O2 -shared -fPIC cupti_trace.c -I$CUDA/include -I$CUPTI/include \
//       -L$CUPTI/lib64 -lcupti -Wl,-rpath,$CUPTI/lib64 -o libcupti_trace.so
// Run:
//   CUDA_INJECTION64_PATH=$PWD/libcupti_trace.so LOWP_CUPTI_TRACE=out.csv ./program
//
// Columns: kind, start_ns, end_ns, stream (GPU records) or thread (API records), correlation id,
// detail (bytes, or grid/block), name. Kernel records are read through `CUpti_ActivityKernel9`:
// later record versions only append fields, so its prefix (times, stream, grid, name) holds for
// them too.

#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#define BUFFER_BYTES (8u << 20)

static FILE *trace_file;
static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t dropped_records;

static void check(CUptiResult result, const char *what) {
    if (result != CUPTI_SUCCESS) {
        const char *message = "?";
        cuptiGetResultString(result, &message);
        fprintf(stderr, "cupti_trace: %s failed: %s\n", what, message);
    }
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

// Driver calls kept: those that put work on a stream, wait, or allocate. The rest (context and
// attribute queries) would only bloat the file.
static int driver_call_kept(const char *name) {
    static const char *prefixes[] = {
        "cuLaunch", "cuMemcpy", "cuMemset", "cuStreamWait", "cuStreamSynchronize",
        "cuEventRecord", "cuEventSynchronize", "cuEventQuery", "cuCtxSynchronize",
        "cuMemAlloc", "cuMemFree", "cuStreamQuery", "cuGraphLaunch", "cuMemHostAlloc",
    };
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0) {
            return 1;
        }
    }
    return 0;
}

static void write_record(CUpti_Activity *record) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        CUpti_ActivityKernel9 *k = (CUpti_ActivityKernel9 *)record;
        fprintf(trace_file, "kernel,%llu,%llu,%u,%u,%dx%dx%d/%dx%dx%d,\"%s\"\n",
                (unsigned long long)k->start, (unsigned long long)k->end, k->streamId,
                k->correlationId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ,
                k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        CUpti_ActivityMemcpy5 *m = (CUpti_ActivityMemcpy5 *)record;
        fprintf(trace_file, "memcpy,%llu,%llu,%u,%u,%llu,\"copy kind %u\"\n",
                (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                m->correlationId, (unsigned long long)m->bytes, (unsigned)m->copyKind);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
        fprintf(trace_file, "memset,%llu,%llu,%u,%u,%llu,\"memset\"\n",
                (unsigned long long)m->start, (unsigned long long)m->end, m->streamId,
                m->correlationId, (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)record;
        const char *name = "?";
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
        if (driver_call_kept(name)) {
            fprintf(trace_file, "driver,%llu,%llu,%u,%u,0,\"%s\"\n",
                    (unsigned long long)a->start, (unsigned long long)a->end, a->threadId,
                    a->correlationId, name);
        }
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&trace_lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        write_record(record);
    }
    size_t dropped = 0;
    cuptiActivityGetNumDroppedRecords(context, stream, &dropped);
    dropped_records += dropped;
    pthread_mutex_unlock(&trace_lock);
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    pthread_mutex_lock(&trace_lock);
    if (trace_file) {
        fprintf(stderr, "cupti_trace: trace written, %llu records dropped\n",
                (unsigned long long)dropped_records);
        fclose(trace_file);
        trace_file = NULL;
    }
    pthread_mutex_unlock(&trace_lock);
}

// Called by the CUDA driver when it loads this library (`CUDA_INJECTION64_PATH`).
int InitializeInjection(void) {
    const char *path = getenv("LOWP_CUPTI_TRACE");
    trace_file = fopen(path ? path : "cupti-trace.csv", "w");
    if (!trace_file) {
        perror("cupti_trace: cannot open the trace file");
        return 0;
    }
    fprintf(trace_file, "kind,start_ns,end_ns,stream,correlation,detail,name\n");
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enable driver API");
    atexit(finish);
    return 1;
}
