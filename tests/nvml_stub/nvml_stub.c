/*
 * A stand-in for libnvidia-ml.so.1 that nvidia-ml-py loads for real, for tests and benchmarks
 * on machines without an NVIDIA GPU. It exports the NVML symbols gpuflow calls (through
 * pynvml) and answers from a state file that the test writes; the file is read again on every
 * call, so a test changes what "the driver" says by rewriting it.
 *
 * The file is named by GPUFLOW_NVML_STUB_STATE; one record per line, fields split by tabs:
 *
 *   driver      <version>                       e.g. 550.54.15
 *   init_error  <nvml return code>              e.g. 9 (NVML_ERROR_DRIVER_NOT_LOADED)
 *   gpu         <name> <uuid> <total MiB> <used MiB> <gpu util %> <memory util %>
 *               <cc major> <cc minor> <error>   error: return code of every call on this
 *                                               GPU, e.g. 15 (NVML_ERROR_GPU_IS_LOST), 0 = ok
 *   proc        <gpu index> <pid> <sm util %> <used MiB>
 *                                               a compute process on that GPU; its
 *                                               utilization is one sample, stamped now
 *   per_process <nvml return code>              what the per-process calls give instead of
 *                                               answering, e.g. 3 (NVML_ERROR_NOT_SUPPORTED)
 *
 * No file (or no variable) reads as a host whose driver is not loaded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define MAX_PROCS 256
#define TEXT 128

typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24))

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

struct gpu {
    char name[TEXT], uuid[TEXT];
    unsigned long long total_mib, used_mib;
    unsigned int util, mem_util;
    int cc_major, cc_minor;
    nvmlReturn_t error;
};

struct proc {
    unsigned int gpu, pid, sm_util;
    unsigned long long used_mib;
};

struct state {
    char driver[TEXT];
    nvmlReturn_t init_error, per_process;
    unsigned int count, procs;
    struct gpu gpus[MAX_GPUS];
    struct proc proc[MAX_PROCS];
};

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

static struct nvmlDevice_st devices[MAX_GPUS];
static int initialized;
static long init_calls, shutdown_calls, handle_calls;

static char *next_field(char **cursor) {
    char *field = strsep(cursor, "\t");
    return field ? field : "";
}

static void copy_text(char *dest, const char *src) {
    snprintf(dest, TEXT, "%s", src);
}

/* Reads the state file; returns NVML_SUCCESS or the error that nvmlInit should give. */
static nvmlReturn_t read_state(struct state *st) {
    memset(st, 0, sizeof(*st));
    copy_text(st->driver, "550.54.15");
    const char *path = getenv("GPUFLOW_NVML_STUB_STATE");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    char line[1024];
    while (fgets(line, sizeof(line), file)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *cursor = line;
        char *kind = next_field(&cursor);
        if (strcmp(kind, "driver") == 0) {
            copy_text(st->driver, next_field(&cursor));
        } else if (strcmp(kind, "init_error") == 0) {
            st->init_error = atoi(next_field(&cursor));
        } else if (strcmp(kind, "gpu") == 0 && st->count < MAX_GPUS) {
            struct gpu *g = &st->gpus[st->count++];
            copy_text(g->name, next_field(&cursor));
            copy_text(g->uuid, next_field(&cursor));
            g->total_mib = strtoull(next_field(&cursor), NULL, 10);
            g->used_mib = strtoull(next_field(&cursor), NULL, 10);
            g->util = (unsigned int)strtoul(next_field(&cursor), NULL, 10);
            g->mem_util = (unsigned int)strtoul(next_field(&cursor), NULL, 10);
            g->cc_major = atoi(next_field(&cursor));
            g->cc_minor = atoi(next_field(&cursor));
            g->error = atoi(next_field(&cursor));
        } else if (strcmp(kind, "proc") == 0 && st->procs < MAX_PROCS) {
            struct proc *p = &st->proc[st->procs++];
            p->gpu = (unsigned int)strtoul(next_field(&cursor), NULL, 10);
            p->pid = (unsigned int)strtoul(next_field(&cursor), NULL, 10);
            p->sm_util = (unsigned int)strtoul(next_field(&cursor), NULL, 10);
            p->used_mib = strtoull(next_field(&cursor), NULL, 10);
        } else if (strcmp(kind, "per_process") == 0) {
            st->per_process = atoi(next_field(&cursor));
        }
    }
    fclose(file);
    return st->init_error;
}

/* The GPU behind a handle, after the checks every device call makes. */
static nvmlReturn_t device(nvmlDevice_t handle, struct state *st, struct gpu **out) {
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (handle < devices || handle >= devices + MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = read_state(st);
    if (ret != NVML_SUCCESS)
        return ret;
    if (handle->index >= st->count)
        return NVML_ERROR_GPU_IS_LOST; /* the GPU went away after its handle was taken */
    *out = &st->gpus[handle->index];
    return (*out)->error;
}

static nvmlReturn_t put_text(char *dest, unsigned int length, const char *text) {
    if (!dest)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dest, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    struct state st;
    init_calls++;
    nvmlReturn_t ret = read_state(&st);
    if (ret == NVML_SUCCESS)
        initialized++;
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    shutdown_calls++;
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    initialized--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    struct state st;
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t ret = read_state(&st);
    return ret != NVML_SUCCESS ? ret : put_text(version, length, st.driver);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    struct state st;
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = read_state(&st);
    if (ret == NVML_SUCCESS)
        *count = st.count;
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *handle) {
    struct state st;
    handle_calls++;
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!handle)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = read_state(&st);
    if (ret != NVML_SUCCESS)
        return ret;
    if (index >= st.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (st.gpus[index].error != NVML_SUCCESS)
        return st.gpus[index].error;
    devices[index].index = index;
    *handle = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *handle) {
    return nvmlDeviceGetHandleByIndex_v2(index, handle);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t handle, unsigned int *index) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret == NVML_SUCCESS)
        *index = handle->index;
    return ret;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t handle, char *name, unsigned int length) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    return ret != NVML_SUCCESS ? ret : put_text(name, length, g->name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t handle, char *uuid, unsigned int length) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    return ret != NVML_SUCCESS ? ret : put_text(uuid, length, g->uuid);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t handle, nvmlMemory_t *memory) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    memory->total = g->total_mib << 20;
    memory->used = g->used_mib << 20;
    memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t handle, nvmlMemory_v2_t *memory) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (memory->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = g->total_mib << 20;
    memory->used = g->used_mib << 20;
    memory->reserved = 0;
    memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t handle, nvmlUtilization_t *rates) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    rates->gpu = g->util;
    rates->memory = g->mem_util;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t handle, int *major, int *minor) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

/* The compute processes on the GPU, as NVML lists them: with no buffer, how many (and
 * NVML_ERROR_INSUFFICIENT_SIZE if there are any). */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t handle, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    struct state st;
    struct gpu *g;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (st.per_process != NVML_SUCCESS)
        return st.per_process;
    unsigned int found = 0;
    for (unsigned int i = 0; i < st.procs; i++) {
        if (st.proc[i].gpu != handle->index)
            continue;
        if (infos && found < *count) {
            infos[found].pid = st.proc[i].pid;
            infos[found].usedGpuMemory = st.proc[i].used_mib << 20;
            infos[found].gpuInstanceId = infos[found].computeInstanceId = 0xFFFFFFFF;
        }
        found++;
    }
    unsigned int room = *count;
    *count = found;
    return found > room || (!infos && found) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* One sample per process that used the GPU's SMs (none: NVML_ERROR_NOT_FOUND, as NVML says
 * when no process was busy since `last_seen`). */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t handle,
                                             nvmlProcessUtilizationSample_t *samples,
                                             unsigned int *count, unsigned long long last_seen) {
    struct state st;
    struct gpu *g;
    struct timeval now;
    nvmlReturn_t ret = device(handle, &st, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (st.per_process != NVML_SUCCESS)
        return st.per_process;
    gettimeofday(&now, NULL);
    unsigned long long stamp = (unsigned long long)now.tv_sec * 1000000ull + now.tv_usec;
    unsigned int found = 0;
    for (unsigned int i = 0; i < st.procs; i++) {
        if (st.proc[i].gpu != handle->index || st.proc[i].sm_util == 0 || stamp <= last_seen)
            continue;
        if (samples && found < *count) {
            memset(&samples[found], 0, sizeof(samples[found]));
            samples[found].pid = st.proc[i].pid;
            samples[found].timeStamp = stamp;
            samples[found].smUtil = st.proc[i].sm_util;
        }
        found++;
    }
    if (found == 0)
        return NVML_ERROR_NOT_FOUND;
    unsigned int room = *count;
    *count = found;
    return !samples || found > room ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}

/* Not NVML: counters a test reads through ctypes to check how the library was used. */
long gpuflow_stub_init_calls(void) { return init_calls; }
long gpuflow_stub_shutdown_calls(void) { return shutdown_calls; }
long gpuflow_stub_handle_calls(void) { return handle_calls; }
