/*
 * Memory and files under a segment's mapping: msync (on the caller's thread, or on a sync
 * thread of its own that never takes the interpreter's lock), warming pages before appends
 * reach them, zeroing a truncated tail, and reserving blocks so a full disk fails early.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define WARM_PAGE 4096u

static uintptr_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (uintptr_t)ps : (uintptr_t)4096;
}

int th_msync(uint8_t *addr, size_t len)
{
    uintptr_t ps = page_size();
    uintptr_t a = (uintptr_t)addr;
    uintptr_t start = a & ~(ps - 1);
    size_t span = len + (size_t)(a - start);
    if (msync((void *)start, span, MS_SYNC) != 0)
        return -errno;
    return 0;
}

struct th_sync_thread {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int done_fd;
    int stop;    /* set by th_sync_thread_stop */
    int busy;    /* a range is submitted and not finished */
    uint8_t *addr;
    size_t len;
    int result;
};

static void *sync_thread_main(void *arg)
{
    th_sync_thread *t = arg;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->stop && !(t->busy && t->addr != NULL))
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->busy && t->addr != NULL) {
            uint8_t *addr = t->addr;
            size_t len = t->len;
            t->addr = NULL;
            pthread_mutex_unlock(&t->lock);
            int rc = th_msync(addr, len);
            pthread_mutex_lock(&t->lock);
            t->result = rc;
            t->busy = 0;
            uint64_t one = 1;
            /* An eventfd write fails only on counter overflow, which 2^64 - 1 ranges cannot
               reach; a lost wake-up would leave the flush waiting, never the data unsynced. */
            ssize_t w = write(t->done_fd, &one, sizeof one);
            (void)w;
            continue;
        }
        if (t->stop)
            break;
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

th_sync_thread *th_sync_thread_start(int done_fd)
{
    th_sync_thread *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->done_fd = done_fd;
    int rc = pthread_mutex_init(&t->lock, NULL);
    if (rc == 0) {
        rc = pthread_cond_init(&t->wake, NULL);
        if (rc == 0) {
            rc = pthread_create(&t->thread, NULL, sync_thread_main, t);
            if (rc == 0)
                return t;
            pthread_cond_destroy(&t->wake);
        }
        pthread_mutex_destroy(&t->lock);
    }
    free(t);
    errno = rc;
    return NULL;
}

int th_sync_thread_submit(th_sync_thread *t, uint8_t *addr, size_t len)
{
    pthread_mutex_lock(&t->lock);
    if (t->busy) {
        pthread_mutex_unlock(&t->lock);
        return -EBUSY;
    }
    t->busy = 1;
    t->addr = addr;
    t->len = len;
    t->result = 0;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    return 0;
}

int th_sync_thread_result(th_sync_thread *t)
{
    pthread_mutex_lock(&t->lock);
    int rc = t->busy ? -EBUSY : t->result;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void th_sync_thread_stop(th_sync_thread *t)
{
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_signal(&t->wake);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* Linux 5.14+; the value is fixed by the kernel ABI, older headers lack the name. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static int warm_force_touch; /* test hook: th_warm_force_touch */

void th_warm_force_touch(int on)
{
    __atomic_store_n(&warm_force_touch, on ? 1 : 0, __ATOMIC_RELAXED);
}

/*
 * The fallback: a locked OR of zero into one byte of each 4096-byte page, never outside
 * [addr, addr + len) -- the first at addr itself, then at each page boundary. A locked
 * read-modify-write faults the page in writable like any store, but cannot lose a
 * concurrent write to the same byte, and leaves the contents as they were.
 */
static void warm_touch(uint8_t *addr, size_t len)
{
    uintptr_t a = (uintptr_t)addr;
    size_t first_boundary = (size_t)((WARM_PAGE - (a & (WARM_PAGE - 1))) & (WARM_PAGE - 1));
    volatile uint8_t *v = addr;
    __atomic_fetch_or(&v[0], 0, __ATOMIC_RELAXED);
    for (size_t off = first_boundary == 0 ? WARM_PAGE : first_boundary; off < len;
         off += WARM_PAGE)
        __atomic_fetch_or(&v[off], 0, __ATOMIC_RELAXED);
}

int th_warm(uint8_t *addr, size_t len)
{
    if (len == 0)
        return 0;
    uintptr_t ps = page_size();
    uintptr_t a = (uintptr_t)addr;
    uintptr_t start = a & ~(ps - 1);
    size_t span = len + (size_t)(a - start);
    if (!__atomic_load_n(&warm_force_touch, __ATOMIC_RELAXED)) {
        /* The kernel allocates and maps every page of the span (the whole pages the range
           overlaps) in one call, as if each had been written, but writes nothing. */
        if (madvise((void *)start, span, MADV_POPULATE_WRITE) == 0)
            return 0;
        int err = errno;
        /* These mean a store would fault fatally too (SIGBUS/SIGSEGV): report, do not touch.
           Anything else (EINVAL: a kernel before 5.14 or a mapping it cannot populate,
           EINTR, EAGAIN) falls back to touching the pages. */
        if (err == EFAULT || err == ENOMEM
#ifdef EHWPOISON
            || err == EHWPOISON
#endif
        )
            return -err;
    }
    warm_touch(addr, len);
    (void)madvise((void *)start, span, MADV_WILLNEED);
    return 0;
}

void th_zero(uint8_t *addr, size_t len)
{
    if (len)
        memset(addr, 0, len);
}

int th_fallocate(int fd, int64_t offset, int64_t len)
{
    return posix_fallocate(fd, (off_t)offset, (off_t)len);
}
