# Unit tests of "finish early" in kernel dispatch (docs/protocol.md, step 7
# of a `K` worker's life): Forkpool::Worker's ending_connection, called by
# a server just before a connection's last answer goes out, and the finish
# in Forkpool::Worker::Kernel that follows it; and the memory and lifetime
# limits the worker checks at that point. No supervisor: the channel
# is a socketpair whose other end the test reads, the overflow a loopback
# listener, the scoreboard a file mapped like the board (as in board.t).
# `prove -I clients/perl clients/perl/t`.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..", "$FindBin::Bin/lib";

use File::Temp ();
use IO::Socket::INET;
use POSIX ();
use Time::HiRes ();
use Socket qw(AF_UNIX SOCK_SEQPACKET SOCK_STREAM);
use Test::More;
use Forkpool::Board;
use Forkpool::Worker;
use Forkpool::Worker::Kernel;
use SupervisorEnd qw(messages);

plan skip_all => 'Forkpool::Board needs a 64-bit perl on Linux with syscall.ph'
    unless defined Forkpool::Worker::syscall_number('mmap');

use constant SLOT   => 1;
use constant SLOTS  => 2;
use constant RECORD => 8 + 4 * SLOT;

# A board file: magic, the slot count, the header words given, 0 elsewhere.
sub board_file {
    my (%words) = @_;
    my $fh = File::Temp->new;
    my @words = (unpack('Q<', 'fkpbrd01'), SLOTS, (0) x (6 + 4 * SLOTS));
    $words[$_] = $words{$_} for keys %words;
    syswrite($fh, pack('Q<*', @words) . "\0" x (4096 - 8 * @words)) or die "write: $!";
    return $fh;
}

# This slot's record: state, taken, served, next.
sub record {
    my ($fh) = @_;
    sysseek($fh, 8 * RECORD, 0) or die "seek: $!";
    sysread($fh, my $bytes, 32) == 32 or die "read: $!";
    return [unpack('Q<*', $bytes)];
}

# A kernel-dispatch worker on a board with the header words given, its
# overflow listener holding $waiting connections, having taken one
# connection from its own socket: (the worker, the board file, the
# supervisor's end of the channel, the connection, what must stay alive).
sub a_worker {
    my ($waiting, %words) = @_;
    my $fh = board_file(%words);
    my $board = Forkpool::Board->open(fileno($fh), SLOT, \&Forkpool::Worker::syscall_number);
    socketpair(my $channel, my $supervisor, AF_UNIX, SOCK_SEQPACKET, 0)
        or die "socketpair: $!";
    my $overflow = IO::Socket::INET->new(
        Listen => 4, LocalAddr => '127.0.0.1', LocalPort => 0) or die "listen: $!";
    $overflow->blocking(0);    # as the supervisor's are
    my @clients = map {
        IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $overflow->sockport)
            or die "connect: $!"
    } 1 .. $waiting;
    socketpair(my $conn, my $peer, AF_UNIX, SOCK_STREAM, 0) or die "socketpair: $!";
    my $bits = '';
    vec($bits, fileno($_), 1) = 1 for $channel, $overflow;
    # As Forkpool::Worker::Kernel::serve sets a worker up.
    my $self = bless {
        board => $board, channel => $channel, dispatch => 'kernel', version => 1,
        overflow => [$overflow], finish_bits => [$bits],
    }, 'Forkpool::Worker';
    $board->took;
    return ($self, $fh, $supervisor, $conn, [$peer, @clients]);
}

# Serves one connection with a handler that calls ending_connection, then
# runs $after; returns (what _serve returned, the record the handler saw
# right after its ending_connection, connections handled).
sub serve_ending {
    my ($self, $fh, $conn, $after) = @_;
    my ($seen, $handled);
    my $served = Forkpool::Worker::Kernel::_serve($self, $conn, 0, sub {
        $handled++;
        return if $handled > 1;    # the overflow's: a plain connection
        $self->ending_connection;
        $seen = record($fh);
        $after->() if $after;
    });
    return ($served, $seen, $handled);
}

subtest 'idle before the answer, served counted once, one I' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0, 2 => 1);    # word 2: I asked
    my ($served, $seen, $handled) = serve_ending($self, $fh, $conn);
    ok($served, 'serves on');
    is($handled, 1, 'one connection');
    is_deeply($seen, [1, 1, 1, 0], 'idle and counted while the answer is still to go');
    is_deeply(record($fh), [1, 1, 1, 0], 'the finish counts nothing more');
    is(messages($supervisor), 'I', 'one I');
};

subtest 'a connection waiting on the overflow: busy to the finish, which takes it' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(1);
    my ($served, $seen, $handled) = serve_ending($self, $fh, $conn);
    ok($served, 'serves on');
    is_deeply($seen, [0, 1, 0, 0], 'still busy after ending_connection');
    is($handled, 2, 'the overflow\'s taken at the finish');
    is_deeply(record($fh), [1, 2, 2, 1], 'idle after both, one of them next');
};

subtest 'outside the dispatch width, the overflow is not its business: idle early' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(1, 5 => SLOT);
    my ($served, $seen, $handled) = serve_ending($self, $fh, $conn);
    is_deeply($seen, [1, 1, 1, 0], 'idle early');
    is($handled, 1, 'the overflow\'s left to the others');
};

subtest 'leaving after all (asked after the answer): busy again, then X' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
    my ($served, $seen) = serve_ending($self, $fh, $conn, sub { $self->leave });
    ok(!$served, 'leaves');
    is_deeply($seen, [1, 1, 1, 0], 'it had gone idle');
    is_deeply(record($fh), [0, 1, 1, 0], 'busy, served counted once');
    is(messages($supervisor), 'X', 'X');
};

subtest 'a worker that leaves after this connection never goes idle' => sub {
    for my $case (['asked to leave', sub { $_[0]->leave }],
                  ['its share served', sub { $_[0]{max_requests} = 1 }]) {
        my ($why, $set) = @$case;
        my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
        $set->($self);
        my ($served, $seen) = serve_ending($self, $fh, $conn);
        ok(!$served, "$why: leaves");
        is_deeply($seen, [0, 1, 0, 0], "$why: busy after ending_connection");
        is_deeply(record($fh), [0, 1, 1, 0], "$why: busy, served 1");
        is(messages($supervisor), 'X', "$why: X");
    }
};

subtest 'one look at the descriptor table a connection' => sub {
    for my $waiting (0, 1) {
        my ($self, $fh, $supervisor, $conn, $keep) = a_worker($waiting);
        my $looks = 0;
        no warnings 'redefine';
        local *Forkpool::Worker::check_headroom = sub { $looks++ };
        my (undef, undef, $handled) = serve_ending($self, $fh, $conn);
        is($looks, $handled, "$waiting waiting: one look for each of $handled connection(s)");
    }
};

subtest 'told to quit, it serves what was queued busy: no early idle' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
    my $own = IO::Socket::INET->new(
        Listen => 4, LocalAddr => '127.0.0.1', LocalPort => 0) or die "listen: $!";
    $own->blocking(0);
    my $client = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $own->sockport)
        or die "connect: $!";
    $self->{listeners} = [$own];
    my @seen;
    Forkpool::Worker::Kernel::_drain($self, sub {
        $self->ending_connection;
        push @seen, record($fh)->[0];
    });
    is_deeply(\@seen, [0], 'busy at the answer');
    is(record($fh)->[0], 0, 'busy after');
};

# The memory and lifetime limits a worker checks itself after each
# connection (FORKPOOL_MAX_CHILD_MEMORY, FORKPOOL_MAX_CHILD_LIFETIME_MS).
my @grown;    # what the handlers below keep

# Serves one connection whose handler keeps $grow MiB more and, if
# $ending, calls ending_connection; (what _serve returned, the state the
# handler saw after it).
sub serve_growing {
    my ($self, $fh, $conn, $grow, $ending) = @_;
    my $seen;
    my $served = Forkpool::Worker::Kernel::_serve($self, $conn, 0, sub {
        push @grown, "\x01" x ($grow << 20) if $grow;
        $self->ending_connection if $ending;
        $seen = record($fh)->[0];
    });
    return ($served, $seen);
}

subtest 'past its memory limit: busy, served, X; no early idle' => sub {
    for my $ending (0, 1) {
        my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
        $self->{max_memory} = Forkpool::Worker::Kernel::unshared_memory() + (32 << 20);
        Forkpool::Worker::Kernel::_start_limits($self);
        my ($served, $seen) = serve_growing($self, $fh, $conn, 64, $ending);
        ok(!$served, "ending $ending: leaves");
        is($seen, 0, "ending $ending: busy at the answer");
        is_deeply(record($fh), [0, 1, 1, 0], "ending $ending: busy, served 1");
        is(messages($supervisor), 'X', "ending $ending: X");
        is($self->{past_limit}, 'memory', "ending $ending: for its memory");
    }
};

subtest 'under its memory limit: idle as ever' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
    $self->{max_memory} = Forkpool::Worker::Kernel::unshared_memory() + (64 << 20);
    Forkpool::Worker::Kernel::_start_limits($self);
    my ($served, $seen) = serve_growing($self, $fh, $conn, 16, 1);
    ok($served, 'serves on');
    is($seen, 1, 'idle early');
    ok(!$self->{past_limit}, 'past no limit');
};

subtest 'past its lifetime: the connection served, then X' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
    $self->{lifetime_ms} = 20;
    Forkpool::Worker::Kernel::_start_limits($self);
    Time::HiRes::sleep(0.03);
    my ($served, $seen) = serve_growing($self, $fh, $conn, 0, 1);
    ok(!$served, 'leaves');
    is($seen, 0, 'busy at the answer');
    is(messages($supervisor), 'X', 'X');
    is($self->{past_limit}, 'lifetime', 'for its age');
};

subtest 'without limits, nothing to look at' => sub {
    my ($self) = a_worker(0);
    Forkpool::Worker::Kernel::_start_limits($self);
    ok(!exists $self->{limits}, 'no check started');
    ok(!Forkpool::Worker::Kernel::_past_limit($self), 'past none');
};

subtest 'after its X for a limit, it waits until the supervisor lets it go' => sub {
    my ($self, $fh, $supervisor, $conn, $keep) = a_worker(0);
    send($supervisor, "\x01p\x00\x00\x00\x01", 0);    # before it read the X: ignored
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        Forkpool::Worker::Kernel::_await_release($self);
        POSIX::_exit(0);
    }
    Time::HiRes::sleep(0.1);
    is(waitpid($pid, POSIX::WNOHANG()), 0, 'still waiting');
    shutdown($supervisor, 1) or die "shutdown: $!";
    my $deadline = time + 10;
    Time::HiRes::sleep(0.01) while waitpid($pid, POSIX::WNOHANG()) == 0 && time < $deadline;
    kill 'KILL', $pid if kill 0, $pid;
    is($?, 0, 'let go at end of file');
};

subtest 'outside kernel dispatch: nothing to do' => sub {
    my $self = bless { dispatch => 'handoff' }, 'Forkpool::Worker';
    ok(eval { $self->ending_connection; 1 }, 'no board, no error') or diag $@;
};

done_testing;
