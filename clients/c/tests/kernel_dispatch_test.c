/*
 * kernel_dispatch_test.c - unit test of the finish in kernel_dispatch.c
 * (docs/protocol.md, "`kernel` dispatch", steps 6 and 7, and "Running out
 * of descriptors"), without a supervisor: a memfd mapped shared stands for
 * the scoreboard (it behaves the same for the worker), a loopback listener
 * with a connection queued for the overflow, a socketpair for the channel.
 * The protocol side (forkpool_worker.c) is stubbed: a request is answered
 * by counting it (and keeping `grow_mib` MiB more), a message sent is its
 * kind alone, one received is read off the channel as it came, and the
 * check after a connection says what the case asks.  A worker that leaves exits: those
 * cases run in a child.  When the memory look reads smaps_rollup
 * (rollup_due, memory_past) is tested on a modelled worker's memory.
 *
 *     cc -Wall -Wextra -o kernel_dispatch_test clients/c/tests/kernel_dispatch_test.c
 *     ./kernel_dispatch_test
 *
 * It prints a line per case and exits 1 if any fails.
 */
#include "../kernel_dispatch.c"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/wait.h>

/* What forkpool_worker.c gives kernel_dispatch.c. */
int chan = -1;
const char *slot = "2";
long listen_fds = 1;
static int answered;
static int table_filling; /* what check_headroom says */
static int looks;         /* how often check_headroom was asked */
static int end_early;     /* the first answer calls ending_connection first */
static long grow_mib;     /* each answer keeps this many MiB more, written to */
static char *grown;       /* what they kept: each block starts with the previous one */
/* Header word 7, which the worker never uses: the state the first answer
 * saw after ending_connection (in the board, so a child's is seen too). */
#define STATE_AT_ANSWER 7

void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

void send_msg(char kind, const unsigned char *payload, size_t len)
{
    (void)payload, (void)len;
    if (send(chan, &kind, 1, 0) != 1)
        die("send: %s", strerror(errno));
}

size_t recv_msg(unsigned char *buf, int *fd_out)
{
    *fd_out = -1;
    ssize_t n = recv(chan, buf, 16, 0);
    return n > 0 ? (size_t)n : 0;
}

void answer_request(int fd)
{
    (void)fd;
    if (grow_mib > 0) {
        char *kept = malloc((size_t)grow_mib << 20);
        if (!kept)
            die("malloc: out of memory");
        memset(kept, 1, (size_t)grow_mib << 20);
        /* Kept on a list, never freed (a leak the compiler cannot drop). */
        memcpy(kept, &grown, sizeof grown);
        grown = kept;
    }
    if (end_early && answered == 0) {
        ending_connection();
        board[STATE_AT_ANSWER] = record[STATE];
    }
    answered++;
}

void put_u32(unsigned char *p, uint32_t v)
{
    (void)p, (void)v;
}

int answer_ping(const unsigned char *m, size_t n)
{
    (void)m, (void)n;
    return 0;
}

int check_headroom(void)
{
    looks++;
    return table_filling;
}

int accept_exhausted(void)
{
    return errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM;
}

#define SLOT 2
#define SLOTS 4
/* Where the worker finds the overflow and the board (3+n+1 and 3+2n+1 in
 * a real worker; here out of the way of the test's own descriptors). */
#define OVERFLOW_FD 100
#define BOARD_FD (OVERFLOW_FD + 1)

/* The board: magic, SLOTS slots, every other word zero; mapped by
 * map_board as a worker maps FORKPOOL_BOARD_FD. */
static void map_a_board(void)
{
    uint64_t header[2] = { BOARD_MAGIC, SLOTS };
    int fd = memfd_create("forkpool-test-board", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, 4096) || pwrite(fd, header, sizeof header, 0) != sizeof header ||
        dup2(fd, BOARD_FD) < 0)
        die("the board: %s", strerror(errno));
    close(fd);
    char number[16];
    snprintf(number, sizeof number, "%d", BOARD_FD);
    setenv("FORKPOOL_BOARD_FD", number, 1);
    overflow_fd = OVERFLOW_FD;
    map_board(SLOT);
}

/* A loopback listener, non-blocking as the overflow is, with one
 * connection queued on it (*client keeps it open), at OVERFLOW_FD. */
static void listener_with_one_waiting(int *client)
{
    int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 4) ||
        getsockname(l, (struct sockaddr *)&a, &len))
        die("listener: %s", strerror(errno));
    *client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*client < 0 || connect(*client, (struct sockaddr *)&a, sizeof a))
        die("connect: %s", strerror(errno));
    struct pollfd p = { .fd = l, .events = POLLIN };
    if (poll(&p, 1, 5000) != 1)
        die("the connection never reached the listener");
    if (dup2(l, OVERFLOW_FD) < 0)
        die("dup2: %s", strerror(errno));
    close(l);
}

/* A board cleared from word 2 on, one connection waiting on the overflow
 * (*client, its client end), the channel (ends[0] is the worker's) and a
 * connection (pair[0]) for slot SLOT to finish. */
static void prepare_finish(int *client, int ends[2], int pair[2])
{
    for (int w = 2; w < 8 + 4 * SLOTS; w++)
        board[w] = 0;
    listener_with_one_waiting(client);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ends) ||
        socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair))
        die("socketpair: %s", strerror(errno));
    chan = ends[0];
}

/* Closes what prepare_finish opened; `worker_end`: the connection's
 * worker end too (a worker that ran in a child closed only its copy). */
static void unprepare_finish(int client, int ends[2], int pair[2], int worker_end)
{
    close(overflow_fd);
    close(client);
    close(ends[0]);
    close(ends[1]);
    if (worker_end)
        close(pair[0]);
    close(pair[1]);
}

/* Slot SLOT finishes a connection with word 5 at `bound` and one
 * connection waiting on the overflow: whether it took that one (served
 * two, one of them next) or went idle and left it (served one). */
static int finish_with_bound(uint64_t bound, int takes)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    board[5] = bound;
    answered = 0;

    record[STATE] = BUSY;
    serve_and_finish(pair[0], 0);

    struct pollfd p = { .fd = overflow_fd, .events = POLLIN };
    int left = poll(&p, 1, 0);
    int served = takes ? 2 : 1;
    int ok = answered == served && record[STATE] == IDLE && record[SERVED] == (uint64_t)served &&
             record[TAKEN] == (uint64_t)(served - 1) && record[NEXT] == (uint64_t)(served - 1) &&
             left == !takes;
    printf("%s: bound %llu, slot %d: answered %d, next %llu, left on the overflow %d (want %s)\n",
           ok ? "ok" : "FAILED", (unsigned long long)bound, SLOT, answered,
           (unsigned long long)record[NEXT], left, takes ? "taken" : "left");
    unprepare_finish(client, ends, pair, 0);
    return ok;
}

/* Runs work(fd, arg) in a child, which is to exit (returning counts as
 * exit 3: it did not leave); its exit status, or -1 if it did not exit. */
static int exit_status_in_child(void (*work)(int fd, int arg), int fd, int arg)
{
    fflush(stdout); /* the child's exit flushes it too */
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        work(fd, arg);
        _exit(3);
    }
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The worker finishes connection fd out of descriptors: `filling`, the
 * check after it says so; else its table is full. */
static void finish_out_of_descriptors(int fd, int filling)
{
    table_filling = filling;
    if (!filling) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 128;
        if (setrlimit(RLIMIT_NOFILE, &rl))
            die("setrlimit: %s", strerror(errno));
        while (dup(0) >= 0)
            ;
    }
    serve_and_finish(fd, 0);
}

/* Slot SLOT finishes a connection with one waiting on the overflow, in a
 * child that runs out of descriptors: `filling`, the check after the
 * connection says so; else its table is full, and the accept of the next
 * one fails with EMFILE.  Either way it leaves: busy, X, exit 0, and the
 * connection stays on the overflow. */
static int leaves_out_of_descriptors(int filling)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    record[STATE] = BUSY;
    int status = exit_status_in_child(finish_out_of_descriptors, pair[0], filling);
    char said[4] = "";
    ssize_t n = recv(ends[1], said, sizeof said - 1, MSG_DONTWAIT);
    struct pollfd p = { .fd = overflow_fd, .events = POLLIN };
    int left = poll(&p, 1, 0);
    int ok = status == 0 && n == 1 && said[0] == 'X' &&
             record[STATE] == BUSY && record[SERVED] == 1 && record[TAKEN] == 0 && left == 1;
    printf("%s: %s: exit %d, said %s, state %llu, served %llu, left on the overflow %d "
           "(want exit 0, X, busy, 1, 1)\n",
           ok ? "ok" : "FAILED", filling ? "the table fills up" : "the accept fails with EMFILE",
           status, n == 1 ? said : "nothing",
           (unsigned long long)record[STATE], (unsigned long long)record[SERVED], left);
    unprepare_finish(client, ends, pair, 1);
    return ok;
}

/* The messages the worker sent on the channel so far (ends[1] is the
 * test's end), as their kinds. */
static const char *said_on(int end)
{
    static char kinds[16];
    size_t n = 0;
    char kind;
    while (n < sizeof kinds - 1 && recv(end, &kind, 1, MSG_DONTWAIT) == 1)
        kinds[n++] = kind;
    kinds[n] = '\0';
    return kinds;
}

/* Step 7, "finish early": slot SLOT answers with ending_connection first,
 * the supervisor waiting for an `I` (word 2), `waiting` connections on
 * the overflow, word 5 at `bound`.  `early`: idle at the answer, served
 * one, one `I`, the overflow's left; else busy at the answer, and the
 * finish takes the waiting one and goes idle after it.  One look at the
 * descriptor table a connection either way. */
static int finishes_early(int waiting, uint64_t bound, int early)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    if (!waiting)
        close(take(overflow_fd));
    board[2] = 1;
    board[5] = bound;
    answered = looks = 0;
    end_early = 1;
    record[STATE] = BUSY;
    serve_and_finish(pair[0], 0);
    end_early = 0;

    int served = early ? 1 : 1 + waiting;
    const char *said = said_on(ends[1]);
    int ok = board[STATE_AT_ANSWER] == (early ? IDLE : BUSY) && answered == served &&
             record[STATE] == IDLE && record[SERVED] == (uint64_t)served &&
             record[NEXT] == (uint64_t)(served - 1) && looks == served && strcmp(said, "I") == 0;
    printf("%s: finish early, %d waiting, bound %llu: state at the answer %llu, answered %d, "
           "looks %d, said \"%s\" (want %s)\n",
           ok ? "ok" : "FAILED", waiting, (unsigned long long)bound,
           (unsigned long long)board[STATE_AT_ANSWER], answered, looks, said,
           early ? "idle, 1, 1, I" : "busy, 2, 2, I");
    unprepare_finish(client, ends, pair, 0);
    return ok;
}

/* The worker finishes connection fd, ending it early, with a share of
 * `share` connections (FORKPOOL_MAX_REQUESTS). */
static void finish_its_share(int fd, int share)
{
    max_requests = (uint64_t)share;
    end_early = 1;
    serve_and_finish(fd, 0);
}

/* A worker whose share (FORKPOOL_MAX_REQUESTS 1) this connection is stays
 * busy at its answer and leaves after it (busy, X), in a child. */
static int the_last_of_its_share_ends_busy(void)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    close(take(overflow_fd));
    record[STATE] = BUSY;
    board[STATE_AT_ANSWER] = IDLE;
    answered = 0;
    int status = exit_status_in_child(finish_its_share, pair[0], 1);
    const char *said = said_on(ends[1]);
    int ok = status == 0 && board[STATE_AT_ANSWER] == BUSY &&
             record[STATE] == BUSY && strcmp(said, "X") == 0;
    printf("%s: the last of its share: state at the answer %llu, exit %d, said \"%s\" "
           "(want busy, 0, X)\n",
           ok ? "ok" : "FAILED", (unsigned long long)board[STATE_AT_ANSWER], status, said);
    unprepare_finish(client, ends, pair, 1);
    return ok;
}

/* Quits with listener fd (and what waits on it) as its own socket,
 * ending each answer early. */
static void drain_from(int fd, int unused)
{
    (void)unused;
    if (dup2(fd, 3) < 0)
        die("dup2: %s", strerror(errno));
    end_early = 1;
    drain_and_quit();
}

/* Told to quit, the worker serves what the kernel queued on its own
 * socket busy: an answer's ending_connection there stores nothing.  In a
 * child (the drain exits), with a connection queued on its own socket
 * (descriptor 3). */
static int drains_busy(void)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    record[STATE] = BUSY;
    board[STATE_AT_ANSWER] = IDLE;
    answered = 0;
    int status = exit_status_in_child(drain_from, overflow_fd, 0);
    int ok = status == 0 && board[STATE_AT_ANSWER] == BUSY &&
             record[STATE] == BUSY && record[SERVED] == 1;
    printf("%s: a quit's drain: exit %d, state at the answer %llu, after %llu, served %llu "
           "(want 0, busy, busy, 1)\n",
           ok ? "ok" : "FAILED", status, (unsigned long long)board[STATE_AT_ANSWER], (unsigned long long)record[STATE],
           (unsigned long long)record[SERVED]);
    unprepare_finish(client, ends, pair, 1);
    return ok;
}

/* The worker finishes connection fd, ending it early, past a limit:
 * `memory`, 16 MiB above what it holds as it starts, and the answer keeps
 * 32 MiB more; else a lifetime of 1 ms, over before the answer. */
static void finish_past_a_limit(int fd, int memory)
{
    char number[32];
    if (memory) {
        snprintf(number, sizeof number, "%llu",
                 (unsigned long long)(unshared_memory() + (16 << 20)));
        setenv("FORKPOOL_MAX_CHILD_MEMORY", number, 1);
        grow_mib = 32;
    } else {
        setenv("FORKPOOL_MAX_CHILD_LIFETIME_MS", "1", 1);
    }
    start_limits();
    struct timespec ms = { 0, 2000000L };
    nanosleep(&ms, NULL);
    end_early = 1;
    serve_and_finish(fd, 0);
}

/* A worker past its memory (`memory`) or lifetime limit as a connection
 * ends stays busy at its answer, says X after it and then waits, still
 * there, until the supervisor lets it go (here with Q): exit 0.  In a
 * child, nothing waiting on the overflow. */
static int leaves_past_a_limit(int memory)
{
    int client, ends[2], pair[2];
    prepare_finish(&client, ends, pair);
    close(take(overflow_fd));
    record[STATE] = BUSY;
    board[STATE_AT_ANSWER] = IDLE;
    record[SERVED] = 0;
    answered = 0;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        finish_past_a_limit(pair[0], memory);
        _exit(3);
    }
    struct pollfd p = { .fd = ends[1], .events = POLLIN };
    char kind = 0;
    int said_x = poll(&p, 1, 5000) == 1 && recv(ends[1], &kind, 1, 0) == 1 && kind == 'X';
    struct timespec while_ = { 0, 100000000L };
    nanosleep(&while_, NULL);
    int status = 0;
    int waited = waitpid(pid, &status, WNOHANG) == 0;
    if (send(ends[1], "\x01Q", 2, 0) != 2)
        die("send: %s", strerror(errno));
    if (waited && waitpid(pid, &status, 0) != pid)
        die("waitpid: %s", strerror(errno));
    int ok = said_x && waited && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
             board[STATE_AT_ANSWER] == BUSY && record[STATE] == BUSY && record[SERVED] == 1;
    printf("%s: past its %s limit: said X %d, waited %d, exit %d, state at the answer %llu, "
           "after %llu (want 1, 1, 0, busy, busy)\n",
           ok ? "ok" : "FAILED", memory ? "memory" : "lifetime", said_x, waited,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           (unsigned long long)board[STATE_AT_ANSWER], (unsigned long long)record[STATE]);
    unprepare_finish(client, ends, pair, 1);
    return ok;
}

/* When smaps_rollup is read (rollup_due, memory_past), in small units, to
 * go through every case.  The rule in other words: a read is due unless
 * there was one, less than SMAPS_REREAD_NS ago, and what the unshared size
 * was then plus what the resident size has grown since stays below the
 * limit. */
enum { LIMIT = 8 };
#define MS 1000000LL

static int could_pass(uint64_t limit, uint64_t rss, const struct rollup_read *last, int64_t now)
{
    if (!last->read)
        return 1;
    uint64_t grown = rss > last->rss ? rss - last->rss : 0;
    return last->uss + grown >= limit || !(now - last->at_ns < SMAPS_REREAD_NS) ? 1 : 0;
}

static int the_rule_over_every_small_case(void)
{
    static const int64_t times[] = { 0, 50 * MS, SMAPS_REREAD_NS - 1, SMAPS_REREAD_NS, 300 * MS };
    int cases = 0, wrong = 0;
    for (uint64_t uss = 0; uss <= LIMIT + 2; uss++)
        for (uint64_t rss_then = LIMIT; rss_then <= 2 * LIMIT + 1; rss_then++)
            for (uint64_t rss = LIMIT + 1; rss < 3 * LIMIT; rss++)
                for (size_t t = 0; t < sizeof times / sizeof *times; t++) {
                    struct rollup_read last = { 1, uss, rss_then, 0 };
                    int due = rollup_due(LIMIT, rss, &last, times[t]) != 0;
                    cases++;
                    if (due != could_pass(LIMIT, rss, &last, times[t]) && wrong++ < 5)
                        printf("  uss %llu, rss %llu -> %llu, %lld ns: wrong\n",
                               (unsigned long long)uss, (unsigned long long)rss_then,
                               (unsigned long long)rss, (long long)times[t]);
                }
    struct rollup_read none = { 0 };
    for (uint64_t rss = LIMIT + 1; rss <= 3 * LIMIT; rss++)
        wrong += !rollup_due(LIMIT, rss, &none, 0);
    /* The edges, in MiB: 40 of USS at 100 of RSS, a 64 limit. */
    uint64_t mib = 1 << 20;
    struct rollup_read last = { 1, 40 * mib, 100 * mib, 0 };
    struct rollup_read full = { 1, 64 * mib, 100 * mib, 0 };
    int edges = !rollup_due(64 * mib, 123 * mib, &last, 99 * MS) && /* 23 more cannot pass 24 */
                rollup_due(64 * mib, 124 * mib, &last, 0) &&        /* 24 more could */
                !rollup_due(64 * mib, 90 * mib, &last, 50 * MS) &&  /* RSS fell */
                rollup_due(64 * mib, 100 * mib, &last, SMAPS_REREAD_NS) && /* 100 ms on */
                rollup_due(64 * mib, 90 * mib, &full, 0);           /* no room left */
    int ok = wrong == 0 && edges;
    printf("%s: the rule over %d small cases: %d wrong; the edges %s\n", ok ? "ok" : "FAILED",
           cases, wrong, edges ? "right" : "WRONG");
    return ok;
}

/* A worker's memory: private pages (the unshared size) and shared ones
 * (the resident size is both), and its reads. */
static uint64_t model_private, model_reads;

static uint64_t model_read(void)
{
    model_reads++;
    return model_private;
}

/* Runs connections, {alloc, free, cow, took ms} each, on a worker and
 * checks each look: never past while USS is not; once USS is past, found
 * at the first look with no copy-on-write break since the last read, or
 * SMAPS_REREAD_NS after it; no read with RSS at or under the limit.
 * Whether all held. */
static int run_connections(uint64_t private, uint64_t shared, int (*steps)[4], int n)
{
    struct rollup_read last = { 0 };
    int64_t now = 100000 * MS;
    int cow_since_read = 0;
    model_private = private;
    for (int i = 0; i < n; i++) {
        struct rollup_read before = last;
        uint64_t reads = model_reads;
        uint64_t freed = (uint64_t)steps[i][1];
        if (freed > model_private)
            freed = model_private;
        model_private += (uint64_t)steps[i][0] - freed;
        uint64_t cow = (uint64_t)steps[i][2] < shared ? (uint64_t)steps[i][2] : shared;
        shared -= cow;
        model_private += cow;
        cow_since_read |= cow > 0;
        now += steps[i][3] * MS;
        uint64_t rss = model_private + shared;
        uint64_t found = memory_past(LIMIT, rss, &last, now, model_read);
        int read = model_reads > reads;
        if (read && rss <= LIMIT)
            return 0;
        if (read)
            cow_since_read = 0;
        int stale = !before.read || now - before.at_ns >= SMAPS_REREAD_NS;
        if (model_private > LIMIT) {
            if ((!cow_since_read || stale) && found != model_private)
                return 0;
        } else if (found) {
            return 0;
        }
        if (found)
            break;
    }
    return 1;
}

static int every_short_run_and_long_ones(void)
{
    /* Each connection: allocates 0, 1 or 4, frees 0 or 2, breaks 0 or 3
     * copy-on-write, takes 0, 40 or 100 ms. */
    int kinds[36][4], k = 0;
    for (int a = 0; a < 3; a++)
        for (int f = 0; f < 2; f++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 3; t++) {
                    kinds[k][0] = (int[]){ 0, 1, 4 }[a];
                    kinds[k][1] = f * 2;
                    kinds[k][2] = c * 3;
                    kinds[k][3] = (int[]){ 0, 40, 100 }[t];
                    k++;
                }
    static const uint64_t starts[][2] = { { 0, 0 }, { 2, 10 }, { 7, 4 }, { 5, 20 } };
    int runs = 0, bad = 0;
    for (size_t s = 0; s < 4; s++)
        for (int a = 0; a < 36; a++)
            for (int b = 0; b < 36; b++)
                for (int c = 0; c < 36; c++) {
                    int run[3][4];
                    memcpy(run[0], kinds[a], sizeof run[0]);
                    memcpy(run[1], kinds[b], sizeof run[1]);
                    memcpy(run[2], kinds[c], sizeof run[2]);
                    runs++;
                    bad += !run_connections(starts[s][0], starts[s][1], run, 3);
                }
    /* Longer runs, seeded. */
    unsigned seed = 44;
    int long_bad = 0;
    for (int r = 0; r < 2000; r++) {
        int run[60][4], n = 1 + (int)(rand_r(&seed) % 60);
        for (int i = 0; i < n; i++) {
            run[i][0] = (int[]){ 0, 0, 1, 3 }[rand_r(&seed) % 4];
            run[i][1] = (int[]){ 0, 0, 2 }[rand_r(&seed) % 3];
            run[i][2] = (int[]){ 0, 0, 0, 0, 2 }[rand_r(&seed) % 5];
            run[i][3] = (int[]){ 1, 10, 30 }[rand_r(&seed) % 3];
        }
        uint64_t private = rand_r(&seed) % 8, shared = rand_r(&seed) % 30;
        long_bad += !run_connections(private, shared, run, n);
    }
    int ok = bad == 0 && long_bad == 0;
    printf("%s: looks over every run of 3 connections (%d) and 2000 longer ones: %d and %d "
           "went wrong\n", ok ? "ok" : "FAILED", runs, bad, long_bad);
    return ok;
}

/* A preloaded worker, RSS 30 over a limit of 8, USS 2, a connection every
 * millisecond for a second: at most 10 reads; and one growing fast, read
 * after each connection that could take it past. */
static int reads_every_100_ms_at_most_unless_it_grows(void)
{
    struct rollup_read last = { 0 };
    uint64_t found = 0;
    model_private = 2;
    model_reads = 0;
    for (int ms = 1; ms <= 1000; ms++)
        found |= memory_past(LIMIT, 30, &last, ms * MS, model_read);
    uint64_t preloaded = model_reads;
    /* RSS at the limit: nothing read; above it: USS 3; 6 more could pass
     * the 5 left, and do. */
    struct rollup_read grower = { 0 };
    model_reads = 0;
    model_private = 2;
    uint64_t at_limit = memory_past(LIMIT, 8, &grower, 1 * MS, model_read);
    uint64_t reads_at_limit = model_reads;
    model_private = 3;
    uint64_t above = memory_past(LIMIT, 9, &grower, 2 * MS, model_read);
    model_private = 9;
    uint64_t grown = memory_past(LIMIT, 15, &grower, 3 * MS, model_read);
    int ok = found == 0 && preloaded >= 1 && preloaded <= 10 && at_limit == 0 &&
             reads_at_limit == 0 && above == 0 && grown == 9 && model_reads == 2;
    printf("%s: a preloaded worker read %llu times in a second (want 1 to 10); one growing: "
           "%llu, %llu, %llu after %llu reads (want 0, 0, 9 after 2)\n",
           ok ? "ok" : "FAILED", (unsigned long long)preloaded, (unsigned long long)at_limit,
           (unsigned long long)above, (unsigned long long)grown, (unsigned long long)model_reads);
    return ok;
}

/* The real look (in a child: it sets the worker's limits): this process
 * holds more than 1 KiB of its own, so it is past that, and keeps the read;
 * under a petabyte, it reads nothing. */
static int the_real_look_keeps_its_read(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        setenv("FORKPOOL_MAX_CHILD_MEMORY", "1024", 1);
        start_limits();
        int past = past_a_limit() && last_rollup.read && last_rollup.uss > 1024;
        setenv("FORKPOOL_MAX_CHILD_MEMORY", "1125899906842624", 1);
        start_limits();
        int under = !past_a_limit() && !last_rollup.read;
        _exit(past && under ? 0 : 1);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid)
        die("waitpid: %s", strerror(errno));
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%s: the real look keeps its read\n", ok ? "ok" : "FAILED");
    return ok;
}

int main(void)
{
    map_a_board();
    int ok = 1;
    ok &= finish_with_bound(0, 1);   /* no bound: as before */
    ok &= finish_with_bound(3, 1);   /* the bound is above the slot */
    ok &= finish_with_bound(2, 0);   /* the slot is the bound */
    ok &= finish_with_bound(1, 0);   /* the slot is beyond it */
    ok &= leaves_out_of_descriptors(1);
    ok &= leaves_out_of_descriptors(0);
    ok &= finishes_early(0, 0, 1);  /* nothing waits: idle before the answer */
    ok &= finishes_early(1, 0, 0);  /* one waits: the finish takes it */
    ok &= finishes_early(1, 2, 1);  /* one waits, outside the width: not its business */
    ok &= the_last_of_its_share_ends_busy();
    ok &= drains_busy();
    ok &= leaves_past_a_limit(1);
    ok &= leaves_past_a_limit(0);
    ok &= the_rule_over_every_small_case();
    ok &= every_short_run_and_long_ones();
    ok &= reads_every_100_ms_at_most_unless_it_grows();
    ok &= the_real_look_keeps_its_read();
    return ok ? 0 : 1;
}
