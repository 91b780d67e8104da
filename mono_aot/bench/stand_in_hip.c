/*
 * Stand-in libamdhip64 for tests on machines with no AMD GPU (and no HIP runtime).
 *
 * It is the only stand-in in the test suite and exists because the hardware is not here: it
 * implements the few HIP entry points mono_aot.runtime binds, validates what the real driver
 * would (module bytes are an AMDGPU ELF, a launch uses a function of a loaded module, the kernarg
 * buffer's size is passed), simulates device memory with POSIX shared memory (so IPC handles
 * work across processes) and records every call as one JSON line.
 *
 * Environment:
 *   MONO_AOT_STANDIN_LOG        append the call records to this file
 *   MONO_AOT_STANDIN_ARCH       gcnArchName reported (default gfx942:sramecc+:xnack-)
 *   MONO_AOT_STANDIN_CUS        CU count reported (default 304)
 *   MONO_AOT_STANDIN_OCCUPANCY  resident workgroups per CU reported (default 1)
 *   MONO_AOT_STANDIN_DEVICE     the current device at start (default 0)
 *   MONO_AOT_STANDIN_FAIL       comma-separated HIP function names that return an error
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int hipError_t;
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorInvalidDevicePointer = 17,
    hipErrorInvalidImage = 200,
    hipErrorInvalidHandle = 400,
    hipErrorNotFound = 500,
    hipErrorLaunchFailure = 719,
};

/* Offsets in hipDeviceProp_tR0600 (hip_runtime_api.h): multiProcessorCount, gcnArchName. */
#define PROP_MPC_OFFSET 388
#define PROP_GCN_OFFSET 1160
#define ATTR_MULTIPROCESSOR_COUNT 63
#define POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define EM_AMDGPU 224

typedef struct { char reserved[64]; } hipIpcMemHandle_t;

static int current_device = -1;

static int device_now(void) {
    if (current_device < 0) {
        const char *d = getenv("MONO_AOT_STANDIN_DEVICE");
        current_device = d ? atoi(d) : 0;
    }
    return current_device;
}

static void record(const char *fmt, ...) {
    const char *path = getenv("MONO_AOT_STANDIN_LOG");
    if (!path) return;
    char line[1 << 16];
    int n = snprintf(line, sizeof line, "{\"pid\": %d, ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof line - n - 2, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 3) n = sizeof line - 3;
    line[n++] = '}';
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, n); /* one O_APPEND write per line: lines never interleave */
    (void)w;
    close(fd);
}

static int fails(const char *name) {
    const char *list = getenv("MONO_AOT_STANDIN_FAIL");
    if (!list) return 0;
    size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += len) {
        int start = p == list || p[-1] == ',';
        int end = p[len] == '\0' || p[len] == ',';
        if (start && end) return 1;
    }
    return 0;
}

#define FAIL_IF_ASKED(name, code)                                      \
    do {                                                               \
        if (fails(name)) {                                             \
            record("\"call\": \"%s\", \"injected_error\": %d", name, code); \
            return code;                                               \
        }                                                              \
    } while (0)

const char *hipGetErrorName(hipError_t e) {
    switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorInvalidDevicePointer: return "hipErrorInvalidDevicePointer";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorNotFound: return "hipErrorNotFound";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    default: return "hipErrorUnknown";
    }
}

const char *hipGetErrorString(hipError_t e) {
    switch (e) {
    case hipSuccess: return "no error";
    case hipErrorInvalidValue: return "invalid argument (stand-in)";
    case hipErrorOutOfMemory: return "out of memory (stand-in)";
    case hipErrorInvalidDevicePointer: return "invalid device pointer (stand-in)";
    case hipErrorInvalidImage: return "device kernel image is invalid (stand-in)";
    case hipErrorInvalidHandle: return "invalid resource handle (stand-in)";
    case hipErrorNotFound: return "named symbol not found (stand-in)";
    default: return "unknown error (stand-in)";
    }
}

hipError_t hipGetDevice(int *dev) {
    FAIL_IF_ASKED("hipGetDevice", hipErrorInvalidValue);
    *dev = device_now();
    return hipSuccess;
}

hipError_t hipSetDevice(int dev) {
    FAIL_IF_ASKED("hipSetDevice", hipErrorInvalidValue);
    if (dev < 0) return hipErrorInvalidValue;
    current_device = dev;
    record("\"call\": \"hipSetDevice\", \"device\": %d", dev);
    return hipSuccess;
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

hipError_t hipDeviceGetAttribute(int *out, int attr, int dev) {
    FAIL_IF_ASKED("hipDeviceGetAttribute", hipErrorInvalidValue);
    if (dev < 0) return hipErrorInvalidValue;
    if (attr != ATTR_MULTIPROCESSOR_COUNT) return hipErrorInvalidValue;
    *out = env_int("MONO_AOT_STANDIN_CUS", 304);
    return hipSuccess;
}

hipError_t hipGetDevicePropertiesR0600(void *prop, int dev) {
    FAIL_IF_ASKED("hipGetDevicePropertiesR0600", hipErrorInvalidValue);
    if (dev < 0 || !prop) return hipErrorInvalidValue;
    memset(prop, 0, PROP_GCN_OFFSET + 256);
    const char *arch = getenv("MONO_AOT_STANDIN_ARCH");
    strncpy((char *)prop + PROP_GCN_OFFSET, arch ? arch : "gfx942:sramecc+:xnack-", 255);
    strncpy((char *)prop, "stand-in HIP device", 255);
    int cus = env_int("MONO_AOT_STANDIN_CUS", 304);
    memcpy((char *)prop + PROP_MPC_OFFSET, &cus, sizeof cus);
    return hipSuccess;
}

hipError_t hipPointerGetAttribute(void *data, int attr, void *ptr) {
    FAIL_IF_ASKED("hipPointerGetAttribute", hipErrorInvalidValue);
    if (!ptr || !data) return hipErrorInvalidValue;
    if (attr != POINTER_ATTRIBUTE_DEVICE_ORDINAL) return hipErrorInvalidValue;
    *(int *)data = device_now();
    return hipSuccess;
}

hipError_t hipStreamQuery(void *stream) {
    FAIL_IF_ASKED("hipStreamQuery", hipErrorInvalidHandle);
    (void)stream;
    return hipSuccess;
}

/* ---- modules ---- */

#define MAX_MODULES 64
#define MAX_FUNCS 256

typedef struct {
    unsigned char *image;
    size_t size;
    int live;
} module_t;

typedef struct {
    int module;
    char name[256];
} func_t;

static module_t modules[MAX_MODULES];
static func_t funcs[MAX_FUNCS];
static int n_modules, n_funcs;

/* The ELF's extent from its header (the driver gets a pointer only, as here). */
static size_t elf_size(const unsigned char *p) {
    uint64_t shoff, phoff;
    uint16_t shentsize, shnum, phentsize, phnum;
    memcpy(&phoff, p + 32, 8);
    memcpy(&shoff, p + 40, 8);
    memcpy(&phentsize, p + 54, 2);
    memcpy(&phnum, p + 56, 2);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    size_t a = shoff + (size_t)shentsize * shnum, b = phoff + (size_t)phentsize * phnum;
    return a > b ? a : b;
}

hipError_t hipModuleLoadData(void **module, const void *image) {
    FAIL_IF_ASKED("hipModuleLoadData", hipErrorInvalidImage);
    const unsigned char *p = image;
    if (!module || !p) return hipErrorInvalidValue;
    uint16_t machine;
    uint32_t flags;
    memcpy(&machine, p + 18, 2);
    memcpy(&flags, p + 48, 4);
    if (memcmp(p, "\x7f" "ELF", 4) != 0 || p[4] != 2 || machine != EM_AMDGPU) {
        record("\"call\": \"hipModuleLoadData\", \"error\": \"not an AMDGPU ELF64\"");
        return hipErrorInvalidImage;
    }
    if (n_modules == MAX_MODULES) return hipErrorOutOfMemory;
    size_t size = elf_size(p);
    module_t *m = &modules[n_modules];
    m->image = malloc(size);
    memcpy(m->image, p, size);
    m->size = size;
    m->live = 1;
    *module = (void *)(intptr_t)(n_modules + 1);
    record("\"call\": \"hipModuleLoadData\", \"module\": %d, \"size\": %zu, \"e_flags\": %u, "
           "\"device\": %d",
           n_modules + 1, size, flags, device_now());
    n_modules++;
    return hipSuccess;
}

static module_t *module_of(void *handle) {
    intptr_t i = (intptr_t)handle - 1;
    if (i < 0 || i >= n_modules || !modules[i].live) return NULL;
    return &modules[i];
}

hipError_t hipModuleGetFunction(void **func, void *module, const char *name) {
    FAIL_IF_ASKED("hipModuleGetFunction", hipErrorNotFound);
    module_t *m = module_of(module);
    if (!m) return hipErrorInvalidHandle;
    size_t len = strlen(name);
    /* the symbol must be in the image's string table, NUL-terminated */
    const unsigned char *hit = m->image;
    size_t left = m->size;
    int found = 0;
    while ((hit = memmem(hit, left, name, len + 1)) != NULL) {
        if (hit > m->image && hit[-1] == '\0') { found = 1; break; }
        hit++;
        left = m->size - (size_t)(hit - m->image);
    }
    if (!found || n_funcs == MAX_FUNCS) return hipErrorNotFound;
    funcs[n_funcs].module = (int)(intptr_t)module;
    strncpy(funcs[n_funcs].name, name, 255);
    *func = (void *)(intptr_t)(n_funcs + 1);
    n_funcs++;
    record("\"call\": \"hipModuleGetFunction\", \"module\": %d, \"name\": \"%s\"",
           (int)(intptr_t)module, name);
    return hipSuccess;
}

static func_t *func_of(void *handle) {
    intptr_t i = (intptr_t)handle - 1;
    if (i < 0 || i >= n_funcs) return NULL;
    if (!module_of((void *)(intptr_t)funcs[i].module)) return NULL;
    return &funcs[i];
}

hipError_t hipModuleUnload(void *module) {
    FAIL_IF_ASKED("hipModuleUnload", hipErrorInvalidHandle);
    module_t *m = module_of(module);
    if (!m) return hipErrorInvalidHandle;
    m->live = 0;
    free(m->image);
    m->image = NULL;
    record("\"call\": \"hipModuleUnload\", \"module\": %d", (int)(intptr_t)module);
    return hipSuccess;
}

hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *f, int block,
                                                              size_t lds) {
    FAIL_IF_ASKED("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", hipErrorInvalidValue);
    if (!func_of(f) || block <= 0) return hipErrorInvalidValue;
    *blocks = env_int("MONO_AOT_STANDIN_OCCUPANCY", 1);
    record("\"call\": \"hipModuleOccupancyMaxActiveBlocksPerMultiprocessor\", \"block\": %d, "
           "\"lds\": %zu",
           block, lds);
    return hipSuccess;
}

#define PARAM_BUFFER_POINTER ((void *)0x01)
#define PARAM_BUFFER_SIZE ((void *)0x02)
#define PARAM_END ((void *)0x03)

hipError_t hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned lds, void *stream,
                                 void **params, void **extra) {
    FAIL_IF_ASKED("hipModuleLaunchKernel", hipErrorLaunchFailure);
    func_t *fn = func_of(f);
    if (!fn) return hipErrorInvalidHandle;
    if (params || !extra) return hipErrorInvalidValue; /* the runtime passes a kernarg buffer */
    if (extra[0] != PARAM_BUFFER_POINTER || extra[2] != PARAM_BUFFER_SIZE || extra[4] != PARAM_END)
        return hipErrorInvalidValue;
    const unsigned char *buf = extra[1];
    size_t size = *(size_t *)extra[3];
    if (!buf || size == 0 || size > 4096) return hipErrorInvalidValue;
    char hex[8193];
    for (size_t i = 0; i < size; i++) sprintf(hex + 2 * i, "%02x", buf[i]);
    hex[2 * size] = '\0';
    record("\"call\": \"hipModuleLaunchKernel\", \"function\": \"%s\", \"grid\": [%u, %u, %u], "
           "\"block\": [%u, %u, %u], \"lds\": %u, \"stream\": %llu, \"kernarg_size\": %zu, "
           "\"kernargs\": \"%s\", \"device\": %d",
           fn->name, gx, gy, gz, bx, by, bz, lds, (unsigned long long)(uintptr_t)stream, size,
           hex, device_now());
    return hipSuccess;
}

/* ---- memory: shared-memory objects, so IPC handles open in other processes ---- */

#define MAX_ALLOCS 256

typedef struct {
    void *ptr;
    size_t size;
    char name[64];
    int owned; /* allocated here (else opened through IPC) */
} alloc_t;

static alloc_t allocs[MAX_ALLOCS];
static unsigned alloc_serial;

static alloc_t *alloc_of(const void *p) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].ptr && allocs[i].ptr == p) return &allocs[i];
    return NULL;
}

static alloc_t *alloc_containing(const void *p, size_t n) {
    for (int i = 0; i < MAX_ALLOCS; i++) {
        const char *b = allocs[i].ptr;
        if (b && (const char *)p >= b && (const char *)p + n <= b + allocs[i].size) return &allocs[i];
    }
    return NULL;
}

static alloc_t *free_slot(void) {
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (!allocs[i].ptr) return &allocs[i];
    return NULL;
}

hipError_t hipExtMallocWithFlags(void **ptr, size_t size, unsigned flags) {
    FAIL_IF_ASKED("hipExtMallocWithFlags", hipErrorOutOfMemory);
    alloc_t *a = free_slot();
    if (!ptr || size == 0 || !a) return hipErrorInvalidValue;
    snprintf(a->name, sizeof a->name, "/mono-aot-stand-in-%d-%u", (int)getpid(), alloc_serial++);
    int fd = shm_open(a->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return hipErrorOutOfMemory;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        shm_unlink(a->name);
        return hipErrorOutOfMemory;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(a->name);
        return hipErrorOutOfMemory;
    }
    /* fresh device memory is not zeroed: make that visible */
    memset(p, 0xA5, size);
    a->ptr = p;
    a->size = size;
    a->owned = 1;
    *ptr = p;
    record("\"call\": \"hipExtMallocWithFlags\", \"size\": %zu, \"flags\": %u, \"ptr\": %llu, "
           "\"device\": %d",
           size, flags, (unsigned long long)(uintptr_t)p, device_now());
    return hipSuccess;
}

hipError_t hipMemset(void *p, int value, size_t size) {
    FAIL_IF_ASKED("hipMemset", hipErrorInvalidValue);
    if (!alloc_containing(p, size)) return hipErrorInvalidDevicePointer;
    memset(p, value, size);
    record("\"call\": \"hipMemset\", \"ptr\": %llu, \"value\": %d, \"size\": %zu",
           (unsigned long long)(uintptr_t)p, value, size);
    return hipSuccess;
}

hipError_t hipFree(void *p) {
    FAIL_IF_ASKED("hipFree", hipErrorInvalidDevicePointer);
    alloc_t *a = alloc_of(p);
    if (!a || !a->owned) return hipErrorInvalidDevicePointer;
    munmap(a->ptr, a->size);
    shm_unlink(a->name);
    record("\"call\": \"hipFree\", \"ptr\": %llu", (unsigned long long)(uintptr_t)p);
    memset(a, 0, sizeof *a);
    return hipSuccess;
}

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *handle, void *p) {
    FAIL_IF_ASKED("hipIpcGetMemHandle", hipErrorInvalidValue);
    alloc_t *a = alloc_of(p);
    if (!a || !a->owned || !handle) return hipErrorInvalidDevicePointer;
    memset(handle, 0, sizeof *handle);
    uint64_t size = a->size;
    memcpy(handle->reserved, &size, 8);
    strncpy(handle->reserved + 8, a->name, 55);
    record("\"call\": \"hipIpcGetMemHandle\", \"ptr\": %llu", (unsigned long long)(uintptr_t)p);
    return hipSuccess;
}

hipError_t hipIpcOpenMemHandle(void **ptr, hipIpcMemHandle_t handle, unsigned flags) {
    FAIL_IF_ASKED("hipIpcOpenMemHandle", hipErrorInvalidHandle);
    uint64_t size;
    char name[56] = {0};
    memcpy(&size, handle.reserved, 8);
    memcpy(name, handle.reserved + 8, 55);
    alloc_t *a = free_slot();
    if (!ptr || !a || name[0] != '/') return hipErrorInvalidHandle;
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return hipErrorInvalidHandle;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return hipErrorInvalidHandle;
    a->ptr = p;
    a->size = size;
    a->owned = 0;
    strncpy(a->name, name, sizeof a->name - 1);
    *ptr = p;
    record("\"call\": \"hipIpcOpenMemHandle\", \"name\": \"%s\", \"flags\": %u, \"ptr\": %llu",
           name, flags, (unsigned long long)(uintptr_t)p);
    return hipSuccess;
}

hipError_t hipIpcCloseMemHandle(void *p) {
    FAIL_IF_ASKED("hipIpcCloseMemHandle", hipErrorInvalidValue);
    alloc_t *a = alloc_of(p);
    if (!a || a->owned) return hipErrorInvalidValue;
    munmap(a->ptr, a->size);
    record("\"call\": \"hipIpcCloseMemHandle\", \"ptr\": %llu", (unsigned long long)(uintptr_t)p);
    memset(a, 0, sizeof *a);
    return hipSuccess;
}

hipError_t hipDeviceSynchronize(void) { return hipSuccess; }

/* ---- streams with a CU mask (the GPU selftest's late-dispatch check) ---- */

#define MAX_STREAMS 16

static int stream_live[MAX_STREAMS];

/* Handles are small fake addresses, never 0 (the null stream). */
#define STREAM_BASE 0x5000

hipError_t hipExtStreamCreateWithCUMask(void **stream, uint32_t count, const uint32_t *mask) {
    FAIL_IF_ASKED("hipExtStreamCreateWithCUMask", hipErrorInvalidValue);
    if (!stream || !mask || count == 0 || count > 64) return hipErrorInvalidValue;
    int any = 0;
    char words[64 * 12 + 1];
    int n = 0;
    for (uint32_t i = 0; i < count; i++) {
        any |= mask[i] != 0;
        n += snprintf(words + n, sizeof words - n, "%s%u", i ? ", " : "", mask[i]);
    }
    if (!any) return hipErrorInvalidValue; /* a queue with no CU would never run anything */
    for (int s = 0; s < MAX_STREAMS; s++) {
        if (!stream_live[s]) {
            stream_live[s] = 1;
            *stream = (void *)(uintptr_t)(STREAM_BASE + s);
            record("\"call\": \"hipExtStreamCreateWithCUMask\", \"mask\": [%s], \"stream\": %d, "
                   "\"device\": %d",
                   words, STREAM_BASE + s, device_now());
            return hipSuccess;
        }
    }
    return hipErrorOutOfMemory;
}

hipError_t hipStreamDestroy(void *stream) {
    FAIL_IF_ASKED("hipStreamDestroy", hipErrorInvalidHandle);
    uintptr_t s = (uintptr_t)stream;
    if (s < STREAM_BASE || s >= STREAM_BASE + MAX_STREAMS || !stream_live[s - STREAM_BASE])
        return hipErrorInvalidHandle;
    stream_live[s - STREAM_BASE] = 0;
    record("\"call\": \"hipStreamDestroy\", \"stream\": %llu", (unsigned long long)s);
    return hipSuccess;
}
