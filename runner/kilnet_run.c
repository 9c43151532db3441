/* kilnet_run: run an exported kilnet bundle (model.export / `kilnet export`) without Python.
 *
 *   kilnet_run BUNDLE forward INPUTS.bin OUTPUTS.bin
 *   kilnet_run BUNDLE train INPUTS.bin TARGETS.bin OUTDIR
 *
 * INPUTS.bin: every input of the plan for the whole batch, in plan order, raw little-endian
 * values of the bundle's dtype; OUTPUTS.bin: every output likewise. In train mode INPUTS.bin and
 * TARGETS.bin may hold several batches one after the other: one train step per batch (a bundle
 * whose losses are written in the graph, g.loss, has no targets: its targets are inputs, and
 * TARGETS.bin is then - or an empty file). Each step
 * prints "step T loss L"; OUTDIR gets the updated arena files (param.bin, state.bin, moment*.bin,
 * the same layout as the bundle's), loss.txt (one loss per step) and step.txt (steps taken in
 * all). `--from DIR` starts from a folder that train wrote (its arena files; train also its step.txt) instead
 * of the bundle's files, so training resumes where it stopped (Adam's step count included) and
 * forward runs the trained parameters. `-v` says which device runs it and where the program
 * came from. The device: KILNET_RUN_DEVICE=P:D (platform, device), else the first GPU, else the
 * first device. It reads plan.txt (the line-oriented twin of plan.json) and kernels.cl.
 * `kilnet_run --about` says which OpenCL declarations it was built with and which loader it opens;
 * `kilnet_run --sha256 FILE...` prints the SHA-256 of each file as sha256sum does.
 *
 * Before any device work it checks the bundle: plan.txt's seal (the SHA-256 of the text before
 * its last line), the size and SHA-256 of every other file it lists (kernels.cl, the .bin files
 * and plan.json), and every launch against its arenas: each arena argument's offset plus the
 * extent its kernel may touch lies inside the arena, each global size is at least 1 and each
 * local size divides it. A built program is kept in BUNDLE/.kilnet_run-cache/, one file per
 * device and driver with the SHA-256 of its contents, and loaded from there by later runs.
 *
 * Build: cc -std=c99 -O2 -o kilnet_run runner/kilnet_run.c -ldl -lm
 * For Windows (x86-64): python -m ziglang cc -target x86_64-windows-gnu -std=c99 -O2
 *   -o kilnet_run.exe runner/kilnet_run.c (or MinGW-w64's gcc; tests/test_runner_windows.py builds
 *   it so and runs it under Wine on Intel's Windows CPU runtime).
 * It needs no OpenCL headers or library to build: it opens the OpenCL ICD loader when it runs
 * (KILNET_OPENCL_LIBRARY names one, else libOpenCL.so.1, else libOpenCL.so, on Windows
 * OpenCL.dll; else the one `import kilnet` recorded: pyopencl's wheel carries one in
 * pyopencl/.libs, on Windows pyopencl.libs\opencl-*.dll), and declares the 18 functions it calls
 * itself. Where the compiler finds <CL/cl.h>, it takes the types from there and checks its
 * declarations against the header's prototypes (-DKILNET_OWN_CL ignores the header).
 * Exit status 0 on success, 1 on any error (a message on stderr), 2 on bad usage.
 */
/* -- the platform: POSIX (dlopen), or Windows (LoadLibraryExA) ------------------------------ */
#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#include <direct.h>                 /* _mkdir */
#include <process.h>                /* _getpid */
#else
#define _POSIX_C_SOURCE 200809L     /* setenv, opendir, stat, mkdir, getpid, fseeko under -std=c99 */
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>
#endif
#include <errno.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The few calls that differ. Sizes of files are 64-bit on both (int64_t offsets; Windows' long
   is 32 bits). */
#ifdef _WIN32
#define KL_SEP "\\"
typedef HMODULE kl_library;
/* A path (absolute, so that LOAD_WITH_ALTERED_SEARCH_PATH applies): the DLLs it needs are looked
   for in its own folder first (pyopencl.libs holds its loader's); a bare name (OpenCL.dll): the
   system's search order. */
static kl_library kl_open(const char *name) {
    char full[4096]; DWORD n;
    if (!strchr(name, '/') && !strchr(name, '\\')) return LoadLibraryExA(name, NULL, 0);
    n = GetFullPathNameA(name, sizeof full, full, NULL);
    if (n == 0 || n >= sizeof full) return LoadLibraryExA(name, NULL, 0);
    return LoadLibraryExA(full, NULL, LOAD_WITH_ALTERED_SEARCH_PATH);
}
static char kl_error_text[512];
static const char *kl_open_error(void) {
    DWORD code = GetLastError(), n;
    n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, NULL, code, 0,
                       kl_error_text, sizeof kl_error_text, NULL);
    while (n && (kl_error_text[n - 1] == '\n' || kl_error_text[n - 1] == '\r' || kl_error_text[n - 1] == ' '))
        kl_error_text[--n] = 0;
    if (!n) snprintf(kl_error_text, sizeof kl_error_text, "Windows error %lu", (unsigned long)code);
    return kl_error_text;
}
static void kl_setenv(const char *name, const char *value) { _putenv_s(name, value); }
static int kl_mkdir(const char *path) { return _mkdir(path); }
static long kl_pid(void) { return (long)_getpid(); }
static int kl_is_folder(const char *path) {
    DWORD a = GetFileAttributesA(path);
    return a != INVALID_FILE_ATTRIBUTES && (a & FILE_ATTRIBUTE_DIRECTORY);
}
/* "C:\..." or "C:/...", or a UNC path "\\server\..." */
static int kl_is_absolute(const char *path) {
    return (((path[0] | 32) >= 'a' && (path[0] | 32) <= 'z') && path[1] == ':' &&
            (path[2] == '\\' || path[2] == '/')) || ((path[0] == '\\' || path[0] == '/') &&
            (path[1] == '\\' || path[1] == '/'));
}
/* rename() fails onto an existing file on Windows: MoveFileExA replaces it. Another process
   that has the file open without FILE_SHARE_DELETE (an antivirus scan, an indexer) makes it fail
   for a moment: try again for up to about a second. */
static int kl_replace(const char *from, const char *to) {
    int tries;
    for (tries = 0; tries < 20; tries++) {
        DWORD code;
        if (MoveFileExA(from, to, MOVEFILE_REPLACE_EXISTING)) return 0;
        code = GetLastError();
        if (code != ERROR_ACCESS_DENIED && code != ERROR_SHARING_VIOLATION && code != ERROR_LOCK_VIOLATION) {
            errno = code == ERROR_PATH_NOT_FOUND || code == ERROR_FILE_NOT_FOUND ? ENOENT : EIO;
            return -1;
        }
        Sleep(50);
    }
    errno = EACCES;
    return -1;
}
#define kl_seek _fseeki64
#define kl_tell _ftelli64
#else
#define KL_SEP "/"
typedef void *kl_library;
static kl_library kl_open(const char *name) { return dlopen(name, RTLD_NOW | RTLD_GLOBAL); }
static const char *kl_open_error(void) { return dlerror(); }
static void kl_setenv(const char *name, const char *value) { setenv(name, value, 1); }
static int kl_mkdir(const char *path) { return mkdir(path, 0777); }
static long kl_pid(void) { return (long)getpid(); }
static int kl_is_folder(const char *path) { struct stat st; return !stat(path, &st) && S_ISDIR(st.st_mode); }
static int kl_is_absolute(const char *path) { return path[0] == '/'; }
static int kl_replace(const char *from, const char *to) { return rename(from, to); }
#define kl_seek fseeko
#define kl_tell ftello
#endif

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
typedef cl_uint cl_program_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_platform_info;
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
#define CL_PROGRAM_BINARY_SIZES 0x1165
#define CL_PROGRAM_BINARIES 0x1166
#define CL_DEVICE_NAME 0x102B
#define CL_DEVICE_VERSION 0x102F
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_PLATFORM 0x1031
#define CL_PLATFORM_NAME 0x0902
#define CL_PLATFORM_VERSION 0x0901
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
    X(cl_int, clFinish, (cl_command_queue)) \
    X(cl_int, clGetDeviceInfo, (cl_device_id, cl_device_info, size_t, void *, size_t *)) \
    X(cl_int, clGetPlatformInfo, (cl_platform_id, cl_platform_info, size_t, void *, size_t *)) \
    X(cl_int, clGetProgramInfo, (cl_program, cl_program_info, size_t, void *, size_t *)) \
    X(cl_program, clCreateProgramWithBinary, (cl_context, cl_uint, const cl_device_id *, const size_t *, \
      const unsigned char **, cl_int *, cl_int *))

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
#define clGetDeviceInfo kl_clGetDeviceInfo
#define clGetPlatformInfo kl_clGetPlatformInfo
#define clGetProgramInfo kl_clGetProgramInfo
#define clCreateProgramWithBinary kl_clCreateProgramWithBinary

/* The system's loader names; a build may name others (the tests build one as on a machine that
   has none: -DKL_SYSTEM_LOADERS='"libOpenCL-absent.so.1"'). */
#ifndef KL_SYSTEM_LOADERS
#ifdef _WIN32
#define KL_SYSTEM_LOADERS "OpenCL.dll"
#else
#define KL_SYSTEM_LOADERS "libOpenCL.so.1", "libOpenCL.so"
#endif
#endif
static const char *const kl_loaders[] = {KL_SYSTEM_LOADERS};
static const char *loader_name = "(none)";
#ifdef _WIN32
#define KL_PYOPENCL_LIBS "pyopencl.libs"
#else
#define KL_PYOPENCL_LIBS "pyopencl/.libs"
#endif

/* kilnet's cache folder into out (empty where no variable says one), found as kilnet/settings.py
   finds it (keep the two the same): KILNET_CACHE_DIR, else $XDG_CACHE_HOME/kilnet, else (Windows)
   %LOCALAPPDATA%\kilnet, else ~/.cache/kilnet, ~ being $HOME (on Windows %USERPROFILE%). */
static void kilnet_cache(char *out, size_t size) {
    const char *dir = getenv("KILNET_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
#ifdef _WIN32
    const char *local = getenv("LOCALAPPDATA"), *home = getenv("USERPROFILE");
#else
    const char *home = getenv("HOME");
#endif
    out[0] = 0;
    if (dir && *dir) snprintf(out, size, "%s", dir);
    else if (xdg && *xdg) snprintf(out, size, "%s" KL_SEP "kilnet", xdg);
#ifdef _WIN32
    else if (local && *local) snprintf(out, size, "%s" KL_SEP "kilnet", local);
#endif
    else if (home && *home) snprintf(out, size, "%s" KL_SEP ".cache" KL_SEP "kilnet", home);
}

/* What the runner itself pointed the loader at (for --about): a vendors folder (OCL_ICD_VENDORS),
   on Windows a DLL (OCL_ICD_FILENAMES); empty where it set nothing. */
static char kilnet_vendors[4096];
#ifndef _WIN32
/* The drivers kilnet registers from PyPI (Intel's CPU runtime) are listed in a folder that
   `import kilnet` makes: <cache>/icd/<hash>/, holding the system's .icd files too. Where
   OCL_ICD_VENDORS is unset, point it at the newest such folder, before the loader first reads it,
   so that a bundle runs as the docs show it. */
static void find_kilnet_vendors(void) {
    const char *set = getenv("OCL_ICD_VENDORS");
    char cache[3000], root[3072], path[4096]; DIR *d; struct dirent *e; struct stat st;
    time_t best = 0;
    if (set && *set) return;
    kilnet_cache(cache, sizeof cache);
    if (!cache[0]) return;
    snprintf(root, sizeof root, "%s/icd", cache);
    if (!(d = opendir(root))) return;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        if (stat(path, &st) || !S_ISDIR(st.st_mode) || st.st_mtime < best) continue;
        best = st.st_mtime; snprintf(kilnet_vendors, sizeof kilnet_vendors, "%s", path);
    }
    closedir(d);
    if (kilnet_vendors[0]) kl_setenv("OCL_ICD_VENDORS", kilnet_vendors);
}

/* pyopencl's wheel carries an ICD loader (pyopencl/.libs/libOpenCL-*.so*) patched to read the
   .icd files beside it from $PYOPENCL_HOME/.libs, which `import pyopencl` sets; its __initClIcd
   copies the variable without checking it is set, so from a shell it crashes at the first OpenCL
   call. Where the loader named lies in such a .libs folder and PYOPENCL_HOME is unset, set it to
   that folder's parent, as pyopencl would. */
static char pyopencl_home[4096];
static void prepare_loader(const char *loader) {
    const char *home = getenv("PYOPENCL_HOME"), *slash = strrchr(loader, '/');
    size_t dir;
    if ((home && *home) || !slash) return;
    dir = (size_t)(slash - loader);
    if (dir < 6 || dir >= sizeof pyopencl_home || strncmp(slash - 6, "/.libs", 6)) return;
    memcpy(pyopencl_home, loader, dir - 6);
    pyopencl_home[dir - 6] = 0;
    if (!pyopencl_home[0]) strcpy(pyopencl_home, "/");
    kl_setenv("PYOPENCL_HOME", pyopencl_home);
}
#define KL_DRIVERS_VARIABLE "OCL_ICD_VENDORS"
#define KL_DRIVERS_DEFAULT "/etc/OpenCL/vendors"
#else
/* Windows: no vendors folder and no PYOPENCL_HOME. The Khronos loader (OpenCL.dll, and
   pyopencl.libs\opencl-*.dll, which is the same loader) reads the drivers from
   HKLM\SOFTWARE\Khronos\OpenCL\Vendors, where GPU drivers register themselves and `kilnet
   devices --register` (as administrator) registers Intel's CPU runtime, and, only in a process
   that is not elevated, from OCL_ICD_FILENAMES (DLL paths, ';'-separated), which `import kilnet`
   sets for the processes it starts. */
static void find_kilnet_vendors(void) {}
/* Where OCL_ICD_FILENAMES is unset and the loader named is pyopencl's (<site-packages>\
   pyopencl.libs\opencl-*.dll), name Intel's CPU runtime in it where pip put it beside:
   <site-packages>\..\..\Library\bin\intelocl64.dll (the data folder of a venv, of a system
   install and of a --user install alike), so that the runner started from a shell that is not
   elevated sees the driver that Python sees. */
static void prepare_loader(const char *loader) {
    const char *set = getenv("OCL_ICD_FILENAMES"), *p;
    char dir[4096], *cut; int up; DWORD a;
    size_t n = strlen(loader);
    if ((set && *set) || n >= sizeof dir) return;
    memcpy(dir, loader, n + 1);
    for (up = 0; up < 4; up++) {        /* the DLL, pyopencl.libs, site-packages, Lib */
        for (cut = dir + strlen(dir); cut > dir && cut[-1] != '\\' && cut[-1] != '/'; cut--) {}
        if (cut == dir) return;
        if (up == 1) {                   /* cut ends <site-packages>\: the folder was pyopencl.libs? */
            p = loader + (cut - dir);
            if (_strnicmp(p, "pyopencl.libs", 13) || (p[13] != '\\' && p[13] != '/')) return;
        }
        cut[-1] = 0;
    }
    snprintf(kilnet_vendors, sizeof kilnet_vendors, "%s\\Library\\bin\\intelocl64.dll", dir);
    a = GetFileAttributesA(kilnet_vendors);
    if (a == INVALID_FILE_ATTRIBUTES || (a & FILE_ATTRIBUTE_DIRECTORY)) { kilnet_vendors[0] = 0; return; }
    kl_setenv("OCL_ICD_FILENAMES", kilnet_vendors);
}
#define KL_DRIVERS_VARIABLE "OCL_ICD_FILENAMES"
#define KL_DRIVERS_DEFAULT "HKLM\\SOFTWARE\\Khronos\\OpenCL\\Vendors"
#endif

/* The loader `import kilnet` recorded (pyopencl's, in <cache>/opencl-loader), or NULL. */
static char recorded_loader[4096];
static const char *kilnet_loader(void) {
    char cache[3000], path[3100]; FILE *f; size_t n;
    kilnet_cache(cache, sizeof cache);
    if (!cache[0]) return NULL;
    snprintf(path, sizeof path, "%s" KL_SEP "opencl-loader", cache);
    if (!(f = fopen(path, "r"))) return NULL;
    n = fread(recorded_loader, 1, sizeof recorded_loader - 1, f);
    fclose(f);
    recorded_loader[n] = 0;
    while (n && (recorded_loader[n - 1] == '\n' || recorded_loader[n - 1] == '\r'))
        recorded_loader[--n] = 0;
    return n && kl_is_absolute(recorded_loader) ? recorded_loader : NULL;
}

/* Open the ICD loader and find every function; returns the loader's name, or NULL with *why.
   KILNET_OPENCL_LIBRARY where set; else the system's; else the one `import kilnet` recorded
   (pyopencl's, on a machine whose OpenCL came from pip alone). */
static const char *open_opencl(char *why, size_t size) {
    const char *named = getenv("KILNET_OPENCL_LIBRARY"), *tried[4], *recorded = NULL;
    kl_library lib = NULL; size_t i, n = 0;
    if (named && *named) {      /* a copy: getenv's text may move once the environment changes */
        char *copy = malloc(strlen(named) + 1);
        if (copy) named = strcpy(copy, named);
        tried[n++] = named; prepare_loader(named);
    }
    else for (i = 0; i < sizeof kl_loaders / sizeof *kl_loaders; i++) tried[n++] = kl_loaders[i];
    for (i = 0; i < n && !lib; i++) lib = kl_open(tried[i]);
    if (!lib && !(named && *named) && (recorded = kilnet_loader())) {
        prepare_loader(recorded);
        tried[n++] = recorded;
        lib = kl_open(recorded);
        i = n;
    }
    if (!lib) {
        snprintf(why, size, "cannot open the OpenCL ICD loader %s%s%s%s (%s); name one with "
                 "KILNET_OPENCL_LIBRARY (pyopencl's wheel carries one in " KL_PYOPENCL_LIBS "; "
                 "`import kilnet` records it in its cache folder for the runner)",
                 tried[0], n > 1 ? " or " : "", n > 1 ? tried[n - 1] : "",
                 named && *named ? "" : recorded ? "" : ", and kilnet's cache records none",
                 kl_open_error());
        return NULL;
    }
#ifdef _WIN32
    /* GetProcAddress's FARPROC into each pointer's own type, without a cast between them */
#define KL_FIND(ret, name, params) { \
        FARPROC f_ = GetProcAddress(lib, #name); \
        if (!f_) { snprintf(why, size, "the OpenCL loader %s has no %s", tried[i - 1], #name); return NULL; } \
        memcpy(&kl_##name, &f_, sizeof f_); }
#else
#define KL_FIND(ret, name, params) \
    if (!(*(void **)&kl_##name = dlsym(lib, #name))) { \
        snprintf(why, size, "the OpenCL loader %s has no %s", tried[i - 1], #name); return NULL; }
#endif
    KL_CL_FUNCTIONS(KL_FIND)
    return tried[i - 1];
}

#define FORMAT_VERSION 4
/* The step scalars before each train step (kilnet/runtime/abi.py, STEP_SCALARS): lr, Adam's two
   bias corrections, 1/ranks, and the step number t as t mod 2^16 and t div 2^16; then each
   further optimizer's three (an optimizer per block: plan.txt's "group" lines). */
#define STEP_SCALARS 6
#define MAX_GROUPS 64
#define NAME 256

/* -- SHA-256 (FIPS 180-4), for the sums plan.txt records and the program cache ------------- */
typedef struct { uint32_t h[8]; uint64_t bytes; unsigned char buf[64]; size_t used; } Sha256;
static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
static void sha_block(Sha256 *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h, t1, t2; int i;
    for (i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++)
        w[i] = w[i - 16] + (ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7]
             + (ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10));
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (i = 0; i < 64; i++) {
        t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}
static void sha_init(Sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0); s->bytes = 0; s->used = 0;
}
static void sha_add(Sha256 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->bytes += n;
    while (n) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->buf + s->used, p, take); s->used += take; p += take; n -= take;
        if (s->used == 64) { sha_block(s, s->buf); s->used = 0; }
    }
}
static void sha_hex(Sha256 *s, char out[65]) {           /* finishes s */
    unsigned char pad[72] = {0x80}, len[8]; uint64_t bits = s->bytes * 8; int i;
    size_t padn = (s->used < 56 ? 56 : 120) - s->used;
    for (i = 0; i < 8; i++) len[i] = (unsigned char)(bits >> (56 - 8 * i));
    sha_add(s, pad, padn); sha_add(s, len, 8);
    for (i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", (unsigned)s->h[i]);
}
static void sha256_hex(const void *data, size_t n, char out[65]) {
    Sha256 s; sha_init(&s); sha_add(&s, data, n); sha_hex(&s, out);
}

typedef struct { size_t elements; char file[NAME], role[NAME]; cl_mem mem; } Arena;
typedef struct { int slot, is_arena, is_real; uint64_t value, extent; double real; char access[8]; } Arg;
typedef struct { int kernel, dims, nargs; size_t g[3], l[3]; Arg *args; char name[NAME]; cl_kernel k; } Launch;
typedef struct { int arena; size_t offset, count; char name[NAME]; } Region;
typedef struct { char name[NAME]; int n; int *seq; } Call;
typedef struct { size_t bytes; char sha[65], name[NAME]; } Sum;

static const char *bundle, *from_dir;
static int verbose;
static char *ptext; static size_t ppos, plen;     /* plan.txt, up to its seal line */
static char tok[4096], seal_hex[65];
static int item;                                   /* bytes per element: 4 or 8 */
static char source[NAME], opt[NAME];
static int narenas, nkernels, nlaunches, nio[3], nloss, ncalls, nsums, scal_arena = -1, nids, *id_input;
static uint64_t *id_bound;
static Arena *arenas; static char (*kernels)[NAME]; static Launch *launches;
static Region *io[3], *loss; static Call calls[4]; static Sum *sums;
static size_t batch, scal_offset; static double lr, b1, b2; static uint64_t step0, every0;
/* the further optimizers: slot in the step scalars, kind ("adam" | "sgd"), lr, b1, b2, and
   every (an optimizer that updates on every N-th step counts its own updates, t / N) */
static int ngroups;
static struct { size_t slot; char kind[NAME]; double lr, b1, b2; uint64_t every; } groups[MAX_GROUPS];

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
static void say(const char *fmt, ...) {
    va_list ap;
    if (!verbose) return;
    va_start(ap, fmt); fprintf(stderr, "kilnet_run: "); vfprintf(stderr, fmt, ap); fputc('\n', stderr); va_end(ap);
}
#define CHECK(call, ...) do { cl_int e_ = (call); if (e_ != CL_SUCCESS) die_cl(e_, __VA_ARGS__); } while (0)

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory (%" PRIu64 " x %" PRIu64 " bytes)", (uint64_t)n, (uint64_t)size);
    return p;
}

/* -- files -------------------------------------------------------------------------------- */
/* The whole file, with a 0 after it; NULL (errno set) when it cannot be read. */
static char *try_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb"); char *data; int64_t n = 0;
    if (!f) return NULL;
    if (kl_seek(f, 0, SEEK_END) || (n = (int64_t)kl_tell(f)) < 0 || kl_seek(f, 0, SEEK_SET)) { fclose(f); return NULL; }
    if ((uint64_t)n >= (uint64_t)SIZE_MAX) { fclose(f); errno = EFBIG; return NULL; }
    data = xcalloc((size_t)n + 1, 1);
    if (fread(data, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(data); errno = EIO; return NULL; }
    fclose(f); *size = (size_t)n; return data;
}
static char *read_file(const char *path, size_t *size) {
    char *data = try_read_file(path, size);
    if (!data) die("cannot read %s (%s)", path, strerror(errno));
    return data;
}
/* Written whole or not at all: a temporary file beside it, renamed onto it (kl_replace). */
static int try_write_file(const char *path, const void *data, size_t size) {
    char tmp[4200]; FILE *f;
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, kl_pid());
    if (!(f = fopen(tmp, "wb"))) return 0;
    if (fwrite(data, 1, size, f) != size) { fclose(f); remove(tmp); return 0; }
    if (fclose(f) || kl_replace(tmp, path)) { remove(tmp); return 0; }
    return 1;
}
static void write_file(const char *path, const void *data, size_t size) {
    if (!try_write_file(path, data, size)) die("cannot write %s (%s)", path, strerror(errno));
}

/* -- plan.txt: whitespace-separated tokens, records start with a keyword ------------------- */
static const char *next(void) {
    size_t n = 0;
    while (ppos < plen && strchr(" \t\r\n", ptext[ppos])) ppos++;
    if (ppos >= plen) die("bundle %s: plan.txt ends early (truncated?)", bundle);
    while (ppos < plen && !strchr(" \t\r\n", ptext[ppos])) {
        if (n == sizeof tok - 1) die("bundle %s: plan.txt is malformed: a token of over %" PRIu64 " characters",
                                     bundle, (uint64_t)n);
        tok[n++] = ptext[ppos++];
    }
    tok[n] = 0; return tok;
}
static void expect(const char *kw) {
    if (strcmp(next(), kw)) die("bundle %s: plan.txt is malformed: expected '%s', found '%.60s'",
                                bundle, kw, tok);
}
static uint64_t num(const char *what, uint64_t max) {
    char *end; uint64_t v;
    next(); errno = 0; v = strtoull(tok, &end, 10);
    if (tok[0] == '-' || tok[0] == '+' || *end || errno || v > max)
        die("bundle %s: plan.txt is malformed: %s '%.60s' is not a whole number <= %" PRIu64,
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
static void inside(const char *what, const char *which, int arena, uint64_t offset, uint64_t count) {
    if (offset > arenas[arena].elements || count > arenas[arena].elements - offset)
        die("bundle %s: plan.txt: %s %s [%" PRIu64 ", %" PRIu64 ") lies outside arena %s (%" PRIu64 " elements)", bundle,
            what, which, offset, offset + count, arenas[arena].role, (uint64_t)arenas[arena].elements);
}
static void region(Region *r, const char *what) {
    r->arena = (int)num(what, (uint64_t)narenas - 1);
    r->offset = num(what, 0xFFFFFFFFul); r->count = num(what, 0xFFFFFFFFul); name(r->name);
    inside(what, r->name, r->arena, r->offset, r->count);
}
static void is_hex64(const char *s, const char *what) {
    if (strlen(s) != 64 || strspn(s, "0123456789abcdef") != 64)
        die("bundle %s: plan.txt is malformed: %s '%.70s' is not a SHA-256 in hex", bundle, what, s);
}
/* Each argument slot once; each arena argument followed by its uint offset, which with the
   extent the kernel may touch lies inside the arena; sizes that OpenCL runs as planned. */
static void check_launch(Launch *L) {
    int a, b, j;
    for (j = 0; j < L->dims; j++) {
        if (L->g[j] == 0) die("bundle %s: plan.txt: launch %s: global size %" PRIu64 " in dimension %d "
                              "(each must be at least 1)", bundle, L->name, (uint64_t)L->g[j], j);
        if (L->l[0] && (L->l[j] == 0 || L->g[j] % L->l[j]))
            die("bundle %s: plan.txt: launch %s: local size %" PRIu64 " does not divide global size %" PRIu64 " in "
                "dimension %d", bundle, L->name, (uint64_t)L->l[j], (uint64_t)L->g[j], j);
    }
    for (a = 0; a < L->nargs; a++) {
        if (L->args[a].slot >= L->nargs) die("bundle %s: plan.txt: launch %s: slot %d of %d arguments",
                                             bundle, L->name, L->args[a].slot, L->nargs);
        for (b = 0; b < a; b++)
            if (L->args[b].slot == L->args[a].slot)
                die("bundle %s: plan.txt: launch %s: slot %d twice", bundle, L->name, L->args[a].slot);
    }
    for (a = 0; a < L->nargs; a++) {
        Arg *A = &L->args[a], *off = NULL;
        if (!A->is_arena) continue;
        for (b = 0; b < L->nargs; b++) if (L->args[b].slot == A->slot + 1 && !L->args[b].is_arena && !L->args[b].is_real) off = &L->args[b];
        if (!off) die("bundle %s: plan.txt: launch %s: the arena argument in slot %d has no uint offset "
                      "in slot %d", bundle, L->name, A->slot, A->slot + 1);
        {
            char what[NAME + 64];
            snprintf(what, sizeof what, "launch %s slot %d (%s, extent %" PRIu64 ")", L->name, A->slot, A->access, A->extent);
            if (off->value > arenas[A->value].elements || A->extent > arenas[A->value].elements - off->value)
                die("bundle %s: plan.txt: %s: [%" PRIu64 ", %" PRIu64 ") lies outside arena %s (%" PRIu64 " elements)", bundle, what,
                    off->value, off->value + A->extent, arenas[A->value].role, (uint64_t)arenas[A->value].elements);
        }
    }
}

/* plan.txt whole: its header, then its seal (the SHA-256 of every byte before its last line). */
static void open_plan(void) {
    char path[4096], hex[65]; size_t n, last; int v;
    snprintf(path, sizeof path, "%s/plan.txt", bundle);
    if (!(ptext = try_read_file(path, &n))) die("bundle %s: cannot open plan.txt (%s)", bundle, strerror(errno));
    ppos = 0; plen = n;
    if (strcmp(next(), "kilnet-bundle")) die("bundle %s: plan.txt is not a kilnet bundle plan", bundle);
    v = (int)num("format version", 1000000);
    if (v > FORMAT_VERSION) die("bundle %s: format version %d is newer than this runner reads (%d); "
                                "rebuild kilnet_run from the kilnet that exported it", bundle, v, FORMAT_VERSION);
    if (v < FORMAT_VERSION) die("bundle %s: format version %d is older than this runner reads (%d); "
                                "export the model again", bundle, v, FORMAT_VERSION);
    for (last = n >= 2 ? n - 2 : 0; last > 0 && ptext[last - 1] != '\n'; last--) {}
    if (n < 2 || ptext[n - 1] != '\n' || strncmp(ptext + last, "seal ", 5) || n - last != 5 + 64 + 1)
        die("bundle %s: plan.txt is damaged: it does not end with its seal line (truncated?)", bundle);
    memcpy(seal_hex, ptext + last + 5, 64); seal_hex[64] = 0;
    sha256_hex(ptext, last, hex);
    if (strcmp(hex, seal_hex))
        die("bundle %s: plan.txt is damaged: its seal (the SHA-256 on its last line) does not match "
            "the text before it", bundle);
    plen = last;
}

static void load_plan(void) {
    int i, j, a;
    open_plan();
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
        expect("launch"); L->kernel = (int)num("kernel index", (uint64_t)nkernels - 1);
        L->dims = (int)num("dimensions", 3);
        if (L->dims < 1) die("bundle %s: plan.txt: launch %d has 0 dimensions", bundle, i);
        for (j = 0; j < 3; j++) L->g[j] = num("global size", 0xFFFFFFFFul);
        for (j = 0; j < 3; j++) L->l[j] = num("local size", 0xFFFFFFFFul);
        L->nargs = (int)num("argument count", 1024); name(L->name);
        L->args = xcalloc(L->nargs, sizeof *L->args);
        for (a = 0; a < L->nargs; a++) {
            Arg *A = &L->args[a];
            expect("arg"); A->slot = (int)num("slot", 1023); next();
            if (!strcmp(tok, "arena")) {
                A->is_arena = 1; A->value = num("arena index", (uint64_t)narenas - 1);
                next();
                if (strcmp(tok, "in") && strcmp(tok, "out") && strcmp(tok, "inout"))
                    die("bundle %s: plan.txt: launch %s slot %d: access '%.60s' is not in, out or inout",
                        bundle, L->name, A->slot, tok);
                strcpy(A->access, tok);
                A->extent = num("extent", 0xFFFFFFFFul);
            } else if (!strcmp(tok, "uint")) {
                A->value = num("uint argument", 0xFFFFFFFFul);
            } else if (!strcmp(tok, "real")) {     /* a by-value real, in the bundle's dtype */
                char *end; next(); A->is_real = 1; A->real = strtod(tok, &end);
                if (*end || end == tok) die("bundle %s: plan.txt: launch %s slot %d: bad real '%.60s'", bundle, L->name, A->slot, tok);
            } else die("bundle %s: plan.txt: launch %s: unknown argument kind '%.60s'", bundle, L->name, tok);
        }
        check_launch(L);
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
    expect("ids"); nids = (int)num("ids count", 1024);      /* inputs an embedding reads as ids */
    id_input = xcalloc(nids ? nids : 1, sizeof *id_input); id_bound = xcalloc(nids ? nids : 1, sizeof *id_bound);
    for (i = 0; i < nids; i++) {
        expect("id"); id_input[i] = (int)num("ids input", nio[0] ? (uint64_t)nio[0] - 1 : 0);
        id_bound[i] = num("ids bound", 0xFFFFFFFFul);
        if (!nio[0] || !id_bound[i]) die("bundle %s: plan.txt: bad ids record %d", bundle, i);
    }
    expect("losses"); nloss = (int)num("loss count", 1024); loss = xcalloc(nloss, sizeof *loss);
    for (i = 0; i < nloss; i++) {
        expect("loss"); loss[i].arena = (int)num("loss arena", (uint64_t)narenas - 1);
        loss[i].offset = num("loss offset", 0xFFFFFFFFul); loss[i].count = num("loss count", 0xFFFFFFFFul);
        strcpy(loss[i].name, "part");
        inside("loss", loss[i].name, loss[i].arena, loss[i].offset, loss[i].count);
    }
    expect("scalars"); next();
    if (strcmp(tok, "-1")) {
        char *end; scal_arena = (int)strtol(tok, &end, 10);
        if (*end || scal_arena < 0 || scal_arena >= narenas) die("bundle %s: plan.txt: bad scalars arena '%.60s'", bundle, tok);
    }
    scal_offset = num("scalars offset", 0xFFFFFFFFul); name(opt);
    lr = real("lr"); b1 = real("b1"); b2 = real("b2"); every0 = num("every", 65535);
    step0 = num("step", 0xFFFFFFFFul);
    if (!every0) die("bundle %s: plan.txt: the optimizer's every is 0", bundle);
    if (scal_arena >= 0 && strcmp(opt, "adam") && strcmp(opt, "sgd"))
        die("bundle %s: plan.txt: unknown optimizer '%s'", bundle, opt);
    expect("groups"); ngroups = (int)num("group count", MAX_GROUPS);
    for (i = 0; i < ngroups; i++) {
        expect("group");
        groups[i].slot = num("group slot", STEP_SCALARS + 3 * (uint64_t)i);
        if (groups[i].slot != STEP_SCALARS + 3 * (size_t)i) die("bundle %s: plan.txt: group %d at slot %" PRIu64 ", expected %d", bundle, i, (uint64_t)groups[i].slot, STEP_SCALARS + 3 * i);
        name(groups[i].kind);
        if (strcmp(groups[i].kind, "adam") && strcmp(groups[i].kind, "sgd"))
            die("bundle %s: plan.txt: unknown optimizer '%s' in group %d", bundle, groups[i].kind, i);
        groups[i].lr = real("group lr"); groups[i].b1 = real("group b1"); groups[i].b2 = real("group b2");
        groups[i].every = num("group every", 65535);
        if (!groups[i].every) die("bundle %s: plan.txt: group %d's every is 0", bundle, i);
    }
    if (scal_arena >= 0) inside("step scalars", opt, scal_arena, scal_offset, STEP_SCALARS + 3 * (size_t)ngroups);
    for (ncalls = 0; strcmp(next(), "files"); ncalls++) {
        Call *c = &calls[ncalls];
        if (strcmp(tok, "call") || ncalls == 4) die("bundle %s: plan.txt is malformed: expected 'call' or 'files', found '%.60s'", bundle, tok);
        name(c->name); c->n = (int)num("call length", 1000000); c->seq = xcalloc(c->n, sizeof(int));
        for (i = 0; i < c->n; i++) c->seq[i] = (int)num("launch index", (uint64_t)nlaunches - 1);
    }
    nsums = (int)num("file count", 64); sums = xcalloc(nsums, sizeof *sums);
    for (i = 0; i < nsums; i++) {
        expect("file"); sums[i].bytes = num("file size", 0xFFFFFFFFul); next(); is_hex64(tok, "SHA-256");
        strcpy(sums[i].sha, tok); name(sums[i].name);
        if (strchr(sums[i].name, '/') || strchr(sums[i].name, '\\') || !strcmp(sums[i].name, "plan.txt"))
            die("bundle %s: plan.txt: file name %s is not a file of the bundle", bundle, sums[i].name);
    }
    expect("end");
    if (ppos < plen && strspn(ptext + ppos, " \t\r\n") != plen - ppos)
        die("bundle %s: plan.txt is malformed: text after 'end'", bundle);
}

static const Sum *sum_of(const char *file) {
    int i;
    for (i = 0; i < nsums; i++) if (!strcmp(sums[i].name, file)) return &sums[i];
    die("bundle %s: plan.txt records no SHA-256 for %s", bundle, file); return NULL;
}
/* Every file plan.txt lists, whole and unchanged: its size and SHA-256. */
static void check_files(void) {
    char path[4096], hex[65]; size_t n; int i; char *data;
    sum_of(source);
    for (i = 0; i < narenas; i++) if (strcmp(arenas[i].file, "-")) sum_of(arenas[i].file);
    for (i = 0; i < nsums; i++) {
        snprintf(path, sizeof path, "%s/%s", bundle, sums[i].name);
        if (!(data = try_read_file(path, &n))) die("bundle %s: %s is missing or unreadable (%s)", bundle, sums[i].name, strerror(errno));
        if (n != sums[i].bytes) die("bundle %s: %s has %" PRIu64 " bytes; plan.txt says %" PRIu64, bundle, sums[i].name,
                                    (uint64_t)n, (uint64_t)sums[i].bytes);
        sha256_hex(data, n, hex); free(data);
        if (strcmp(hex, sums[i].sha))
            die("bundle %s: %s is damaged (its SHA-256 does not match plan.txt's)%s", bundle, sums[i].name,
                strstr(sums[i].name, ".bin") ? "; to run from trained files, pass --from the folder "
                                               "that train wrote instead of copying them into the bundle" : "");
    }
}

/* -- OpenCL ------------------------------------------------------------------------------- */
static cl_device_id pick_device(void) {
    cl_platform_id ps[16]; cl_device_id ds[16]; cl_uint np = 0, nd, p; const char *want = getenv("KILNET_RUN_DEVICE");
    if (clGetPlatformIDs(16, ps, &np) != CL_SUCCESS || np == 0) {
        const char *vendors = getenv(KL_DRIVERS_VARIABLE);
#ifdef _WIN32
        die("the OpenCL loader %s found no driver (OCL_ICD_FILENAMES=%s). GPU drivers register "
            "themselves under " KL_DRIVERS_DEFAULT "; for Intel's CPU runtime from pip, run "
            "`kilnet devices --register` once as administrator, or (in a process that is not "
            "elevated) name intelocl64.dll in OCL_ICD_FILENAMES: set OCL_ICD_FILENAMES=<the "
            "environment>\\Library\\bin\\intelocl64.dll", loader_name,
            vendors && *vendors ? vendors : "(unset)");
#else
        die("the OpenCL loader %s found no driver (OCL_ICD_VENDORS=%s). Point OCL_ICD_VENDORS at a "
            "folder of .icd files naming the drivers; for the CPU runtimes kilnet installs, the "
            "folder kilnet makes: export OCL_ICD_VENDORS=$(python -c 'import kilnet, os; "
            "print(os.environ[\"OCL_ICD_VENDORS\"])')", loader_name,
            vendors && *vendors ? vendors : "(unset: /etc/OpenCL/vendors)");
#endif
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

/* A device in words, and the identity of its program binaries: platform, device and driver. */
static void info_str(cl_int (*get)(void *, cl_uint, size_t, void *, size_t *), void *obj, cl_uint what,
                     char *out, size_t size) {
    out[0] = 0;
    if (get(obj, what, size - 1, out, NULL) != CL_SUCCESS) strcpy(out, "?");
    out[size - 1] = 0;
}
static cl_int device_info(void *d, cl_uint w, size_t n, void *v, size_t *r) { return clGetDeviceInfo((cl_device_id)d, w, n, v, r); }
static cl_int platform_info(void *p, cl_uint w, size_t n, void *v, size_t *r) { return clGetPlatformInfo((cl_platform_id)p, w, n, v, r); }
static char dev_words[1200], cache_key[65];
static void describe_device(cl_device_id dev) {
    char pname[256], pver[256], dname[256], dver[256], driver[256], ident[1400]; cl_platform_id plat = NULL;
    info_str(device_info, dev, CL_DEVICE_NAME, dname, sizeof dname);
    info_str(device_info, dev, CL_DEVICE_VERSION, dver, sizeof dver);
    info_str(device_info, dev, CL_DRIVER_VERSION, driver, sizeof driver);
    if (clGetDeviceInfo(dev, CL_DEVICE_PLATFORM, sizeof plat, &plat, NULL) != CL_SUCCESS) plat = NULL;
    if (plat) {
        info_str(platform_info, plat, CL_PLATFORM_NAME, pname, sizeof pname);
        info_str(platform_info, plat, CL_PLATFORM_VERSION, pver, sizeof pver);
    } else { strcpy(pname, "?"); strcpy(pver, "?"); }
    snprintf(dev_words, sizeof dev_words, "%s (%s, %s, driver %s)", dname, pname, dver, driver);
    snprintf(ident, sizeof ident, "kilnet_run program 1\n%s\n%s\n%s\n%s\n%s\n%s\n", seal_hex, pname, pver,
             dname, dver, driver);
    sha256_hex(ident, strlen(ident), cache_key);
}

/* The program cache: BUNDLE/.kilnet_run-cache/<key>.bin, key = SHA-256 of the plan's seal (which
   covers kernels.cl's SHA-256), platform, device and driver; the file is a line
   "kilnet-binary <SHA-256 of the binary>" and the binary. Anything wrong with it: built again. */
#define CACHE_DIR ".kilnet_run-cache"
static void cache_path(char *path, size_t size) {
    snprintf(path, size, "%s/" CACHE_DIR "/%s.bin", bundle, cache_key);
}
static cl_program cached_program(cl_context ctx, cl_device_id dev) {
    char path[4096], hex[65]; size_t n, len; char *data; const unsigned char *bin; cl_int err, status;
    cl_program prog;
    cache_path(path, sizeof path);
    if (!(data = try_read_file(path, &n))) { say("no cached program (%s): building %s", path, source); return NULL; }
    if (n < 14 + 64 + 1 || strncmp(data, "kilnet-binary ", 14) || data[14 + 64] != '\n') {
        say("cached program %s is not one: building %s", path, source); free(data); return NULL;
    }
    bin = (const unsigned char *)data + 14 + 64 + 1; len = n - (14 + 64 + 1);
    sha256_hex(bin, len, hex);
    if (strncmp(hex, data + 14, 64)) { say("cached program %s is damaged: building %s", path, source); free(data); return NULL; }
    prog = clCreateProgramWithBinary(ctx, 1, &dev, &len, &bin, &status, &err);
    free(data);
    if (err != CL_SUCCESS || status != CL_SUCCESS) { say("the driver refused cached program %s (%d): building %s", path, (int)err, source); return NULL; }
    if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) { say("cached program %s did not build: building %s", path, source); return NULL; }
    say("program from the cache (%s)", path);
    return prog;
}
static void cache_program(cl_program prog) {
    char path[4096], hex[65], head[14 + 64 + 2]; size_t len = 0; unsigned char *bin; char *file;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) != CL_SUCCESS || !len) {
        say("the driver gives no program binary: nothing cached"); return;
    }
    bin = xcalloc(len, 1);
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS) {
        say("the driver gives no program binary: nothing cached"); free(bin); return;
    }
    sha256_hex(bin, len, hex);
    snprintf(head, sizeof head, "kilnet-binary %s\n", hex);
    file = xcalloc(len + sizeof head, 1);
    memcpy(file, head, 14 + 64 + 1); memcpy(file + 14 + 64 + 1, bin, len);
    snprintf(path, sizeof path, "%s/" CACHE_DIR, bundle);
    kl_mkdir(path);
    cache_path(path, sizeof path);
    if (try_write_file(path, file, len + 14 + 64 + 1)) say("program cached in %s (%" PRIu64 " bytes)", path, (uint64_t)len);
    else say("cannot cache the program in %s (%s)", path, strerror(errno));
    free(file); free(bin);
}

/* --from DIR: the arena files and step.txt of a folder that train wrote. */
static uint64_t from_step(void) {
    char path[4096], *text, *end; size_t n; uint64_t v;
    snprintf(path, sizeof path, "%s/step.txt", from_dir);
    if (!(text = try_read_file(path, &n))) die("--from %s: cannot read step.txt (%s)", from_dir, strerror(errno));
    errno = 0; v = strtoull(text, &end, 10);
    if (!n || text[0] < '0' || text[0] > '9' || errno || (*end && strcmp(end, "\n")))
        die("--from %s: step.txt must hold one whole number, got '%.40s'", from_dir, text);
    free(text); return v;
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
    if (!per || !size || size % per) die("%s has %" PRIu64 " bytes; it must hold whole batches of %" PRIu64 " bytes (%s of batch %" PRIu64 ")",
                                         path, (uint64_t)size, (uint64_t)per, j ? "targets" : "inputs", (uint64_t)batch);
    *nbatch = size / per; return data;
}
/* Every value of an input that an embedding reads as ids, in every batch of `data` (from
   `path`), must be an integer in [0, bound), as Python's feed check requires; else the runner
   stops before running anything (the kernels would give a zero row for it, silently). */
static void check_ids(const char *data, size_t nbatch, const char *path) {
    size_t b, e; int i, j;
    for (b = 0; b < nbatch; b++) {
        const char *p = data + b * io_bytes(0);
        for (j = 0; j < nio[0]; j++) {
            size_t per = io[0][j].count / batch;
            for (i = 0; i < nids; i++) {
                if (id_input[i] != j) continue;
                for (e = 0; e < io[0][j].count; e++) {
                    double v = item == 4 ? (double)((const float *)p)[e] : ((const double *)p)[e];
                    if (!(v >= 0 && v < (double)id_bound[i] && floor(v) == v))
                        die("%s: batch %" PRIu64 ": input %s holds %g at sample %" PRIu64 ", position %" PRIu64 "; its values are ids, "
                            "integers in [0, %" PRIu64 "); nothing was run", path, (uint64_t)b, io[0][j].name, v,
                            (uint64_t)(e / per), (uint64_t)(e % per), id_bound[i]);
                }
            }
            p += io[0][j].count * item;
        }
    }
}
static void upload(char *data, int j) { int i; for (i = 0; i < nio[j]; i++) { transfer(&io[j][i], data, 1); data += io[j][i].count * item; } }

int main(int argc, char **argv) {
    cl_device_id dev; cl_context ctx; cl_program prog; cl_int err; char path[4096], *src; size_t n; int i, a, np = 0;
    const char *loader, *pos[6]; int built = 0;
    if (argc == 2 && !strcmp(argv[1], "--about")) {
        find_kilnet_vendors();
        loader = open_opencl(path, sizeof path);
#ifdef _WIN32
        {
            const char *files = getenv(KL_DRIVERS_VARIABLE);
            printf("kilnet_run: OpenCL declarations: %s; loader: %s; drivers: %s%s%s%s\n", KL_HEADERS,
                   loader ? loader : path, KL_DRIVERS_DEFAULT, files && *files ? " and (where not "
                   "elevated) OCL_ICD_FILENAMES=" : "", files && *files ? files : "",
                   files && *files && kilnet_vendors[0] ? " (kilnet_run set it)" : "");
        }
#else
        printf("kilnet_run: OpenCL declarations: %s; loader: %s; drivers: %s\n", KL_HEADERS,
               loader ? loader : path, kilnet_vendors[0] ? kilnet_vendors :
               getenv(KL_DRIVERS_VARIABLE) ? getenv(KL_DRIVERS_VARIABLE) : KL_DRIVERS_DEFAULT);
#endif
        return loader ? 0 : 1;
    }
    if (argc >= 3 && !strcmp(argv[1], "--sha256")) {
        char hex[65];
        for (i = 2; i < argc; i++) { src = read_file(argv[i], &n); sha256_hex(src, n, hex); printf("%s  %s\n", hex, argv[i]); free(src); }
        return 0;
    }
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "--from") && i + 1 < argc) from_dir = argv[++i];
        else if (np < 6) pos[np++] = argv[i];
        else { np = 0; break; }
    }
    if (np < 2 || !((!strcmp(pos[1], "forward") && np == 4) || (!strcmp(pos[1], "train") && np == 5))) {
        fprintf(stderr, "usage: kilnet_run [-v] BUNDLE forward INPUTS.bin OUTPUTS.bin [--from DIR]\n"
                        "       kilnet_run [-v] BUNDLE train INPUTS.bin TARGETS.bin OUTDIR [--from DIR]\n"
                        "       kilnet_run --about | --sha256 FILE...\n");
        return 2;
    }
    bundle = pos[0];
    load_plan();
    check_files();
    if (from_dir && !strcmp(pos[1], "train")) step0 = from_step();   /* forward takes no step */
    find_kilnet_vendors();
    if (!(loader_name = open_opencl(path, sizeof path))) die("%s", path);
    dev = pick_device();
    describe_device(dev);
    say("device %s", dev_words);
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err); CHECK(err, "cannot create a context");
    queue = clCreateCommandQueue(ctx, dev, 0, &err); CHECK(err, "cannot create a command queue");
    if (!(prog = cached_program(ctx, dev))) {
        clock_t t0 = clock();
        snprintf(path, sizeof path, "%s/%s", bundle, source);
        src = read_file(path, &n);
        prog = clCreateProgramWithSource(ctx, 1, (const char **)&src, &n, &err); CHECK(err, "cannot create the program");
        if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) {
            char log[16384] = ""; clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, sizeof log - 1, log, NULL);
            die("%s does not build on this device:\n%s", path, log);
        }
        free(src); built = 1;
        say("built %s in %.2f s of processor time", source, (double)(clock() - t0) / CLOCKS_PER_SEC);
    }
    for (i = 0; i < narenas; i++) {
        Arena *A = &arenas[i]; char *data; size_t size = A->elements * item;
        A->mem = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size ? size : (size_t)item, NULL, &err);
        CHECK(err, "cannot allocate arena %s (%" PRIu64 " bytes)", A->role, (uint64_t)size);
        if (strcmp(A->file, "-")) {
            snprintf(path, sizeof path, "%s/%s", from_dir ? from_dir : bundle, A->file);
            data = read_file(path, &n);
            if (n != size) die("%s has %" PRIu64 " bytes; arena %s needs %" PRIu64, path, (uint64_t)n, A->role, (uint64_t)size);
        } else data = xcalloc(size, 1);
        if (size) CHECK(clEnqueueWriteBuffer(queue, A->mem, CL_TRUE, 0, size, data, 0, NULL, NULL), "write of arena %s", A->role);
        free(data);
    }
    for (i = 0; i < nlaunches; i++) {      /* one kernel object per launch, arguments set once */
        Launch *L = &launches[i];
        L->k = clCreateKernel(prog, kernels[L->kernel], &err); CHECK(err, "no kernel %s in %s", kernels[L->kernel], source);
        for (a = 0; a < L->nargs; a++) {
            Arg *g = &L->args[a]; cl_uint v = (cl_uint)g->value;
            float f = (float)g->real;
            if (g->is_arena) CHECK(clSetKernelArg(L->k, g->slot, sizeof(cl_mem), &arenas[g->value].mem), "launch %s: slot %d", L->name, g->slot);
            else if (g->is_real && item == 4) CHECK(clSetKernelArg(L->k, g->slot, sizeof f, &f), "launch %s: slot %d", L->name, g->slot);
            else if (g->is_real) CHECK(clSetKernelArg(L->k, g->slot, sizeof g->real, &g->real), "launch %s: slot %d", L->name, g->slot);
            else CHECK(clSetKernelArg(L->k, g->slot, sizeof v, &v), "launch %s: slot %d", L->name, g->slot);
        }
    }
    if (!strcmp(pos[1], "forward")) {
        size_t k; char *in = read_batches(pos[2], 0, &k), *out = xcalloc(io_bytes(2), 1), *p = out;
        if (k != 1) die("%s holds %" PRIu64 " batches; forward takes one", pos[2], (uint64_t)k);
        check_ids(in, k, pos[2]);
        upload(in, 0);
        run_call("forward");
        for (i = 0; i < nio[2]; i++) { transfer(&io[2][i], p, 0); p += io[2][i].count * item; }
        write_file(pos[3], out, io_bytes(2));
    } else {
        size_t k, kt, s, used = 0; char *in, *tg, *losses; uint64_t t = step0;
        if (scal_arena < 0) die("bundle %s has no train_step (export it with train=True / --train)", bundle);
        in = read_batches(pos[2], 0, &k);
        if (io_bytes(1)) {
            if (!strcmp(pos[3], "-"))
                die("bundle %s has targets (its losses are on outputs): TARGETS.bin must hold "
                    "them, not -", bundle);
            tg = read_batches(pos[3], 1, &kt);
            if (k != kt) die("%s holds %" PRIu64 " batches but %s holds %" PRIu64, pos[2], (uint64_t)k, pos[3], (uint64_t)kt);
        } else {   /* the losses are written in the graph: its targets are among the inputs */
            tg = NULL;
            if (strcmp(pos[3], "-")) {
                size_t tn; char *t0 = read_file(pos[3], &tn);
                free(t0);
                if (tn) die("%s has %" PRIu64 " bytes, but bundle %s has no targets (its losses are "
                            "written in the graph, their targets among the inputs): give - or an "
                            "empty file", pos[3], (uint64_t)tn, bundle);
            }
        }
        check_ids(in, k, pos[2]);
        if (!kl_is_folder(pos[4])) die("OUTDIR %s is not a folder (make it first)", pos[4]);
        losses = xcalloc(k, 32);
        for (s = 0; s < k; s++) {
            enum { MAX_SCALARS = STEP_SCALARS + 3 * MAX_GROUPS };
            double v[MAX_SCALARS] = {lr, 0, 0, 0, 0, 0}, sum = 0; float f[MAX_SCALARS]; char buf[8 * MAX_SCALARS];
            Region r; size_t e, nsc = STEP_SCALARS + 3 * (size_t)ngroups;
            uint64_t next = t + 1;   /* taken only if the loss is finite, as in Python */
            if (next >= 4294967296.0) die("step %" PRIu64 ": the step counter holds steps below 2^32", next);
            if (!strcmp(opt, "adam")) { v[1] = 1.0 - pow(b1, (double)(next / every0)); v[2] = 1.0 - pow(b2, (double)(next / every0)); }
            v[4] = (double)(next % 65536); v[5] = (double)(next / 65536);
            for (i = 0; i < ngroups; i++) {
                double *g = v + groups[i].slot;
                g[0] = groups[i].lr; g[1] = g[2] = 0;
                if (!strcmp(groups[i].kind, "adam")) {
                    double k = (double)(next / groups[i].every);
                    g[1] = 1.0 - pow(groups[i].b1, k); g[2] = 1.0 - pow(groups[i].b2, k);
                }
            }
            for (e = 0; e < nsc; e++) f[e] = (float)v[e];
            r.arena = scal_arena; r.offset = scal_offset; r.count = nsc; strcpy(r.name, "step scalars");
            memcpy(buf, item == 4 ? (void *)f : (void *)v, nsc * item); transfer(&r, buf, 1);
            upload(in + s * io_bytes(0), 0);
            if (tg) upload(tg + s * io_bytes(1), 1);
            run_call("train_step");
            for (i = 0; i < nloss; i++) {
                char *part = xcalloc(loss[i].count, item); transfer(&loss[i], part, 0);
                for (e = 0; e < loss[i].count; e++) sum += item == 4 ? (double)((float *)part)[e] : ((double *)part)[e];
                free(part);
            }
            if (isfinite(sum)) {
                t = next;
                printf("step %" PRIu64 " loss %.9g\n", t, sum);
            } else {   /* the device's guard (step:ok) skipped every update of this batch */
                printf("step %" PRIu64 " loss %.9g skipped\n", next, sum);
                fprintf(stderr, "kilnet_run: batch %" PRIu64 ": the loss is %g, so nothing was updated (a "
                        "NaN or an infinity in its inputs or targets, or a diverged model); the "
                        "step count stays %" PRIu64 "\n", (uint64_t)s + 1, sum, t);
            }
            used += (size_t)snprintf(losses + used, 32, "%.17g\n", sum);
        }
        snprintf(path, sizeof path, "%s/loss.txt", pos[4]); write_file(path, losses, used);
        for (i = 0; i < narenas; i++) {
            Arena *A = &arenas[i]; Region r; char *data;
            if (!strcmp(A->file, "-")) continue;
            data = xcalloc(A->elements, item);
            r.arena = i; r.offset = 0; r.count = A->elements; strcpy(r.name, A->role); transfer(&r, data, 0);
            snprintf(path, sizeof path, "%s/%s", pos[4], A->file); write_file(path, data, A->elements * item);
            free(data);
        }
        {
            char line[32]; int len = snprintf(line, sizeof line, "%" PRIu64 "\n", t);
            snprintf(path, sizeof path, "%s/step.txt", pos[4]); write_file(path, line, (size_t)len);
        }
    }
    clFinish(queue);
    if (built) cache_program(prog);
    return 0;
}
