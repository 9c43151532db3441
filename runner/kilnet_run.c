/* kilnet_run: run an exported kilnet bundle (model.export / `kilnet export`) without Python.
 *
 *   kilnet_run BUNDLE forward INPUTS.bin OUTPUTS.bin
 *   kilnet_run BUNDLE train INPUTS.bin TARGETS.bin OUTDIR
 *
 * INPUTS.bin: every input of the plan for the whole batch, in plan order, raw little-endian
 * values of the bundle's dtype; OUTPUTS.bin: every output likewise. In train mode INPUTS.bin and
 * TARGETS.bin may hold several batches one after the other: one train step per batch. Each step
 * prints "step T loss L"; OUTDIR gets the updated arena files (param.bin, state.bin, moment*.bin,
 * the same layout as the bundle's), loss.txt (one loss per step) and step.txt (steps taken in
 * all). The device: KILNET_RUN_DEVICE=P:D (platform, device), else the first GPU, else the first
 * device. It reads plan.txt (the line-oriented twin of plan.json) and kernels.cl.
 * `kilnet_run --about` says which OpenCL declarations it was built with and which loader it opens.
 *
 * Build: cc -std=c99 -O2 -o kilnet_run runner/kilnet_run.c -ldl -lm
 * It needs no OpenCL headers or library to build: it opens the OpenCL ICD loader when it runs
 * (KILNET_OPENCL_LIBRARY names one, else libOpenCL.so.1, else libOpenCL.so; pyopencl's wheel
 * carries one in pyopencl/.libs), and declares the 14 functions it calls itself. Where the
 * compiler finds <CL/cl.h>, it takes the types from there and checks its declarations against
 * the header's prototypes (-DKILNET_OWN_CL ignores the header).
 * Exit status 0 on success, 1 on any error (a message on stderr), 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L     /* setenv, opendir, stat under -std=c99 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <sys/stat.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- the OpenCL API, opened at run time ------------------------------------------------------ */
#if !defined(KILNET_OWN_CL) && defined(__has_include)
#if __has_include(<CL/cl.h>)
#define CL_TARGET_OPENCL_VERSION 120
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#define KL_SYSTEM_CL 1
#endif
#endif
#ifndef KL_SYSTEM_CL
#include <stdint.h>
/* The types and constants of the Khronos headers (cl_platform.h, cl.h) that this file uses. */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef intptr_t cl_context_properties;
typedef cl_uint cl_program_build_info;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;
#define CL_SUCCESS 0
#define CL_TRUE 1
#define CL_DEVICE_TYPE_GPU (1 << 2)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFF
#define CL_MEM_READ_WRITE (1 << 0)
#define CL_PROGRAM_BUILD_LOG 0x1183
#endif

/* Every OpenCL function the runner calls: (return type, name, parameter types). */
#define KL_CL_FUNCTIONS(X) \
    X(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *)) \
    X(cl_int, clGetDeviceIDs, (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *)) \
    X(cl_context, clCreateContext, (const cl_context_properties *, cl_uint, const cl_device_id *, \
      void (*)(const char *, const void *, size_t, void *), void *, cl_int *)) \
    X(cl_command_queue, clCreateCommandQueue, (cl_context, cl_device_id, cl_command_queue_properties, cl_int *)) \
    X(cl_mem, clCreateBuffer, (cl_context, cl_mem_flags, size_t, void *, cl_int *)) \
    X(cl_program, clCreateProgramWithSource, (cl_context, cl_uint, const char **, const size_t *, cl_int *)) \
    X(cl_int, clBuildProgram, (cl_program, cl_uint, const cl_device_id *, const char *, \
      void (*)(cl_program, void *), void *)) \
    X(cl_int, clGetProgramBuildInfo, (cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *)) \
    X(cl_kernel, clCreateKernel, (cl_program, const char *, cl_int *)) \
    X(cl_int, clSetKernelArg, (cl_kernel, cl_uint, size_t, const void *)) \
    X(cl_int, clEnqueueNDRangeKernel, (cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, \
      const size_t *, cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueReadBuffer, (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint, \
      const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueWriteBuffer, (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint, \
      const cl_event *, cl_event *)) \
    X(cl_int, clFinish, (cl_command_queue))

#define KL_POINTER(ret, name, params) static ret (*kl_##name) params;
KL_CL_FUNCTIONS(KL_POINTER)
#ifdef KL_SYSTEM_CL
/* Each declaration above has the type of the header's prototype (a mismatch does not build). */
#define KL_SAME(ret, name, params) \
    typedef char kl_same_##name[__builtin_types_compatible_p(__typeof__(kl_##name), __typeof__(&name)) ? 1 : -1];
KL_CL_FUNCTIONS(KL_SAME)
#define KL_HEADERS "the system's <CL/cl.h>, each declaration checked against it"
#else
#define KL_HEADERS "its own (no <CL/cl.h> found)"
#endif
#define clGetPlatformIDs kl_clGetPlatformIDs
#define clGetDeviceIDs kl_clGetDeviceIDs
#define clCreateContext kl_clCreateContext
#define clCreateCommandQueue kl_clCreateCommandQueue
#define clCreateBuffer kl_clCreateBuffer
#define clCreateProgramWithSource kl_clCreateProgramWithSource
#define clBuildProgram kl_clBuildProgram
#define clGetProgramBuildInfo kl_clGetProgramBuildInfo
#define clCreateKernel kl_clCreateKernel
#define clSetKernelArg kl_clSetKernelArg
#define clEnqueueNDRangeKernel kl_clEnqueueNDRangeKernel
#define clEnqueueReadBuffer kl_clEnqueueReadBuffer
#define clEnqueueWriteBuffer kl_clEnqueueWriteBuffer
#define clFinish kl_clFinish

static const char *const kl_loaders[] = {"libOpenCL.so.1", "libOpenCL.so"};
static const char *loader_name = "(none)";

/* The drivers kilnet registers from PyPI (Intel's CPU runtime) are listed in a folder that
   `import kilnet` makes: <cache>/icd/<hash>/, holding the system's .icd files too. Where
   OCL_ICD_VENDORS is unset, point it at the newest such folder, before the loader first reads it,
   so that a bundle runs as the README shows it. The cache: KILNET_CACHE_DIR, else
   $XDG_CACHE_HOME/kilnet, else ~/.cache/kilnet (as runtime/program.py). */
static char kilnet_vendors[4096];
static void find_kilnet_vendors(void) {
    const char *set = getenv("OCL_ICD_VENDORS"), *dir = getenv("KILNET_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char root[3072], path[4096]; DIR *d; struct dirent *e; struct stat st; time_t best = 0;
    if (set && *set) return;
    if (dir && *dir) snprintf(root, sizeof root, "%s/icd", dir);
    else if (xdg && *xdg) snprintf(root, sizeof root, "%s/kilnet/icd", xdg);
    else if (home && *home) snprintf(root, sizeof root, "%s/.cache/kilnet/icd", home);
    else return;
    if (!(d = opendir(root))) return;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (stat(path, &st) || !S_ISDIR(st.st_mode) || st.st_mtime < best) continue;
        best = st.st_mtime; snprintf(kilnet_vendors, sizeof kilnet_vendors, "%s", path);
    }
    closedir(d);
    if (kilnet_vendors[0]) setenv("OCL_ICD_VENDORS", kilnet_vendors, 1);
}

/* Open the ICD loader and find every function; returns the loader's name, or NULL with *why. */
static const char *open_opencl(char *why, size_t size) {
    const char *named = getenv("KILNET_OPENCL_LIBRARY"), *tried[3];
    void *lib = NULL; size_t i, n = 0;
    if (named && *named) tried[n++] = named;
    else for (i = 0; i < sizeof kl_loaders / sizeof *kl_loaders; i++) tried[n++] = kl_loaders[i];
    for (i = 0; i < n && !lib; i++) lib = dlopen(tried[i], RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        snprintf(why, size, "cannot open the OpenCL ICD loader %s%s (%s); name one with "
                 "KILNET_OPENCL_LIBRARY (pyopencl's wheel carries one in pyopencl/.libs)",
                 tried[0], n > 1 ? " or libOpenCL.so" : "", dlerror());
        return NULL;
    }
#define KL_FIND(ret, name, params) \
    if (!(*(void **)&kl_##name = dlsym(lib, #name))) { \
        snprintf(why, size, "the OpenCL loader %s has no %s", tried[i - 1], #name); return NULL; }
    KL_CL_FUNCTIONS(KL_FIND)
    return tried[i - 1];
}

#define FORMAT_VERSION 1
#define NAME 256

typedef struct { size_t elements; char file[NAME], role[NAME]; cl_mem mem; } Arena;
typedef struct { int slot, is_arena; unsigned long value; } Arg;
typedef struct { int kernel, dims, nargs; size_t g[3], l[3]; Arg *args; char name[NAME]; cl_kernel k; } Launch;
typedef struct { int arena; size_t offset, count; char name[NAME]; } Region;
typedef struct { char name[NAME]; int n; int *seq; } Call;

static const char *bundle;
static FILE *pf;
static char tok[4096];
static int item;                                   /* bytes per element: 4 or 8 */
static char source[NAME], opt[NAME];
static int narenas, nkernels, nlaunches, nio[3], nloss, ncalls, scal_arena = -1;
static Arena *arenas; static char (*kernels)[NAME]; static Launch *launches;
static Region *io[3], *loss; static Call calls[4];
static size_t batch, scal_offset; static double lr, b1, b2; static unsigned long step0;

static void die(const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "kilnet_run: "); vfprintf(stderr, fmt, ap); fputc('\n', stderr);
    va_end(ap); exit(1);
}
static void die_cl(cl_int code, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "kilnet_run: "); vfprintf(stderr, fmt, ap); fprintf(stderr, " (OpenCL error %d)\n", code);
    va_end(ap); exit(1);
}
#define CHECK(call, ...) do { cl_int e_ = (call); if (e_ != CL_SUCCESS) die_cl(e_, __VA_ARGS__); } while (0)

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory (%lu x %lu bytes)", (unsigned long)n, (unsigned long)size);
    return p;
}

/* -- plan.txt: whitespace-separated tokens, records start with a keyword ------------------- */
static const char *next(void) {
    if (fscanf(pf, "%4095s", tok) != 1) die("bundle %s: plan.txt ends early (truncated?)", bundle);
    return tok;
}
static void expect(const char *kw) {
    if (strcmp(next(), kw)) die("bundle %s: plan.txt is malformed: expected '%s', found '%.60s'",
                                bundle, kw, tok);
}
static unsigned long num(const char *what, unsigned long max) {
    char *end; unsigned long v;
    next(); errno = 0; v = strtoul(tok, &end, 10);
    if (tok[0] == '-' || *end || errno || v > max)
        die("bundle %s: plan.txt is malformed: %s '%.60s' is not a whole number <= %lu",
            bundle, what, tok, max);
    return v;
}
static double real(const char *what) {
    char *end; double v; next(); errno = 0; v = strtod(tok, &end);
    if (*end || errno) die("bundle %s: plan.txt is malformed: %s '%.60s' is not a number", bundle, what, tok);
    return v;
}
static void name(char *dst) {
    next(); if (strlen(tok) >= NAME) die("bundle %s: plan.txt: name too long: %.60s...", bundle, tok);
    strcpy(dst, tok);
}
static void region(Region *r, const char *what) {
    r->arena = (int)num(what, (unsigned long)narenas - 1);
    r->offset = num(what, 0xFFFFFFFFul); r->count = num(what, 0xFFFFFFFFul); name(r->name);
    if (r->offset + r->count > arenas[r->arena].elements)
        die("bundle %s: plan.txt: %s %s [%lu, %lu) lies outside arena %s (%lu elements)", bundle,
            what, r->name, (unsigned long)r->offset, (unsigned long)(r->offset + r->count),
            arenas[r->arena].role, (unsigned long)arenas[r->arena].elements);
}

static void load_plan(void) {
    char path[4096]; int i, j, a;
    snprintf(path, sizeof path, "%s/plan.txt", bundle);
    if (!(pf = fopen(path, "r"))) die("bundle %s: cannot open plan.txt (%s)", bundle, strerror(errno));
    if (strcmp(next(), "kilnet-bundle")) die("bundle %s: plan.txt is not a kilnet bundle plan", bundle);
    i = (int)num("format version", 1000000);
    if (i > FORMAT_VERSION) die("bundle %s: format version %d is newer than this runner reads (%d); "
                                "rebuild kilnet_run from the kilnet that exported it", bundle, i, FORMAT_VERSION);
    if (i < 1) die("bundle %s: format version %d is not valid", bundle, i);
    expect("dtype"); next();
    if (!strcmp(tok, "float32")) item = 4; else if (!strcmp(tok, "float64")) item = 8;
    else die("bundle %s: plan.txt: unknown dtype '%.60s'", bundle, tok);
    expect("batch"); batch = num("batch", 1ul << 30);
    expect("source"); name(source);
    expect("arenas"); narenas = (int)num("arena count", 64); arenas = xcalloc(narenas, sizeof *arenas);
    for (i = 0; i < narenas; i++) {
        expect("arena"); arenas[i].elements = num("arena elements", 0xFFFFFFFFul);
        name(arenas[i].file); name(arenas[i].role);
        if (strchr(arenas[i].file, '/') || strchr(arenas[i].file, '\\'))
            die("bundle %s: plan.txt: file name %s must not contain a path", bundle, arenas[i].file);
    }
    expect("kernels"); nkernels = (int)num("kernel count", 100000); kernels = xcalloc(nkernels, NAME);
    for (i = 0; i < nkernels; i++) { expect("kernel"); name(kernels[i]); }
    expect("launches"); nlaunches = (int)num("launch count", 1000000);
    launches = xcalloc(nlaunches, sizeof *launches);
    for (i = 0; i < nlaunches; i++) {
        Launch *L = &launches[i];
        expect("launch"); L->kernel = (int)num("kernel index", (unsigned long)nkernels - 1);
        L->dims = (int)num("dimensions", 3);
        if (L->dims < 1) die("bundle %s: plan.txt: launch %d has 0 dimensions", bundle, i);
        for (j = 0; j < 3; j++) L->g[j] = num("global size", 0xFFFFFFFFul);
        for (j = 0; j < 3; j++) L->l[j] = num("local size", 0xFFFFFFFFul);
        L->nargs = (int)num("argument count", 1024); name(L->name);
        L->args = xcalloc(L->nargs, sizeof *L->args);
        for (a = 0; a < L->nargs; a++) {
            expect("arg"); L->args[a].slot = (int)num("slot", 1023); next();
            if (!strcmp(tok, "arena")) {
                L->args[a].is_arena = 1; L->args[a].value = num("arena index", (unsigned long)narenas - 1);
            } else if (!strcmp(tok, "uint")) {
                L->args[a].value = num("uint argument", 0xFFFFFFFFul);
            } else die("bundle %s: plan.txt: launch %s: unknown argument kind '%.60s'", bundle, L->name, tok);
        }
    }
    {
        static const char *kinds[3] = {"input", "target", "output"};
        char plural[32];
        for (j = 0; j < 3; j++) {
            snprintf(plural, sizeof plural, "%ss", kinds[j]); expect(plural);
            nio[j] = (int)num("count", 1024); io[j] = xcalloc(nio[j], sizeof(Region));
            for (i = 0; i < nio[j]; i++) { expect(kinds[j]); region(&io[j][i], kinds[j]); }
        }
    }
    expect("losses"); nloss = (int)num("loss count", 1024); loss = xcalloc(nloss, sizeof *loss);
    for (i = 0; i < nloss; i++) {
        expect("loss"); loss[i].arena = (int)num("loss arena", (unsigned long)narenas - 1);
        loss[i].offset = num("loss offset", 0xFFFFFFFFul); loss[i].count = num("loss count", 0xFFFFFFFFul);
        strcpy(loss[i].name, "loss");
        if (loss[i].offset + loss[i].count > arenas[loss[i].arena].elements)
            die("bundle %s: plan.txt: a loss part lies outside its arena", bundle);
    }
    expect("scalars"); next();
    if (strcmp(tok, "-1")) {
        char *end; scal_arena = (int)strtol(tok, &end, 10);
        if (*end || scal_arena < 0 || scal_arena >= narenas) die("bundle %s: plan.txt: bad scalars arena '%.60s'", bundle, tok);
    }
    scal_offset = num("scalars offset", 0xFFFFFFFFul); name(opt);
    lr = real("lr"); b1 = real("b1"); b2 = real("b2"); step0 = num("step", 0xFFFFFFFFul);
    if (scal_arena >= 0 && scal_offset + 4 > arenas[scal_arena].elements)
        die("bundle %s: plan.txt: the step scalars lie outside their arena", bundle);
    if (scal_arena >= 0 && strcmp(opt, "adam") && strcmp(opt, "sgd"))
        die("bundle %s: plan.txt: unknown optimizer '%s'", bundle, opt);
    for (ncalls = 0; strcmp(next(), "end"); ncalls++) {
        Call *c = &calls[ncalls];
        if (strcmp(tok, "call") || ncalls == 4) die("bundle %s: plan.txt is malformed: expected 'call' or 'end', found '%.60s'", bundle, tok);
        name(c->name); c->n = (int)num("call length", 1000000); c->seq = xcalloc(c->n, sizeof(int));
        for (i = 0; i < c->n; i++) c->seq[i] = (int)num("launch index", (unsigned long)nlaunches - 1);
    }
    fclose(pf);
}

/* -- files -------------------------------------------------------------------------------- */
static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb"); char *data; long n = 0;
    if (!f) die("cannot open %s (%s)", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) die("cannot read %s", path);
    data = xcalloc((size_t)n + 1, 1);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", path);
    fclose(f); *size = (size_t)n; return data;
}
static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) die("cannot write %s (%s)", path, strerror(errno));
}

/* -- OpenCL ------------------------------------------------------------------------------- */
static cl_device_id pick_device(void) {
    cl_platform_id ps[16]; cl_device_id ds[16]; cl_uint np = 0, nd, p; const char *want = getenv("KILNET_RUN_DEVICE");
    if (clGetPlatformIDs(16, ps, &np) != CL_SUCCESS || np == 0) {
        const char *vendors = getenv("OCL_ICD_VENDORS");
        die("the OpenCL loader %s found no driver (OCL_ICD_VENDORS=%s). Point OCL_ICD_VENDORS at a "
            "folder of .icd files naming the drivers; for the CPU runtimes kilnet installs, the "
            "folder kilnet makes: export OCL_ICD_VENDORS=$(python -c 'import kilnet, os; "
            "print(os.environ[\"OCL_ICD_VENDORS\"])')", loader_name,
            vendors && *vendors ? vendors : "(unset: /etc/OpenCL/vendors)");
    }
    if (want && *want) {
        unsigned pi, di;
        if (sscanf(want, "%u:%u", &pi, &di) != 2) die("KILNET_RUN_DEVICE must be P:D (platform:device), got %s", want);
        if (pi >= np || clGetDeviceIDs(ps[pi], CL_DEVICE_TYPE_ALL, 16, ds, &nd) != CL_SUCCESS || di >= nd)
            die("KILNET_RUN_DEVICE=%s: no such device", want);
        return ds[di];
    }
    for (p = 0; p < np; p++)
        if (clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_GPU, 1, ds, &nd) == CL_SUCCESS && nd) return ds[0];
    for (p = 0; p < np; p++)
        if (clGetDeviceIDs(ps[p], CL_DEVICE_TYPE_ALL, 1, ds, &nd) == CL_SUCCESS && nd) return ds[0];
    die("OpenCL reports no device"); return 0;
}

static cl_command_queue queue;

static void run_call(const char *which) {
    int c, i;
    for (c = 0; c < ncalls && strcmp(calls[c].name, which); c++) {}
    if (c == ncalls) die("bundle %s has no %s call (export it with train=True / --train)", bundle, which);
    for (i = 0; i < calls[c].n; i++) {
        Launch *L = &launches[calls[c].seq[i]];
        CHECK(clEnqueueNDRangeKernel(queue, L->k, (cl_uint)L->dims, NULL, L->g, L->l[0] ? L->l : NULL, 0, NULL, NULL),
              "enqueue of launch %s", L->name);
    }
}
static void transfer(Region *r, char *host, int write) {
    Arena *A = &arenas[r->arena];
    if (write) CHECK(clEnqueueWriteBuffer(queue, A->mem, CL_TRUE, r->offset * item, r->count * item, host, 0, NULL, NULL), "write of %s", r->name);
    else CHECK(clEnqueueReadBuffer(queue, A->mem, CL_TRUE, r->offset * item, r->count * item, host, 0, NULL, NULL), "read of %s", r->name);
}
static size_t io_bytes(int j) { size_t n = 0; int i; for (i = 0; i < nio[j]; i++) n += io[j][i].count * item; return n; }
static char *read_batches(const char *path, int j, size_t *nbatch) {
    size_t size, per = io_bytes(j); char *data = read_file(path, &size);
    if (!per || !size || size % per) die("%s has %lu bytes; it must hold whole batches of %lu bytes (%s of batch %lu)",
                                         path, (unsigned long)size, (unsigned long)per, j ? "targets" : "inputs", (unsigned long)batch);
    *nbatch = size / per; return data;
}
static void upload(char *data, int j) { int i; for (i = 0; i < nio[j]; i++) { transfer(&io[j][i], data, 1); data += io[j][i].count * item; } }

int main(int argc, char **argv) {
    cl_device_id dev; cl_context ctx; cl_program prog; cl_int err; char path[4096], *src; size_t n; int i, a;
    const char *loader;
    if (argc == 2 && !strcmp(argv[1], "--about")) {
        find_kilnet_vendors();
        loader = open_opencl(path, sizeof path);
        printf("kilnet_run: OpenCL declarations: %s; loader: %s; drivers: %s\n", KL_HEADERS,
               loader ? loader : path, kilnet_vendors[0] ? kilnet_vendors :
               getenv("OCL_ICD_VENDORS") ? getenv("OCL_ICD_VENDORS") : "/etc/OpenCL/vendors");
        return loader ? 0 : 1;
    }
    if (argc < 3 || !((!strcmp(argv[2], "forward") && argc == 5) || (!strcmp(argv[2], "train") && argc == 6))) {
        fprintf(stderr, "usage: kilnet_run BUNDLE forward INPUTS.bin OUTPUTS.bin\n"
                        "       kilnet_run BUNDLE train INPUTS.bin TARGETS.bin OUTDIR\n");
        return 2;
    }
    bundle = argv[1];
    load_plan();
    find_kilnet_vendors();
    if (!(loader_name = open_opencl(path, sizeof path))) die("%s", path);
    dev = pick_device();
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err, "cannot create a context");
    queue = clCreateCommandQueue(ctx, dev, 0, &err); CHECK(err, "cannot create a command queue");
    snprintf(path, sizeof path, "%s/%s", bundle, source);
    src = read_file(path, &n);
    prog = clCreateProgramWithSource(ctx, 1, (const char **)&src, &n, &err); CHECK(err, "cannot create the program");
    if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
        char log[16384] = ""; clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
        die("%s does not build on this device:\n%s", path, log);
    }
    for (i = 0; i < narenas; i++) {
        Arena *A = &arenas[i]; char *data; size_t size = A->elements * item;
        A->mem = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size ? size : (size_t)item, NULL, &err);
        CHECK(err, "cannot allocate arena %s (%lu bytes)", A->role, (unsigned long)size);
        if (strcmp(A->file, "-")) {
            snprintf(path, sizeof path, "%s/%s", bundle, A->file);
            data = read_file(path, &n);
            if (n != size) die("bundle %s: %s has %lu bytes; arena %s needs %lu", bundle, A->file,
                               (unsigned long)n, A->role, (unsigned long)size);
        } else data = xcalloc(size, 1);
        if (size) CHECK(clEnqueueWriteBuffer(queue, A->mem, CL_TRUE, 0, size, data, 0, NULL, NULL), "write of arena %s", A->role);
        free(data);
    }
    for (i = 0; i < nlaunches; i++) {      /* one kernel object per launch, arguments set once */
        Launch *L = &launches[i];
        L->k = clCreateKernel(prog, kernels[L->kernel], &err); CHECK(err, "no kernel %s in %s", kernels[L->kernel], source);
        for (a = 0; a < L->nargs; a++) {
            Arg *g = &L->args[a]; cl_uint v = (cl_uint)g->value;
            if (g->is_arena) CHECK(clSetKernelArg(L->k, g->slot, sizeof(cl_mem), &arenas[g->value].mem), "launch %s: slot %d", L->name, g->slot);
            else CHECK(clSetKernelArg(L->k, g->slot, sizeof v, &v), "launch %s: slot %d", L->name, g->slot);
        }
    }
    if (!strcmp(argv[2], "forward")) {
        size_t k; char *in = read_batches(argv[3], 0, &k), *out = xcalloc(io_bytes(2), 1), *p = out;
        if (k != 1) die("%s holds %lu batches; forward takes one", argv[3], (unsigned long)k);
        upload(in, 0);
        run_call("forward");
        for (i = 0; i < nio[2]; i++) { transfer(&io[2][i], p, 0); p += io[2][i].count * item; }
        write_file(argv[4], out, io_bytes(2));
    } else {
        size_t k, kt, s; char *in, *tg; FILE *lf; unsigned long t = step0;
        if (scal_arena < 0) die("bundle %s has no train_step (export it with train=True / --train)", bundle);
        in = read_batches(argv[3], 0, &k); tg = read_batches(argv[4], 1, &kt);
        if (k != kt) die("%s holds %lu batches but %s holds %lu", argv[3], (unsigned long)k, argv[4], (unsigned long)kt);
        snprintf(path, sizeof path, "%s/loss.txt", argv[5]);
        if (!(lf = fopen(path, "w"))) die("cannot write %s (%s): does OUTDIR exist?", path, strerror(errno));
        for (s = 0; s < k; s++) {
            double v[4] = {lr, 0, 0, 0}, sum = 0; float f[4]; char buf[32]; Region r; size_t e;
            t++;
            if (!strcmp(opt, "adam")) { v[1] = 1.0 - pow(b1, (double)t); v[2] = 1.0 - pow(b2, (double)t); }
            for (i = 0; i < 4; i++) f[i] = (float)v[i];
            r.arena = scal_arena; r.offset = scal_offset; r.count = 4; strcpy(r.name, "step scalars");
            memcpy(buf, item == 4 ? (void *)f : (void *)v, 4 * item); transfer(&r, buf, 1);
            upload(in + s * io_bytes(0), 0); upload(tg + s * io_bytes(1), 1);
            run_call("train_step");
            for (i = 0; i < nloss; i++) {
                char *part = xcalloc(loss[i].count, item); transfer(&loss[i], part, 0);
                for (e = 0; e < loss[i].count; e++) sum += item == 4 ? (double)((float *)part)[e] : ((double *)part)[e];
                free(part);
            }
            printf("step %lu loss %.9g\n", t, sum); fprintf(lf, "%.17g\n", sum);
        }
        fclose(lf);
        for (i = 0; i < narenas; i++) {
            Arena *A = &arenas[i]; Region r; char *data;
            if (!strcmp(A->file, "-")) continue;
            data = xcalloc(A->elements, item);
            r.arena = i; r.offset = 0; r.count = A->elements; strcpy(r.name, A->role); transfer(&r, data, 0);
            snprintf(path, sizeof path, "%s/%s", argv[5], A->file); write_file(path, data, A->elements * item);
            free(data);
        }
        snprintf(path, sizeof path, "%s/step.txt", argv[5]);
        if (!(lf = fopen(path, "w")) || fprintf(lf, "%lu\n", t) < 0 || fclose(lf)) die("cannot write %s", path);
    }
    clFinish(queue);
    return 0;
}
