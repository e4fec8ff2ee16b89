/*
 * kernel_dispatch.c - the C worker in `kernel` dispatch (docs/protocol.md,
 * "`kernel` dispatch"): the kernel queues each new connection on the own
 * listening socket of the lowest idle worker, which it finds on the
 * scoreboard, a shared memory map this worker keeps its record in.
 *
 * Descriptors: 3 .. 3+n-1 own sockets, 3+n the back-channel (as in every
 * mode), 3+n+1 .. 3+2n the pool's listeners (the overflow), 3+2n+1 the
 * scoreboard.
 *
 * Given FORKPOOL_MAX_CHILD_MEMORY or FORKPOOL_MAX_CHILD_LIFETIME_MS, the
 * worker checks after each connection, before it would go idle, whether
 * it is past one; then it leaves instead (busy, X) and waits for the
 * supervisor to let it go (docs/protocol.md, "Recycling: the parent
 * counts").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "forkpool_worker.h"

#define BOARD_MAGIC 0x3130647262706b66ULL /* "fkpbrd01", little-endian */
#define MAX_LISTENERS 64

/* The scoreboard's words: the header, and this slot's record.  Of the
 * header it reads word 2 (the supervisor waits for an `I`) and word 5 (the
 * dispatch bound); it does not read words 3 and 4, and so looks on the
 * overflow at every finish within the width. */
static volatile uint64_t *board;
static volatile uint64_t *record; /* state, taken, served, next */
enum { STATE, TAKEN, SERVED, NEXT };
enum { BOUND_WORD = 5 }; /* the dispatch bound: 0, or the first slot outside the width */
static uint64_t slot_index; /* FORKPOOL_SLOT, to compare with the bound */
enum { BUSY = 0, IDLE = 1 };
static int overflow_fd; /* the first overflow listener */
static uint64_t max_requests; /* FORKPOOL_MAX_REQUESTS: leave after this many (0: never) */

/* The limits it checks itself: FORKPOOL_MAX_CHILD_MEMORY, bytes of its own
 * (unshared) memory, 0 for none, with /proc/self/statm kept open (-1: no
 * memory check) and the page size; FORKPOOL_MAX_CHILD_LIFETIME_MS, as the
 * moment it ends (has_lifetime 0: none).  Without a limit a connection
 * costs nothing more; a lifetime costs a clock read (vDSO, no system
 * call); memory one pread of statm (the resident size), and a read of
 * /proc/self/smaps_rollup (about 16 us per resident MiB) only when that is
 * above the limit (the unshared size, what the limit is on, is never above
 * it), and then only when rollup_due() says so: a --preload worker's
 * resident size counts what it shares with its template. */
static uint64_t max_memory;
static int statm_fd = -1;
static uint64_t page_size;
static int has_lifetime;
static struct timespec leave_at;

/* The longest a worker whose resident size is above its memory limit goes
 * between two reads of smaps_rollup while that size does not grow enough
 * to matter, in nanoseconds: memory that becomes its own without the
 * resident size growing (a copy-on-write break) is seen within this. */
#define SMAPS_REREAD_NS 100000000LL

/* What a read of smaps_rollup found: the unshared (uss) and resident (rss)
 * sizes then, in bytes, and when (CLOCK_MONOTONIC, ns); read 0: none yet. */
struct rollup_read {
    int read;
    uint64_t uss, rss;
    int64_t at_ns;
};
static struct rollup_read last_rollup;

/* Whether a worker whose resident size `rss` is above its memory `limit`
 * reads smaps_rollup now, given its `last` read: when there was none; when
 * the resident size grew since then by at least what the unshared size had
 * left below the limit (that grows by at most what the resident size
 * grows, plus copy-on-write breaks, so a smaller growth cannot by itself
 * have taken it past); or when SMAPS_REREAD_NS has passed (copy-on-write
 * breaks raise it without the resident size: they are seen within that).
 * Otherwise it counts as under the limit: a worker sitting above the limit
 * on what it shares with its template reads it every 100 ms at most, not
 * after every connection. */
static int rollup_due(uint64_t limit, uint64_t rss, const struct rollup_read *last, int64_t now_ns)
{
    if (!last->read)
        return 1;
    uint64_t grown = rss > last->rss ? rss - last->rss : 0;
    uint64_t room = limit > last->uss ? limit - last->uss : 0;
    return grown >= room || now_ns - last->at_ns >= SMAPS_REREAD_NS;
}

/* The memory look given the resident size `rss` at `now_ns`: the unshared
 * size when it is above `limit`, read with read_uss() (and kept in *last)
 * only when `rss` is above the limit and rollup_due() says so; else 0. */
static uint64_t memory_past(uint64_t limit, uint64_t rss, struct rollup_read *last,
                            int64_t now_ns, uint64_t (*read_uss)(void))
{
    if (rss <= limit || !rollup_due(limit, rss, last, now_ns))
        return 0;
    uint64_t uss = read_uss();
    *last = (struct rollup_read){ .read = 1, .uss = uss, .rss = rss, .at_ns = now_ns };
    return uss > limit ? uss : 0;
}

static int64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* The board is unusable: say why and exit 1 (the spec's start-up refusal). */
static void refuse(const char *why)
{
    fprintf(stderr, "forkpool C worker (slot %s, pid %ld): the scoreboard: %s\n", slot,
            (long)getpid(), why);
    exit(1);
}

static long env_number(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        die("%s is not set: `forkpool run --dispatch kernel` sets it", name);
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 0)
        die("%s is `%s`, not a number", name, v);
    return n;
}

static void map_board(long slot_no)
{
    long fd = env_number("FORKPOOL_BOARD_FD");
    if (fd != overflow_fd + listen_fds)
        die("FORKPOOL_BOARD_FD is not 3+2*LISTEN_FDS+1: use matching forkpool versions");
    size_t len = 8 * (8 + 4 * ((size_t)slot_no + 1));
    len = (len + 4095) & ~(size_t)4095;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
    if (p == MAP_FAILED) {
        char why[160];
        snprintf(why, sizeof why, "cannot map FORKPOOL_BOARD_FD %ld: %s", fd, strerror(errno));
        refuse(why);
    }
    board = p;
    if (__atomic_load_n(&board[0], __ATOMIC_SEQ_CST) != BOARD_MAGIC)
        refuse("wrong magic (not a forkpool scoreboard of layout fkpbrd01)");
    if ((uint64_t)slot_no >= __atomic_load_n(&board[1], __ATOMIC_SEQ_CST))
        refuse("FORKPOOL_SLOT is beyond the board's slot count");
    record = board + 8 + 4 * slot_no;
    slot_index = (uint64_t)slot_no;
}

static void set_state(uint64_t v)
{
    __atomic_store_n(&record[STATE], v, __ATOMIC_SEQ_CST);
}

/* Idle; then, if the supervisor holds connections no idle worker took
 * (word 2), the wake-up it waits for.  The sequentially consistent store
 * and load order the two: with the supervisor setting word 2 before it
 * reads the states, one of the two sees the other. */
static void go_idle(void)
{
    set_state(IDLE);
    if (__atomic_load_n(&board[2], __ATOMIC_SEQ_CST) != 0)
        send_msg('I', NULL, 0);
}

/* Leaves: busy, so the kernel queues nothing more here; X makes the exit
 * a retirement, not a death.  The exit closes whatever is still open. */
static __attribute__((noreturn)) void leave(void)
{
    set_state(BUSY);
    send_msg('X', NULL, 0);
    exit(0);
}

/* Leaves past a limit: as leave(), then reads the channel until Q or end
 * of file (ignoring what the supervisor sent before it read the X), so
 * that the supervisor, which reads the worker's memory itself, finds it
 * still there; it shuts its end down once it has. */
static __attribute__((noreturn)) void leave_past_a_limit(void)
{
    set_state(BUSY);
    send_msg('X', NULL, 0);
    for (;;) {
        struct pollfd p = { .fd = chan, .events = POLLIN };
        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            exit(0);
        unsigned char m[16];
        int fd;
        size_t n = recv_msg(m, &fd);
        if (fd >= 0)
            close(fd);
        if (n == 0 || (n == 2 && m[1] == 'Q'))
            exit(0);
    }
}

/* FORKPOOL_MAX_CHILD_MEMORY and FORKPOOL_MAX_CHILD_LIFETIME_MS, if set: the
 * checks start here, in the worker (its lifetime counts from its K). */
static void start_limits(void)
{
    const char *memory = getenv("FORKPOOL_MAX_CHILD_MEMORY");
    const char *lifetime = getenv("FORKPOOL_MAX_CHILD_LIFETIME_MS");
    max_memory = memory && *memory ? (uint64_t)strtoull(memory, NULL, 10) : 0;
    uint64_t ms = lifetime && *lifetime ? (uint64_t)strtoull(lifetime, NULL, 10) : 0;
    last_rollup = (struct rollup_read){ 0 };
    if (max_memory) {
        long page = sysconf(_SC_PAGESIZE);
        statm_fd = page > 0 ? open("/proc/self/statm", O_RDONLY | O_CLOEXEC) : -1;
        page_size = page > 0 ? (uint64_t)page : 0;
        if (statm_fd < 0) /* the supervisor's own look (every second) still holds */
            fprintf(stderr, "forkpool C worker (slot %s): cannot read /proc/self/statm: %s; "
                    "it does not check its memory\n", slot, strerror(errno));
    }
    has_lifetime = ms > 0;
    if (has_lifetime) {
        clock_gettime(CLOCK_MONOTONIC, &leave_at);
        leave_at.tv_sec += (time_t)(ms / 1000);
        leave_at.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (leave_at.tv_nsec >= 1000000000L) {
            leave_at.tv_sec++;
            leave_at.tv_nsec -= 1000000000L;
        }
    }
}

/* This process's unshared memory in bytes, as the supervisor counts it:
 * Private_Clean plus Private_Dirty in /proc/self/smaps_rollup (0 if it
 * cannot be read). */
static uint64_t unshared_memory(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "re");
    if (!f)
        return 0;
    char line[256];
    uint64_t uss = 0;
    unsigned long long kib;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Private_Clean: %llu kB", &kib) == 1 ||
            sscanf(line, "Private_Dirty: %llu kB", &kib) == 1)
            uss += (uint64_t)kib * 1024;
    fclose(f);
    return uss;
}

/* Whether the worker is past its memory or lifetime limit now. */
static int past_a_limit(void)
{
    if (statm_fd >= 0) {
        char buf[128];
        ssize_t n = pread(statm_fd, buf, sizeof buf - 1, 0);
        unsigned long long size, resident;
        if (n > 0) {
            buf[n] = '\0';
            if (sscanf(buf, "%llu %llu", &size, &resident) == 2) {
                uint64_t rss = (uint64_t)resident * page_size;
                /* Under the limit (the usual case): no clock read either. */
                if (rss > max_memory &&
                    memory_past(max_memory, rss, &last_rollup, monotonic_ns(), unshared_memory))
                    return 1;
            }
        }
    }
    if (has_lifetime) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > leave_at.tv_sec ||
            (now.tv_sec == leave_at.tv_sec && now.tv_nsec >= leave_at.tv_nsec))
            return 1;
    }
    return 0;
}

/* One writer (this worker): a plain load and store is enough. */
static void count(int word)
{
    __atomic_store_n(&record[word], __atomic_load_n(&record[word], __ATOMIC_RELAXED) + 1,
                     __ATOMIC_RELAXED);
}

/* A connection from a non-blocking listener, blocking itself, or -1. */
static int take(int listener)
{
    int fd;
    do
        fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    return fd;
}

/* Whether this slot is outside the pool's dispatch width: the bound (word
 * 5, the supervisor's) is set and not above the slot.  Under load that
 * computes, the supervisor narrows the set of workers that serve, so that
 * each stays hot in its CPU's cache; the kernel gives the slots outside it
 * no new connection, and a worker there that kept taking from the
 * overflow would keep serving and never leave the set. */
static int outside_width(void)
{
    uint64_t bound = __atomic_load_n(&board[BOUND_WORD], __ATOMIC_SEQ_CST);
    return bound != 0 && slot_index >= bound;
}

/* One poll of the channel and overflow listener i: 1 when a connection
 * waits on the listener, 0 when none does, -1 when the poll failed;
 * *message says whether a message waits on the channel. */
static int overflow_waits(long i, int *message)
{
    struct pollfd p[2] = { { .fd = chan, .events = POLLIN },
                           { .fd = overflow_fd + (int)i, .events = POLLIN } };
    int r = poll(p, 2, 0);
    *message = r > 0 && p[0].revents;
    return r < 0 ? -1 : r > 0 && p[1].revents;
}

/* A connection waiting on overflow listener i, unless a message waits on
 * the channel (it goes first): one poll sees both, or none when
 * ending_connection's poll saw one waiting and no message (`seen`). -1
 * for none, and without a look when this slot is outside the dispatch
 * width (it goes idle instead).  An accept that runs out of descriptors:
 * the worker leaves, and the connection waits for another. */
static int take_next(long i, int seen)
{
    int message = 0;
    if (!seen && (outside_width() || overflow_waits(i, &message) <= 0 || message))
        return -1;
    int fd = take(overflow_fd + (int)i);
    if (fd < 0 && accept_exhausted())
        leave();
    return fd;
}

/* The listener of the connection being served (-1: none, or one served
 * on a quit, busy), whether the worker went idle before its answer or saw
 * a connection waiting on the overflow then (for the finish to take
 * without a second look), and what the one look at the descriptor table
 * and the limits said, once taken. */
static long serving = -1;
static int idle_early, next_seen;
static int headroom_looked, table_filling_up, past_limit;

/* The look at the descriptor table after a connection, once a connection
 * (ending_connection may take it first). */
static int table_is_filling(void)
{
    if (!headroom_looked) {
        table_filling_up = check_headroom();
        past_limit = past_a_limit();
        headroom_looked = 1;
    }
    return table_filling_up;
}

/* Whether the look after this connection found the worker past a limit
 * (taken with the look at the table). */
static int is_past_a_limit(void)
{
    table_is_filling();
    return past_limit;
}

/* Whether the worker's share (FORKPOOL_MAX_REQUESTS) is served once
 * `more` connections beyond those counted are. */
static int share_served(uint64_t more)
{
    return max_requests && __atomic_load_n(&record[SERVED], __ATOMIC_RELAXED) + more >= max_requests;
}

/* The spec's step 7, "finish early": just before the answer is written
 * (every answer of this worker ends its connection, in one write of at
 * most 512 bytes), idle now, so a client that reconnects the moment it
 * has the answer finds this worker idle, hot.  Not when it leaves after
 * this connection, nor when a connection waits on overflow listener i
 * within the dispatch width (the finish takes it).  A no-op outside
 * kernel dispatch and while draining on a quit. */
void ending_connection(void)
{
    if (serving < 0 || idle_early || table_is_filling() || is_past_a_limit() || share_served(1))
        return;
    if (!outside_width()) {
        int message;
        int waits = overflow_waits(serving, &message);
        if (waits != 0) {
            /* One waits: the finish takes it, without looking again unless
             * a message came first (or the look failed). */
            next_seen = waits > 0 && !message;
            return;
        }
    }
    idle_early = 1;
    go_idle();
}

/* Serves fd (which arrived on listener i), then takes the next connection
 * waiting on overflow listener i, or goes idle: the spec's "finish".
 * Idle already (ending_connection), it only counts the connection. */
static void serve_and_finish(int fd, long i)
{
    for (;;) {
        serving = i;
        answer_request(fd);
        serving = -1;
        count(SERVED);
        int filling = table_is_filling(), past = past_limit, seen = next_seen;
        headroom_looked = next_seen = 0;
        if (idle_early) {
            idle_early = 0;
            close(fd);
            return;
        }
        if (share_served(0) || filling || past) {
            /* Its share served, out of descriptors, or past its memory or
             * lifetime limit: leave, still busy, so nothing is queued for
             * it meanwhile. */
            close(fd);
            if (past)
                leave_past_a_limit();
            leave();
        }
        int next = take_next(i, seen);
        if (next < 0)
            break;
        count(TAKEN);
        count(NEXT);
        close(fd);
        fd = next;
    }
    go_idle();
    close(fd);
}

/* Q: busy, then serve what the kernel already queued on the own sockets. */
static __attribute__((noreturn)) void drain_and_quit(void)
{
    set_state(BUSY);
    for (long i = 0; i < listen_fds; i++) {
        int fd;
        while ((fd = take(3 + (int)i)) >= 0) {
            count(TAKEN);
            answer_request(fd);
            count(SERVED);
            close(fd);
        }
    }
    exit(0);
}

/* One back-channel message; returns 0 at end of file. */
static int handle_message(void)
{
    unsigned char m[16];
    int fd;
    size_t n = recv_msg(m, &fd);
    if (n == 2 && m[1] == 'Q')
        drain_and_quit();
    if (n == 0 || answer_ping(m, n))
        return n != 0;
    if (n == 4 && m[1] == 'C' && fd >= 0) {
        /* The supervisor claimed this worker (state 0) before handing. */
        long i = (m[2] << 8) | m[3];
        if (i >= listen_fds) {
            close(fd);
            die("a connection on listener %ld, but only %ld listeners", i, listen_fds);
        }
        serve_and_finish(fd, i);
        return 1;
    }
    if (fd >= 0)
        close(fd);
    die("unexpected back-channel message: kind 0x%02x, %zu bytes, in kernel mode", m[1], n);
}

int kernel_main(void)
{
    if (listen_fds < 1 || listen_fds > MAX_LISTENERS)
        die("kernel mode needs 1 to %d listeners (LISTEN_FDS), not %ld", MAX_LISTENERS,
            listen_fds);
    if (chan != 3 + listen_fds)
        die("FORKPOOL_CHANNEL_FD is not 3+LISTEN_FDS");
    overflow_fd = chan + 1;
    if (env_number("FORKPOOL_OVERFLOW_FD") != overflow_fd)
        die("FORKPOOL_OVERFLOW_FD is not 3+LISTEN_FDS+1: use matching forkpool versions");
    map_board(env_number("FORKPOOL_SLOT"));
    if (getenv("FORKPOOL_MAX_REQUESTS"))
        max_requests = (uint64_t)env_number("FORKPOOL_MAX_REQUESTS");

    start_limits();
    unsigned char pid[4];
    put_u32(pid, (uint32_t)getpid());
    send_msg('K', pid, 4);
    go_idle();

    struct pollfd fds[MAX_LISTENERS + 1];
    for (long i = 0; i < listen_fds; i++)
        fds[i] = (struct pollfd){ .fd = 3 + (int)i, .events = POLLIN };
    fds[listen_fds] = (struct pollfd){ .fd = chan, .events = POLLIN };
    for (;;) {
        int r = poll(fds, (nfds_t)listen_fds + 1, -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            die("poll: %s", strerror(errno));
        /* The channel first: pings, quit and end of file come before work. */
        if (fds[listen_fds].revents && !handle_message())
            return 0;
        for (long i = 0; i < listen_fds; i++) {
            if (!fds[i].revents)
                continue;
            int fd = take(3 + (int)i);
            if (fd < 0 && accept_exhausted())
                leave(); /* busy first: nothing more is queued here */
            if (fd < 0)
                continue; /* EAGAIN (another took it) or ECONNABORTED: wait again */
            set_state(BUSY);
            count(TAKEN);
            serve_and_finish(fd, i);
        }
    }
}
