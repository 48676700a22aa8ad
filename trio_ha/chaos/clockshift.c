/* clockshift: an LD_PRELOAD shim that moves one process's wall clock by an offset that
 * another process changes while this one runs (the chaos harness's clock jumps).
 *
 * The offset is a signed 64-bit count of nanoseconds, native byte order, in the first 8
 * bytes of the file named by TRIO_HA_CLOCK_SHIFT_FILE. The file is mapped read-only and
 * shared at the first clock call, then read with one atomic 8-byte load per call: no system
 * call, and a write by the harness (through its own shared mapping of the same file) is seen
 * by the next call. Unset variable, missing or short file, failed mapping: the offset is 0,
 * the process runs as without the shim.
 *
 * Only the wall clocks move (CLOCK_REALTIME, CLOCK_REALTIME_COARSE, CLOCK_TAI, and
 * gettimeofday and time, which read the same clock). CLOCK_MONOTONIC, CLOCK_BOOTTIME and the
 * CPU-time clocks are passed through untouched: timeouts (trio's among them) run on those.
 *
 * What it cannot reach: statically linked code, direct system calls, and libc's internal
 * clock reads that do not go through these three symbols (file times set by the kernel,
 * timer deadlines the kernel keeps). Build: cc -O2 -shared -fPIC -o x.so clockshift.c -ldl
 * -lpthread (clockshift.py does it).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_SEC 1000000000LL

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *restrict, void *restrict);

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static clock_gettime_fn real_clock_gettime;
static gettimeofday_fn real_gettimeofday;
/* NULL: no offset file; else the page-aligned (so 8-byte-aligned) mapping of it */
static const int64_t *offset_slot;

/* Runs once per process (pthread_once: a thread that calls in meanwhile waits for it). */
static void init(void) {
    real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    real_gettimeofday = (gettimeofday_fn)dlsym(RTLD_NEXT, "gettimeofday");
    const char *path = getenv("TRIO_HA_CLOCK_SHIFT_FILE");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    /* a mapping past the end of the file would raise SIGBUS on read: want all 8 bytes */
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(int64_t)) {
        void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
        if (map != MAP_FAILED)
            offset_slot = (const int64_t *)map;
    }
    close(fd); /* the mapping outlives the descriptor */
}

static int64_t offset_ns(void) {
    pthread_once(&init_once, init);
    /* one aligned 8-byte load: never a torn value, however the writer interleaves */
    return offset_slot == NULL ? 0 : __atomic_load_n(offset_slot, __ATOMIC_RELAXED);
}

static int is_wall_clock(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

/* ts + offset, with tv_nsec kept in [0, 1e9) for negative offsets too */
static void shift(struct timespec *ts, int64_t offset) {
    ts->tv_sec += offset / NS_PER_SEC;
    ts->tv_nsec += offset % NS_PER_SEC; /* in (-1e9, 1e9): one carry at most */
    if (ts->tv_nsec >= NS_PER_SEC) {
        ts->tv_nsec -= NS_PER_SEC;
        ts->tv_sec += 1;
    } else if (ts->tv_nsec < 0) {
        ts->tv_nsec += NS_PER_SEC;
        ts->tv_sec -= 1;
    }
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int64_t offset = offset_ns(); /* initialises real_clock_gettime too */
    if (real_clock_gettime == NULL) { /* no libc below us: cannot happen in a dynamic process */
        errno = ENOSYS;
        return -1;
    }
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && offset != 0 && is_wall_clock(clock))
        shift(ts, offset);
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    int64_t offset = offset_ns();
    if (real_gettimeofday == NULL) {
        errno = ENOSYS;
        return -1;
    }
    int rc = real_gettimeofday(tv, tz); /* fills the (obsolete) time zone too */
    /* glibc declares tv non-null (__nonnull), so the compiler drops a plain test of it;
       but a caller asking for the time zone alone passes NULL, and the real call (the
       vDSO) tolerates it: so must we. The empty asm hides the pointer's origin from the
       optimiser, which keeps the test. */
    uintptr_t address = (uintptr_t)tv;
    __asm__("" : "+r"(address));
    if (rc == 0 && offset != 0 && address != 0) {
        struct timespec ts = {tv->tv_sec, (long)tv->tv_usec * 1000};
        shift(&ts, offset);
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    /* through the clock_gettime above: shifted like the others */
    time_t now = clock_gettime(CLOCK_REALTIME, &ts) == 0 ? ts.tv_sec : (time_t)-1;
    if (out != NULL)
        *out = now;
    return now;
}
