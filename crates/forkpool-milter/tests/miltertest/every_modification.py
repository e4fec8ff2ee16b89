"""Checks, with PyPI's `miltertest` (a pure-Python MTA side nobody here
wrote), what Debian's miltertest cannot: a changed envelope sender and a
recipient added with ESMTP arguments, a body replaced in several 64 KiB
chunks, and the text of a multi-line reply before end of message. The
filter is the one of tests/miltertest_every_modification.rs.

    python every_modification.py inet:PORT@127.0.0.1 | unix:PATH

Each failed check prints `check failed: NAME ...` (NAME is the filter's
mechanism, as in every_modification.lua) and exits 1.
"""

import socket
import sys

import miltertest as mt

# The replacement body the filter sends for a message to big-body@ (ASCII:
# this client decodes body chunks as text).
BIG_BODY = "".join("line %06d of the new body\r\n" % i for i in range(5000))


def check(ok, what, got=None):
    if not ok:
        print(f"check failed: {what}: got {got!r}")
        sys.exit(1)


def connect(where):
    if where.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(where[len("unix:"):])
    else:
        port, host = where[len("inet:"):].split("@")
        sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return mt.MilterConnection(sock)


def step(conn, want, cmd, **fields):
    """Sends one command; its reply must be `want`. Returns the reply."""
    reply = conn.send_get(cmd, **fields)
    check(reply[0] == want, f"reply to {cmd}", reply)
    return reply


def eom(conn):
    """End of message: the modifications, then the final reply."""
    conn._send(mt.SMFIC_BODYEOB)
    replies = []
    while True:
        reply = conn.recv()
        replies.append(reply)
        if reply[0] in (mt.SMFIR_CONTINUE, mt.SMFIR_ACCEPT, mt.SMFIR_REJECT,
                        mt.SMFIR_TEMPFAIL, mt.SMFIR_DISCARD, mt.SMFIR_REPLYCODE):
            return replies


def message(conn, recipient):
    """A message to `recipient`, up to its end; returns what EOM got."""
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_MAIL, args=["<sender@forkpool.test>"])
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_RCPT, args=[recipient])
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_DATA)
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_HEADER, name="Subject", value="original")
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_EOH)
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_BODY, buf="old body\r\n")
    return eom(conn)


def main():
    conn = connect(sys.argv[1])
    # No SMFIF_SETSYMLIST: this client cannot decode the macro lists a
    # filter adds to its negotiation reply when offered it.
    actions, _ = conn.optneg_mta(actions=mt.SMFI_V6_ACTS & ~mt.SMFIF_SETSYMLIST)
    wanted = mt.SMFIF_CHGFROM | mt.SMFIF_ADDRCPT_PAR | mt.SMFIF_CHGBODY
    check(actions & wanted == wanted, "negotiate", hex(actions))
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_CONNECT, hostname="client.forkpool.test",
         family="4", port=25, address="127.0.0.1")
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_HELO, helo="client.forkpool.test")

    # A multi-line reply at RCPT: each line but the last continued by "-".
    step(conn, mt.SMFIR_CONTINUE, mt.SMFIC_MAIL, args=["<sender@forkpool.test>"])
    reply = conn.send_get(mt.SMFIC_RCPT, args=["<reply@forkpool.test>"])
    check(reply[0] == mt.SMFIR_REPLYCODE, "rcpt-reply", reply)
    text = reply[1]["smtpcode"] + reply[1]["space"] + reply[1]["text"]
    check(text == "550-5.7.1 first line\r\n550 5.7.1 second line", "rcpt-reply text", text)
    conn._send(mt.SMFIC_ABORT)

    # every@: the sender changed and a recipient added, both with ESMTP
    # arguments.
    got = {r[0]: r[1] for r in message(conn, "<every@forkpool.test>")}
    check(got.get(mt.SMFIR_CHGFROM) == {"from": "<new-sender@forkpool.test>", "args": ["SIZE=100"]},
          "change-from with ESMTP arguments", got.get(mt.SMFIR_CHGFROM))
    check(got.get(mt.SMFIR_ADDRCPT_PAR) == {"rcpt": "<added-par@forkpool.test>",
                                            "args": ["NOTIFY=NEVER"]},
          "add-rcpt with ESMTP arguments", got.get(mt.SMFIR_ADDRCPT_PAR))
    check(mt.SMFIR_CONTINUE in got, "eom every@", list(got))

    # big-body@: the new body in chunks of at most 65535 bytes, in order.
    replies = message(conn, "<big-body@forkpool.test>")
    chunks = [r[1]["buf"] for r in replies if r[0] == mt.SMFIR_REPLBODY]
    sizes = [len(c) for c in chunks]
    check(sizes == [65535, 65535, len(BIG_BODY) - 2 * 65535], "replace-body in chunks", sizes)
    check("".join(chunks) == BIG_BODY, "replace-body content", len("".join(chunks)))
    check(replies[-1][0] == mt.SMFIR_CONTINUE, "eom big-body@", replies[-1])

    conn._send(mt.SMFIC_QUIT)
    print("every check passed")


main()
