#!/usr/bin/env perl
# An HTTP worker for `forkpool run`, answering like `forkpool demo`.
#
#     forkpool run --listen 127.0.0.1:8080 -- \
#         perl clients/perl/example_http_worker.pl
#     curl -i 'http://127.0.0.1:8080/?work_ms=100'
#
# Any GET answers `hello`; `?work_ms=N` sleeps N ms first (a slow handler).
# Every response names the worker in X-Forkpool-Slot and X-Forkpool-Pid and
# closes the connection. The whole request must arrive within 5 s (408),
# its head within 8 KiB (431) and its body within 1 MiB (413); the body is
# read and dropped, never held. The worker serves whichever dispatch mode the pool
# runs (FORKPOOL_DISPATCH): `handoff` (the default), `order` or `shared`;
# `handoff` needs syscall.ph (see Forkpool/Worker.pm).
#
# With --chaos (fault-injection tests only), ?chaos=garbage makes the worker
# write a malformed message on its back-channel, ?chaos=exit makes it
# exit in the middle of the request, ?leak_fds=N (at most 1000) makes
# it open N descriptors of /dev/null and keep them for the life of the
# process, as a leaking app does (500 if one cannot be opened), and
# ?grow_mib=N (at most 1024) makes it keep N MiB more of memory it has
# written to (its own, unshared) for the life of the process, as an app
# that leaks memory does.

use strict;
use warnings;

use FindBin;
use lib $FindBin::Bin;

use Forkpool::HTTP qw(find_head_end parse_head body_framing response_head);
use Forkpool::Worker;
use IO::Select;
use POSIX ();
use Time::HiRes ();

use constant MAX_HEAD     => 8192;       # bytes of request head
use constant HEAD_SECONDS => 5;          # for the whole head, not per read
use constant MAX_BODY     => 1 << 20;    # bytes of request body, read and dropped
use constant MAX_WORK_MS  => 60_000;
use constant MAX_LEAK     => 1000;
use constant MAX_GROW_MIB => 1024;

my $chaos = grep { $_ eq '--chaos' } @ARGV;
# What ?leak_fds=N opened (with --chaos), never closed.
my @leaked;
# What ?grow_mib=N kept (with --chaos), never freed.
my @grown;

my $worker = eval { Forkpool::Worker->from_env };
unless ($worker) {
    print STDERR "example_http_worker: $@";
    exit 2;
}

$worker->serve(sub {
    my ($conn) = @_;
    my ($req, $status, $why) = read_request($conn);
    return unless $req || $status;    # the client left
    return answer($conn, $status, "$why\n") unless $req;
    my %query = map { split /=/, $_, 2 } grep { /=/ } split /&/, $req->{query};
    my $what = $chaos ? $query{chaos} // '' : '';
    POSIX::_exit(3) if $what eq 'exit';
    my $work_ms = ($query{work_ms} // '') =~ /^(\d+)$/ ? $1 : 0;
    $work_ms = MAX_WORK_MS if $work_ms > MAX_WORK_MS;
    Time::HiRes::sleep($work_ms / 1000) if $work_ms;
    my $leak = $chaos && ($query{leak_fds} // '') =~ /^(\d+)$/ ? $1 : 0;
    $leak = MAX_LEAK if $leak > MAX_LEAK;
    for (1 .. $leak) {
        open(my $null, '<', '/dev/null') or return answer($conn, 500, "/dev/null: $!\n");
        push @leaked, $null;
    }
    my $grow = $chaos && ($query{grow_mib} // '') =~ /^(\d+)$/ ? $1 : 0;
    $grow = MAX_GROW_MIB if $grow > MAX_GROW_MIB;
    # Written to, so the pages are resident and this process's own.
    push @grown, "\x01" x ($grow << 20) if $grow;
    answer($conn, 200, "hello\n");
    # After the response, so the client gets it before the supervisor
    # kills this worker for what follows.
    send($worker->channel, "\x01Zjunk", 0) if $what eq 'garbage';    # no kind 'Z'
});
exit 0;

sub answer {
    my ($conn, $status, $body) = @_;
    print {$conn} response_head($status, [
        'Content-Type'    => 'text/plain',
        'Content-Length'  => length $body,
        'X-Forkpool-Slot' => $worker->slot,
        'X-Forkpool-Pid'  => $worker->pid,
        'Connection'      => 'close',
    ]) . $body;
    return;
}

# The parsed request, its body read and dropped; or (undef, STATUS, WHY)
# for a request to refuse; or nothing if the client left. The whole
# request must arrive within HEAD_SECONDS of the connection: a per-read
# timeout would let a client that sends a byte now and then hold the
# worker for ever. A body is read in pieces and never kept, and one
# declared larger than MAX_BODY is refused before a byte of it is read.
sub read_request {
    my ($conn) = @_;
    my $deadline = Time::HiRes::time() + HEAD_SECONDS;
    my $select = IO::Select->new($conn);
    my $buf = '';
    my $end;
    while (($end = find_head_end($buf)) < 0) {
        return (undef, 431, 'request head too large') if length $buf > MAX_HEAD;
        my $left = $deadline - Time::HiRes::time();
        return (undef, 408, 'request head too slow') unless $left > 0 && $select->can_read($left);
        my $n = sysread($conn, $buf, 4096, length $buf);
        return unless $n;
    }
    my ($req, $status, $why) = parse_head(substr($buf, 0, $end, ''));
    return (undef, $status, $why) unless $req;
    my ($framing, $length, $framing_why) = body_framing($req, MAX_BODY);
    return (undef, $length, $framing_why) unless defined $framing;
    return (undef, 411, 'chunked bodies are not accepted here') if $framing eq 'chunked';
    my $left = $framing eq 'length' ? $length - length $buf : 0;
    while ($left > 0) {
        my $wait = $deadline - Time::HiRes::time();
        return (undef, 408, 'request body too slow') unless $wait > 0 && $select->can_read($wait);
        my $n = sysread($conn, my $piece, $left < 65536 ? $left : 65536);
        return unless $n;
        $left -= $n;
    }
    return $req;
}
