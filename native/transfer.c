/*
 * Transfers between a segment file and a socket without copying through user space: the HA
 * master's sendfile of the log to a slave, and the slave's splice of what it receives into
 * its segment file. Both are non-blocking; EAGAIN is a return value for the trio side.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>

int64_t th_sendfile(int out_fd, int in_fd, int64_t offset, size_t count)
{
    off_t off = (off_t)offset;
    ssize_t n = sendfile(out_fd, in_fd, &off, count);
    if (n < 0)
        return -(int64_t)errno;
    return (int64_t)n;
}

/* The `left` bytes in the pipe into the file at `offset` by copying: for a file system
   whose files take no splice. 0, or -errno. */
static int64_t drain_pipe_by_copy(int pipe_r, int file_fd, int64_t offset, size_t left)
{
    uint8_t buffer[64 * 1024];
    while (left) {
        ssize_t got = read(pipe_r, buffer, left < sizeof buffer ? left : sizeof buffer);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -EIO; /* fewer bytes than were spliced in: never a "try again" */
        for (ssize_t put = 0; put < got;) {
            ssize_t n = pwrite(file_fd, buffer + put, (size_t)(got - put), (off_t)offset);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return n < 0 ? -(int64_t)errno : -EIO;
            put += n;
            offset += n;
        }
        left -= (size_t)got;
    }
    return 0;
}

int64_t th_splice_to_file(int sock_fd, int pipe_r, int pipe_w, int file_fd, int64_t offset,
                          size_t count)
{
    size_t moved = 0;
    while (moved < count) {
        ssize_t in = splice(sock_fd, NULL, pipe_w, NULL, count - moved,
                            SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (in < 0 && errno == EINTR)
            continue;
        if (in < 0 && moved)
            break; /* report the bytes moved; the next call meets the condition again */
        if (in < 0)
            return -(int64_t)errno;
        if (in == 0)
            break; /* the peer closed */
        size_t left = (size_t)in;
        while (left) {
            loff_t at = (loff_t)(offset + (int64_t)moved);
            ssize_t out = splice(pipe_r, NULL, file_fd, &at, left, SPLICE_F_MOVE);
            if (out < 0 && errno == EINTR)
                continue;
            if (out <= 0) {
                int64_t rc = drain_pipe_by_copy(pipe_r, file_fd, offset + (int64_t)moved, left);
                if (rc < 0)
                    return rc;
                out = (ssize_t)left;
            }
            moved += (size_t)out;
            left -= (size_t)out;
        }
    }
    return (int64_t)moved;
}
