/* forkpool_worker.h - what forkpool_worker.c (the protocol and the HTTP
 * answer) shares with kernel_dispatch.c (the `kernel` dispatch loop). */
#ifndef FORKPOOL_WORKER_H
#define FORKPOOL_WORKER_H

#include <stddef.h>
#include <stdint.h>

extern int chan;           /* the back-channel's descriptor */
extern const char *slot;   /* FORKPOOL_SLOT, for messages and the header */
extern long listen_fds;    /* LISTEN_FDS: listeners per kind */

/* Prints why to stderr (with the slot and pid) and exits 2. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Sends one message of the back-channel protocol. */
void send_msg(char kind, const unsigned char *payload, size_t len);
/* Reads one message (0 = end of file); *fd_out gets a descriptor or -1. */
size_t recv_msg(unsigned char *buf, int *fd_out);
/* Answers one HTTP request on a blocking connected socket (no shutdown:
 * the caller closes it when it likes). */
void answer_request(int fd);
void put_u32(unsigned char *p, uint32_t v);
/* If message m (n bytes) is a ping, answers it and returns 1; else 0. */
int answer_ping(const unsigned char *m, size_t n);
/* After a connection: 1 when the descriptor table is filling up (the
 * descriptor at the reserve below RLIMIT_NOFILE is open), said on stderr:
 * the worker is to leave.  0 while there is room. */
int check_headroom(void);
/* After an accept failed (errno): 1 when it ran out of descriptors or
 * memory, said on stderr: the worker is to leave, not retry.  0 for the
 * others (none waits, or that one is gone). */
int accept_exhausted(void);

/* `kernel` dispatch: runs the worker until told to quit; returns the exit
 * status. */
int kernel_main(void);
/* Just before a connection's answer is written: in `kernel` dispatch the
 * worker goes idle now (docs/protocol.md, step 7 of the `K` worker); a
 * no-op in every other mode. */
void ending_connection(void);

#endif
