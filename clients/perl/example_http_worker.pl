#!/usr/bin/env perl
# An HTTP worker for `forkpool run`, answering like `forkpool demo`.
#
#     forkpool run --listen 127.0.0.1:8080 -- \
#         perl clients/perl/example_http_worker.pl
#     curl -i 'http://127.0.0.1:8080/?work_ms=100'
#
# Any GET answers `hello`; `?work_ms=N` sleeps N ms first (a slow handler).
# Every response names the worker in X-Forkpool-Slot and X-Forkpool-Pid and
# closes the connection. The worker serves whichever dispatch mode the pool
# runs (FORKPOOL_DISPATCH): `handoff` (the default), `order` or `shared`;
# `handoff` needs syscall.ph (see Forkpool/Worker.pm).
#
# With --chaos (fault-injection tests only), ?chaos=garbage makes the worker
# write a malformed message on its back-channel and ?chaos=exit makes it
# exit in the middle of the request.

use strict;
use warnings;

use FindBin;
use lib $FindBin::Bin;

use Forkpool::Worker;
use IO::Select;
use POSIX ();
use Time::HiRes ();

use constant MAX_HEAD    => 8192;
use constant MAX_WORK_MS => 60_000;

my $chaos = grep { $_ eq '--chaos' } @ARGV;

my $worker = eval { Forkpool::Worker->from_env };
unless ($worker) {
    print STDERR "example_http_worker: $@";
    exit 2;
}

$worker->serve(sub {
    my ($conn) = @_;
    my $head = read_head($conn);
    return unless defined $head;
    my ($target) = $head =~ m{^\S+\s+(\S+)};
    my %query = map { split /=/, $_, 2 } grep { /=/ } split /&/,
        ((($target // '/') =~ /\?(.*)$/)[0] // '');
    my $what = $chaos ? $query{chaos} // '' : '';
    POSIX::_exit(3) if $what eq 'exit';
    my $work_ms = ($query{work_ms} // '') =~ /^(\d+)$/ ? $1 : 0;
    $work_ms = MAX_WORK_MS if $work_ms > MAX_WORK_MS;
    Time::HiRes::sleep($work_ms / 1000) if $work_ms;
    my $body = "hello\n";
    print {$conn} "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
        . 'Content-Length: ' . length($body) . "\r\n"
        . 'X-Forkpool-Slot: ' . $worker->slot . "\r\n"
        . 'X-Forkpool-Pid: ' . $worker->pid . "\r\n"
        . "Connection: close\r\n\r\n$body";
    # After the response, so the client gets it before the supervisor
    # kills this worker for what follows.
    send($worker->channel, "\x01Zjunk", 0) if $what eq 'garbage';    # no kind 'Z'
});
exit 0;

# The request head, or undef if the client hung up or stayed silent 5 s.
sub read_head {
    my ($conn) = @_;
    my $select = IO::Select->new($conn);
    my $head = '';
    while (index($head, "\r\n\r\n") < 0 && length($head) < MAX_HEAD) {
        return undef unless $select->can_read(5);
        my $n = sysread($conn, $head, 2048, length $head);
        return undef unless $n;
    }
    return $head;
}
