/*
 * add_header: the minimal libmilter filter forkpool's milter is measured
 * against and its mail tests are proven with.
 *
 * At end of message it adds one header, `X-Forkpool-Milter: <pid>`. It
 * rejects `RCPT TO:<reject@...>` with `550 5.7.1` (the rule of the example
 * rule file of `forkpool milter --example`), tempfails `MAIL
 * FROM:<tempfail@...>` with `451 4.7.1`, and quarantines a message with a
 * recipient `hold@...`: the rules the mail tests check, each met by a
 * different address so one filter serves them all. For benchmarks it can
 * spin the CPU for a few milliseconds per message, and abort() on one
 * message in N (a crash in a C library a filter calls), to measure what a
 * crash costs.
 *
 *   add_header -p PORT [-w WORK_US] [-c CRASH_EVERY]
 *
 * It listens on 127.0.0.1:PORT and prints `add_header: listening on PORT`
 * once the socket is bound, so a test knows when to connect.
 *
 * Build: cc -O2 -Wall -o add_header add_header.c -lmilter -lpthread
 */
#include <libmilter/mfapi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static long work_us;       /* CPU to spend per message, in microseconds */
static long crash_every;   /* abort() on every Nth message; 0: never */
static long messages_seen; /* messages at end of message, for crash_every */

/* Spins on the CPU for `us` microseconds of this thread's CPU time. */
static void spin(long us) {
    struct timespec start, now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    } while ((now.tv_sec - start.tv_sec) * 1000000L +
                 (now.tv_nsec - start.tv_nsec) / 1000L <
             us);
}

/* The conversation's private data: whether this message is to be held. */
static char hold_mark;

/* True when the address (with or without angle brackets) is local@... */
static int is_address(const char *addr, const char *local) {
    size_t n = strlen(local);
    if (*addr == '<')
        addr++;
    return strncasecmp(addr, local, n) == 0 && addr[n] == '@';
}

/*
 * The stages the rules do not look at still get a callback, so that the
 * MTA sends every command and waits for every reply, as it does for a
 * filter that inspects each stage (without one, libmilter asks the MTA to
 * skip the stage: SMFIP_NO*).
 */
static sfsistat on_connect(SMFICTX *ctx, char *host, _SOCK_ADDR *addr) {
    (void)ctx, (void)host, (void)addr;
    return SMFIS_CONTINUE;
}

static sfsistat on_helo(SMFICTX *ctx, char *name) {
    (void)ctx, (void)name;
    return SMFIS_CONTINUE;
}

static sfsistat on_header(SMFICTX *ctx, char *name, char *value) {
    (void)ctx, (void)name, (void)value;
    return SMFIS_CONTINUE;
}

static sfsistat on_body(SMFICTX *ctx, unsigned char *chunk, size_t len) {
    (void)ctx, (void)chunk, (void)len;
    return SMFIS_CONTINUE;
}

static sfsistat on_stage(SMFICTX *ctx) {
    (void)ctx;
    return SMFIS_CONTINUE;
}

static sfsistat on_unknown(SMFICTX *ctx, const char *command) {
    (void)ctx, (void)command;
    return SMFIS_CONTINUE;
}

static sfsistat on_mail(SMFICTX *ctx, char **argv) {
    smfi_setpriv(ctx, NULL);
    if (argv[0] != NULL && is_address(argv[0], "tempfail")) {
        smfi_setreply(ctx, "451", "4.7.1", "sender tempfailed by add_header");
        return SMFIS_TEMPFAIL;
    }
    return SMFIS_CONTINUE;
}

static sfsistat on_rcpt(SMFICTX *ctx, char **argv) {
    if (argv[0] != NULL && is_address(argv[0], "reject")) {
        smfi_setreply(ctx, "550", "5.7.1", "recipient rejected by add_header");
        return SMFIS_REJECT;
    }
    if (argv[0] != NULL && is_address(argv[0], "hold"))
        smfi_setpriv(ctx, &hold_mark);
    return SMFIS_CONTINUE;
}

static sfsistat on_abort(SMFICTX *ctx) {
    smfi_setpriv(ctx, NULL);
    return SMFIS_CONTINUE;
}

static sfsistat on_eom(SMFICTX *ctx) {
    char value[32];
    long n = __atomic_add_fetch(&messages_seen, 1, __ATOMIC_SEQ_CST);
    if (crash_every > 0 && n % crash_every == 0)
        abort();
    if (work_us > 0)
        spin(work_us);
    snprintf(value, sizeof value, "%ld", (long)getpid());
    if (smfi_addheader(ctx, "X-Forkpool-Milter", value) != MI_SUCCESS)
        return SMFIS_TEMPFAIL;
    if (smfi_getpriv(ctx) == &hold_mark) {
        smfi_setpriv(ctx, NULL);
        if (smfi_quarantine(ctx, "held by add_header") != MI_SUCCESS)
            return SMFIS_TEMPFAIL;
    }
    return SMFIS_CONTINUE;
}

static struct smfiDesc filter = {
    .xxfi_name = "add_header",
    .xxfi_version = SMFI_VERSION,
    .xxfi_flags = SMFIF_ADDHDRS | SMFIF_QUARANTINE,
    .xxfi_connect = on_connect,
    .xxfi_helo = on_helo,
    .xxfi_envfrom = on_mail,
    .xxfi_envrcpt = on_rcpt,
    .xxfi_header = on_header,
    .xxfi_eoh = on_stage,
    .xxfi_body = on_body,
    .xxfi_eom = on_eom,
    .xxfi_abort = on_abort,
    .xxfi_close = on_abort,
    .xxfi_unknown = on_unknown,
    .xxfi_data = on_stage,
};

static void usage(void) {
    fprintf(stderr, "usage: add_header -p PORT [-w WORK_US] [-c CRASH_EVERY]\n");
    exit(2);
}

int main(int argc, char **argv) {
    char conn[64];
    long port = 0;
    int opt;
    while ((opt = getopt(argc, argv, "p:w:c:")) != -1) {
        switch (opt) {
        case 'p': port = atol(optarg); break;
        case 'w': work_us = atol(optarg); break;
        case 'c': crash_every = atol(optarg); break;
        default: usage();
        }
    }
    if (port <= 0 || port > 65535)
        usage();
    snprintf(conn, sizeof conn, "inet:%ld@127.0.0.1", port);
    /* Room for the benchmark's thousands of conversations arriving at once. */
    if (smfi_setbacklog(4096) != MI_SUCCESS || smfi_setconn(conn) != MI_SUCCESS ||
        smfi_register(filter) != MI_SUCCESS || smfi_opensocket(1) != MI_SUCCESS) {
        fprintf(stderr, "add_header: cannot listen on %s\n", conn);
        return 1;
    }
    printf("add_header: listening on %ld\n", port);
    fflush(stdout);
    return smfi_main() == MI_SUCCESS ? 0 : 1;
}
