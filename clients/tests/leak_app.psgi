# A PSGI app that leaks a descriptor on every request (tests only): each
# request opens /dev/null and never closes it, as a handler with a leak
# does; the answer is the worker's pid, or 500 with the error once an open
# fails. tests/leaky_apps.rs serves it kept alive under a small
# RLIMIT_NOFILE. Core modules only.
use strict;
use warnings;

use POSIX ();

my @leaked;

sub {
    my $fd = POSIX::open('/dev/null', POSIX::O_RDONLY());
    return [500, ['Content-Type' => 'text/plain'], ["$!\n"]] unless defined $fd;
    push @leaked, $fd;
    return [200, ['Content-Type' => 'text/plain'], ["$$\n"]];
};
