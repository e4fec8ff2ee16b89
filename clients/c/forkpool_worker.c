/*
 * forkpool_worker.c - a forkpool exec'd worker in C (POSIX + Linux, libc only),
 * written from docs/protocol.md alone.  It speaks back-channel protocol
 * version 1 in the handoff, order, shared (and herd) and kernel dispatch modes
 * and serves the same tiny HTTP answer as the other example workers:
 * "hello", with ?work_ms=N to sleep N ms first, and the X-Forkpool-Slot and
 * X-Forkpool-Pid headers.  It leaves (X) when its descriptor table fills up
 * (docs/protocol.md, "Running out of descriptors").
 *
 * With --chaos (fault-injection tests only), ?leak_fds=N (at most 1000)
 * makes it open N descriptors of /dev/null and keep them for the life of
 * the process, as a leaking app does (500 if one cannot be opened), and
 * ?grow_mib=N (at most 1024) makes it keep N MiB more of memory it has
 * written to (its own, unshared) for the life of the process, as an app
 * that leaks memory does.
 *
 * Build: cc -O2 -Wall -Wextra -o forkpool-c-worker clients/c/forkpool_worker.c \
 *            clients/c/kernel_dispatch.c
 * Run:   forkpool run --dispatch order -- ./forkpool-c-worker
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "forkpool_worker.h"

#define PROTOCOL_VERSION 1
#define HEAD_MAX 8192        /* cap on the request head, in bytes */
#define HEAD_DEADLINE_MS 10000 /* the whole head must arrive within this */
#define WORK_MS_MAX 60000    /* cap on ?work_ms= */
#define LEAK_FDS_MAX 1000    /* cap on ?leak_fds= (with --chaos) */
#define GROW_MIB_MAX 1024    /* cap on ?grow_mib= (with --chaos) */
/* Descriptors kept free below the soft RLIMIT_NOFILE (at most a quarter of
 * it): once the one at the reserve's start is open, the worker leaves after
 * its connection (docs/protocol.md, "Running out of descriptors"). */
#define DESCRIPTOR_RESERVE 32

int chan = -1;
const char *slot = "?";
long listen_fds;
static int chaos;           /* --chaos: ?leak_fds=N and ?grow_mib=N work */
static char *grown;         /* what ?grow_mib=N kept: each block starts with the previous one */
static int fd_ceiling = -1; /* the descriptor at the reserve's start; -1: no limit */
static rlim_t fd_limit;     /* the soft RLIMIT_NOFILE it comes from */

void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "forkpool C worker (slot %s, pid %ld): ", slot, (long)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* One message is one datagram: one send call. */
void send_msg(char kind, const unsigned char *payload, size_t len)
{
    unsigned char buf[16];
    buf[0] = PROTOCOL_VERSION;
    buf[1] = (unsigned char)kind;
    if (len)
        memcpy(buf + 2, payload, len);
    for (;;) {
        ssize_t n = send(chan, buf, 2 + len, MSG_NOSIGNAL);
        if (n == (ssize_t)(2 + len))
            return;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            exit(0); /* the parent is gone */
        die("cannot send '%c' on the back-channel: %s", kind, strerror(errno));
    }
}

void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void write_all(int fd, const char *p, size_t len)
{
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the client went away: nothing more to do */
        p += n;
        len -= (size_t)n;
    }
}

static void respond(int fd, int code, const char *reason, const char *body)
{
    char out[512];
    int n = snprintf(out, sizeof out,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\n"
                     "Content-Length: %zu\r\nX-Forkpool-Slot: %s\r\n"
                     "X-Forkpool-Pid: %ld\r\nConnection: close\r\n\r\n%s",
                     code, reason, strlen(body), slot, (long)getpid(), body);
    if (n > 0 && (size_t)n < sizeof out) {
        ending_connection(); /* every answer ends its connection */
        write_all(fd, out, (size_t)n);
    }
}

/* ?NAME=N (name given with its `=`) in the request target, at most max;
 * or 0. */
static long query_number(const char *target, size_t len, const char *name, long max)
{
    const char *q = memchr(target, '?', len);
    const char *end = target + len;
    size_t name_len = strlen(name);
    while (q && q < end) {
        q++;
        if ((size_t)(end - q) > name_len && memcmp(q, name, name_len) == 0) {
            long v = 0;
            for (q += name_len; q < end && *q >= '0' && *q <= '9'; q++) {
                v = v * 10 + (*q - '0');
                if (v > max)
                    v = max;
            }
            return v;
        }
        q = memchr(q, '&', (size_t)(end - q));
    }
    return 0;
}

/* Answer one HTTP request on a blocking connected socket.  Only the head is
 * read (within a deadline and a size cap); a body is never buffered. */
void answer_request(int fd)
{
    char head[HEAD_MAX + 1];
    size_t got = 0;
    long deadline = now_ms() + HEAD_DEADLINE_MS;
    char *end = NULL;
    while (!end) {
        if (got == HEAD_MAX) {
            respond(fd, 431, "Request Header Fields Too Large", "request head too large\n");
            return;
        }
        long left = deadline - now_ms();
        if (left <= 0) {
            respond(fd, 408, "Request Timeout", "request head not received in time\n");
            return;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue; /* the deadline check above decides */
        /* Peek, then consume only up to the end of the head: the body stays
         * in the socket, unread. */
        ssize_t n = recv(fd, head + got, HEAD_MAX - got, MSG_PEEK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* closed or reset before a full head */
        head[got + (size_t)n] = '\0';
        size_t from = got >= 3 ? got - 3 : 0;
        char *e = strstr(head + from, "\r\n\r\n");
        size_t take = e ? (size_t)(e + 4 - head) - got : (size_t)n;
        ssize_t m = recv(fd, head + got, take, 0);
        if (m <= 0)
            return;
        got += (size_t)m;
        head[got] = '\0';
        if (e)
            end = e;
    }
    char *sp1 = memchr(head, ' ', got);
    char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(head + got - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp2 > end) {
        respond(fd, 400, "Bad Request", "bad request line\n");
        return;
    }
    size_t target_len = (size_t)(sp2 - sp1 - 1);
    long ms = query_number(sp1 + 1, target_len, "work_ms=", WORK_MS_MAX);
    if (ms > 0) {
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
    long leak = chaos ? query_number(sp1 + 1, target_len, "leak_fds=", LEAK_FDS_MAX) : 0;
    for (long k = 0; k < leak; k++) {
        if (open("/dev/null", O_RDONLY | O_CLOEXEC) < 0) { /* never closed: a leak */
            char why[128];
            snprintf(why, sizeof why, "/dev/null: %s\n", strerror(errno));
            respond(fd, 500, "Internal Server Error", why);
            return;
        }
    }
    long grow = chaos ? query_number(sp1 + 1, target_len, "grow_mib=", GROW_MIB_MAX) : 0;
    if (grow > 0) {
        char *kept = malloc((size_t)grow << 20);
        if (!kept) {
            respond(fd, 500, "Internal Server Error", "out of memory\n");
            return;
        }
        memset(kept, 1, (size_t)grow << 20); /* written to: resident, its own */
        /* Kept on a list, never freed (a leak the compiler cannot drop). */
        memcpy(kept, &grown, sizeof grown);
        grown = kept;
    }
    respond(fd, 200, "OK", "hello\n");
}

/* Answer, and end the response at once (the report to the supervisor and
 * the close come after). */
static void serve(int fd)
{
    answer_request(fd);
    shutdown(fd, SHUT_WR);
}

/* The soft RLIMIT_NOFILE and the descriptor at the start of the reserve
 * below it, once at start; no limit (RLIM_INFINITY): no check. */
static void read_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT_MAX)
        return;
    rlim_t reserve = rl.rlim_cur / 4 < DESCRIPTOR_RESERVE ? rl.rlim_cur / 4 : DESCRIPTOR_RESERVE;
    fd_limit = rl.rlim_cur;
    fd_ceiling = (int)(rl.rlim_cur - reserve);
}

int check_headroom(void)
{
    /* Descriptors are taken lowest first, so once the one at the reserve's
     * start is open the table has filled up to there: an app that leaks
     * them would soon fail its own opens, or this worker an accept. */
    if (fd_ceiling < 0 || fcntl(fd_ceiling, F_GETFD) < 0)
        return 0; /* no limit, or not open: room left */
    fprintf(stderr,
            "forkpool worker: descriptor %d is open, with RLIMIT_NOFILE at %llu: this worker is "
            "running out of descriptors (does the app leak them? else raise ulimit -n / "
            "LimitNOFILE); it leaves after this connection and the supervisor starts a fresh "
            "one\n",
            fd_ceiling, (unsigned long long)fd_limit);
    return 1;
}

int accept_exhausted(void)
{
    if (errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM)
        return 0; /* EAGAIN: none waits; ECONNABORTED, EPROTO: it is gone */
    fprintf(stderr,
            "forkpool worker: accept failed: %s: this worker is out of descriptors or memory "
            "(does the app leak them? else raise ulimit -n / LimitNOFILE); it leaves, the "
            "connection waits for a fresh one\n",
            strerror(errno));
    return 1;
}

/* Read one message.  Returns its length (0 = end of file); *fd_out gets a
 * received descriptor or -1.  Exits on anything the protocol forbids. */
size_t recv_msg(unsigned char *buf, int *fd_out)
{
    union {
        char raw[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = { .iov_base = buf, .iov_len = 16 };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = ctl.raw, .msg_controllen = sizeof ctl.raw };
    ssize_t n;
    do
        n = recvmsg(chan, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == ECONNRESET)
            return 0;
        die("cannot read the back-channel: %s", strerror(errno));
    }
    int nfds = 0;
    *fd_out = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int fds[4];
            memcpy(fds, CMSG_DATA(c), k * sizeof(int));
            for (size_t i = 0; i < k; i++) {
                if (nfds++ == 0)
                    *fd_out = fds[i];
                else
                    close(fds[i]);
            }
        }
    }
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        die("over-long back-channel message or too many descriptors");
    if (n > 0 && buf[0] != PROTOCOL_VERSION)
        die("back-channel protocol version %u is not supported (this worker speaks %d)",
            buf[0], PROTOCOL_VERSION);
    if (nfds > 1 || (nfds == 1 && !(n == 4 && buf[1] == 'C')))
        die("unexpected descriptors with back-channel message");
    return (size_t)n;
}

static int do_accept(int idx)
{
    int fd;
    do
        fd = accept4(3 + idx, NULL, NULL, SOCK_CLOEXEC); /* blocking connection */
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* After serving fd: idle (I), or, when the descriptor table is filling
 * up, leave: X instead of I, so the exit counts as a retirement, not a
 * death.  The report goes before the close. */
static void finish(int fd)
{
    int leave = check_headroom();
    send_msg(leave ? 'X' : 'I', NULL, 0);
    close(fd);
    if (leave)
        exit(0);
}

/* Accept on listener idx and report B/serve/I, or M (then X and exit when
 * the accept ran out of descriptors: a retry would fail again at once). */
static void accept_and_serve(int idx)
{
    int fd = do_accept(idx);
    if (fd < 0) {
        int leave = accept_exhausted();
        send_msg('M', NULL, 0);
        if (leave) {
            send_msg('X', NULL, 0);
            exit(0);
        }
        return;
    }
    send_msg('B', NULL, 0);
    serve(fd);
    finish(fd);
}

int answer_ping(const unsigned char *m, size_t n)
{
    if (n != 6 || m[1] != 'p')
        return 0;
    send_msg('P', m + 2, 4);
    return 1;
}

/* Handle one message from the parent.  Returns 0 at end of file / quit. */
static int handle(const char *mode)
{
    unsigned char m[16];
    int fd;
    size_t n = recv_msg(m, &fd);
    if (n == 0)
        return 0;
    if (answer_ping(m, n))
        return 1;
    if (n == 2 && m[1] == 'Q')
        return 0;
    if (n == 4 && m[1] == 'C' && fd >= 0 && strcmp(mode, "handoff") == 0) {
        serve(fd);
        finish(fd);
        return 1;
    }
    if (n == 4 && m[1] == 'A' && strcmp(mode, "order") == 0) {
        int idx = (m[2] << 8) | m[3];
        if (idx >= listen_fds)
            die("accept order for listener %d, but only %ld listeners", idx, listen_fds);
        accept_and_serve(idx);
        return 1;
    }
    if (fd >= 0)
        close(fd);
    die("unexpected back-channel message: kind 0x%02x, %zu bytes, in %s mode", m[1], n, mode);
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--chaos") == 0)
            chaos = 1;
    const char *proto = getenv("FORKPOOL_PROTOCOL");
    const char *mode = getenv("FORKPOOL_DISPATCH");
    /* Kernel dispatch is announced as handoff plus FORKPOOL_KERNEL_DISPATCH=1,
     * so that a worker written before it serves as in handoff. */
    const char *kernel = getenv("FORKPOOL_KERNEL_DISPATCH");
    if (mode && kernel && strcmp(mode, "handoff") == 0 && strcmp(kernel, "1") == 0)
        mode = "kernel";
    const char *chan_s = getenv("FORKPOOL_CHANNEL_FD");
    const char *s = getenv("FORKPOOL_SLOT");
    if (s)
        slot = s;
    if (!mode || !chan_s || !proto)
        die("FORKPOOL_DISPATCH, FORKPOOL_PROTOCOL or FORKPOOL_CHANNEL_FD is not set: "
            "run me under `forkpool run` in handoff, order, shared or kernel mode");
    if (strcmp(proto, "1") != 0)
        die("the supervisor speaks back-channel protocol %s; this worker speaks only %d",
            proto, PROTOCOL_VERSION);
    chan = atoi(chan_s);
    const char *lf = getenv("LISTEN_FDS");
    const char *lp = getenv("LISTEN_PID");
    if (lf && lp && atol(lp) == (long)getpid())
        listen_fds = atol(lf);
    read_fd_limit();
    if (strcmp(mode, "kernel") == 0)
        return kernel_main();
    int shared = strcmp(mode, "shared") == 0 || strcmp(mode, "herd") == 0;
    if (!shared && strcmp(mode, "handoff") != 0 && strcmp(mode, "order") != 0)
        die("dispatch mode `%s` is not supported: use handoff, order, shared or kernel", mode);
    if ((shared || strcmp(mode, "order") == 0) && listen_fds < 1)
        die("%s mode but no listeners were passed (LISTEN_FDS)", mode);

    unsigned char pid[4];
    put_u32(pid, (uint32_t)getpid());
    send_msg('R', pid, 4);

    if (!shared) {
        while (handle(mode))
            ;
        return 0;
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1: %s", strerror(errno));
    struct epoll_event ev = { .events = EPOLLIN, .data.u32 = UINT32_MAX };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, chan, &ev) < 0)
        die("epoll_ctl(channel): %s", strerror(errno));
    for (long i = 0; i < listen_fds; i++) {
        ev.events = EPOLLIN | (strcmp(mode, "shared") == 0 ? EPOLLEXCLUSIVE : 0);
        ev.data.u32 = (uint32_t)i;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, 3 + (int)i, &ev) < 0)
            die("epoll_ctl(listener %ld): %s", i, strerror(errno));
    }
    for (;;) {
        struct epoll_event evs[16];
        int n = epoll_wait(ep, evs, 16, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die("epoll_wait: %s", strerror(errno));
        /* The channel first: pings, quit and end of file come before work. */
        for (int i = 0; i < n; i++)
            if (evs[i].data.u32 == UINT32_MAX && !handle(mode))
                return 0;
        for (int i = 0; i < n; i++)
            if (evs[i].data.u32 != UINT32_MAX)
                accept_and_serve((int)evs[i].data.u32);
    }
}
