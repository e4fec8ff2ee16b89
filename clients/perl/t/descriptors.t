# Unit tests of a worker running out of descriptors (docs/protocol.md,
# "Running out of descriptors"), without a supervisor: the channel is a
# socketpair whose other end the test reads, the pool's listener a
# loopback socket with a connection waiting, the scoreboard (kernel
# dispatch) a file mapped like the board, as in board.t. A case that needs
# a full table runs in a child with a low RLIMIT_NOFILE. `prove -I
# clients/perl clients/perl/t`.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..", "$FindBin::Bin/lib";

use File::Temp ();
use IO::Socket::INET;
use POSIX ();
use Socket qw(AF_UNIX SOCK_SEQPACKET SOCK_STREAM);
use Test::More;
use Forkpool::Board;
use Forkpool::Worker;
use Forkpool::Worker::Kernel;
use SupervisorEnd qw(messages);

my $SETRLIMIT = Forkpool::Worker::syscall_number('setrlimit');
my $GETRLIMIT = Forkpool::Worker::syscall_number('getrlimit');
plan skip_all => 'these tests need a 64-bit perl on Linux with syscall.ph'
    unless defined $SETRLIMIT && defined $GETRLIMIT
    && defined Forkpool::Worker::syscall_number('mmap');

use constant RLIMIT_NOFILE => 7;
use constant SLOT          => 1;
# Closed in this test (checked below): a ceiling with room left.
use constant CLOSED_FD => 1000;

# Sets this process's soft RLIMIT_NOFILE.
sub set_nofile {
    my ($soft) = @_;
    my $limits = "\0" x 16;
    syscall($GETRLIMIT, RLIMIT_NOFILE, $limits) == 0 or die "getrlimit: $!";
    my (undef, $hard) = unpack('Q Q', $limits);
    syscall($SETRLIMIT, RLIMIT_NOFILE, pack('Q Q', $soft, $hard)) == 0
        or die "setrlimit: $!";
    return;
}

# Opens descriptors until the table is full; keeps them.
my @filled;
sub fill_table {
    while (defined(my $fd = POSIX::dup(0))) { push @filled, $fd }
    $!{EMFILE} or die "dup: $!";
    return;
}

# Runs $code in a child, with its warnings caught: (its exit status, what
# it returned, its warnings).
sub in_child {
    my ($code) = @_;
    pipe(my $from_child, my $to_parent) or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if ($pid == 0) {
        close($from_child);
        my $warned = '';
        local $SIG{__WARN__} = sub { $warned .= $_[0] };
        my $returned = eval { $code->() } // "died: $@";
        print {$to_parent} "$returned\n$warned";
        close($to_parent);
        POSIX::_exit(0);
    }
    close($to_parent);
    my ($returned, @warned) = <$from_child>;
    waitpid($pid, 0);
    chomp $returned if defined $returned;
    return ($?, $returned, join('', @warned));
}

# A board file: magic, 2 slots, every other word 0.
sub board_file {
    my $fh = File::Temp->new;
    my @words = (unpack('Q<', 'fkpbrd01'), 2, (0) x (6 + 4 * 2));
    syswrite($fh, pack('Q<*', @words) . "\0" x (4096 - 8 * @words)) or die "write: $!";
    return $fh;
}

# This slot's record: state, taken, served, next.
sub record {
    my ($fh) = @_;
    sysseek($fh, 8 * (8 + 4 * SLOT), 0) or die "seek: $!";
    sysread($fh, my $bytes, 32) == 32 or die "read: $!";
    return [unpack('Q<*', $bytes)];
}

# A worker of `dispatch` with a channel, a listener with one connection
# waiting (the overflow in kernel dispatch), and a connection to serve:
# (the worker, the supervisor's end of the channel, the connection, the
# waiting client).
sub a_worker {
    my ($dispatch) = @_;
    socketpair(my $channel, my $supervisor, AF_UNIX, SOCK_SEQPACKET, 0)
        or die "socketpair: $!";
    my $listener = IO::Socket::INET->new(
        Listen => 4, LocalAddr => '127.0.0.1', LocalPort => 0) or die "listen: $!";
    $listener->blocking(0);    # as the supervisor's are
    my $client = IO::Socket::INET->new(
        PeerAddr => '127.0.0.1', PeerPort => $listener->sockport) or die "connect: $!";
    socketpair(my $conn, my $peer, AF_UNIX, SOCK_STREAM, 0) or die "socketpair: $!";
    my $self = bless { channel => $channel, dispatch => $dispatch, version => 1 },
        'Forkpool::Worker';
    if ($dispatch eq 'kernel') {
        my $bits = '';
        vec($bits, fileno($_), 1) = 1 for $channel, $listener;
        # As Forkpool::Worker::Kernel::serve sets a worker up.
        @$self{qw(overflow finish_bits)} = ([$listener], [$bits]);
    }
    else {
        $self->{listeners} = [$listener];
    }
    return ($self, $supervisor, $conn, $client, $peer);
}

# Whether the connection still waits on the worker's (overflow) listener.
sub still_waiting {
    my ($self) = @_;
    my $listener = ($self->{overflow} || $self->{listeners})->[0];
    my $bits = '';
    vec($bits, fileno($listener), 1) = 1;
    return select($bits, undef, undef, 0) == 1;
}

ok(POSIX::lseek(CLOSED_FD, 0, POSIX::SEEK_CUR()) == -1 && $!{EBADF},
    'descriptor ' . CLOSED_FD . ' is closed here');

subtest 'the ceiling: the soft limit less min(32, a quarter of it)' => sub {
    for my $case ([64, 48], [100, 75], [1024, 992]) {
        my ($soft, $ceiling) = @$case;
        my (undef, $returned) = in_child(sub {
            set_nofile($soft);
            return join ' ', Forkpool::Worker::_descriptor_ceiling();
        });
        is($returned, "$ceiling $soft", "soft limit $soft");
    }
};

subtest 'handoff: room left, the worker takes the next connection' => sub {
    my ($self, $supervisor, $conn) = a_worker('handoff');
    $self->{fd_ceiling} = CLOSED_FD;
    my $served = 0;
    ok($self->_serve($conn, 0, sub { $served++ }), 'serves on');
    is($served, 2, 'the one handed over and the next');
    is(messages($supervisor), 'NI', 'N, then idle');
};

subtest 'handoff: the ceiling open, the worker leaves after the connection' => sub {
    my ($self, $supervisor, $conn, $client) = a_worker('handoff');
    @$self{qw(fd_ceiling fd_limit)} = (fileno($client), 64);
    my ($served, $warned) = (0, '');
    local $SIG{__WARN__} = sub { $warned .= $_[0] };
    ok(!$self->_serve($conn, 0, sub { $served++ }), 'leaves');
    is($served, 1, 'served the one it had');
    is(messages($supervisor), 'X', 'X, not I or N');
    ok(still_waiting($self), 'the next connection is left for another worker');
    like($warned, qr/descriptor \d+ is open, with RLIMIT_NOFILE at 64: this worker is running out/,
        'says why');
    $self->check_headroom;
    is($warned =~ tr/\n//, 1, 'once');
};

subtest 'handoff: the accept of the next connection runs out of descriptors' => sub {
    my ($self, $supervisor, $conn) = a_worker('handoff');
    my (undef, $returned, $warned) = in_child(sub {
        set_nofile(64);
        fill_table();
        return $self->_serve($conn, 0, sub { }) ? 'serves on' : 'leaves';
    });
    is($returned, 'leaves', 'leaves');
    is(messages($supervisor), 'X', 'X instead of I');
    ok(still_waiting($self), 'the connection waits for another worker');
    like($warned, qr/accept failed: Too many open files: this worker is out of descriptors/,
        'says why');
};

subtest 'order: an accept that runs out of descriptors, M then X' => sub {
    my ($self, $supervisor) = a_worker('order');
    my (undef, $returned, $warned) = in_child(sub {
        set_nofile(64);
        fill_table();
        return $self->_accept(0, sub { }) ? 'serves on' : 'leaves';
    });
    is($returned, 'leaves', 'leaves');
    is(messages($supervisor), 'MX', 'M, then X');
    ok(still_waiting($self), 'the connection waits for another worker');
    like($warned, qr/out of descriptors or memory/, 'says why');
};

subtest 'kernel: the ceiling open, the worker leaves busy after the connection' => sub {
    my ($self, $supervisor, $conn, $client) = a_worker('kernel');
    my $fh = board_file();
    my (undef, $returned) = in_child(sub {
        $self->{board} = Forkpool::Board->open(fileno($fh), SLOT, \&Forkpool::Worker::syscall_number);
        @$self{qw(fd_ceiling fd_limit)} = (fileno($client), 64);
        $self->{board}->took;
        return Forkpool::Worker::Kernel::_serve($self, $conn, 0, sub { }) ? 'serves on' : 'leaves';
    });
    is($returned, 'leaves', 'leaves');
    is(messages($supervisor), 'X', 'X');
    is_deeply(record($fh), [0, 1, 1, 0], 'busy, served 1');
    ok(still_waiting($self), 'the overflow keeps its connection');
};

subtest 'kernel: the accept from the overflow runs out of descriptors' => sub {
    my ($self, $supervisor, $conn) = a_worker('kernel');
    my $fh = board_file();
    my (undef, $returned, $warned) = in_child(sub {
        $self->{board} = Forkpool::Board->open(fileno($fh), SLOT, \&Forkpool::Worker::syscall_number);
        $self->{board}->took;
        set_nofile(64);
        fill_table();
        return Forkpool::Worker::Kernel::_serve($self, $conn, 0, sub { }) ? 'serves on' : 'leaves';
    });
    is($returned, 'leaves', 'leaves');
    is(messages($supervisor), 'X', 'X');
    is_deeply(record($fh), [0, 1, 1, 0], 'busy, served 1');
    ok(still_waiting($self), 'the overflow keeps its connection');
    like($warned, qr/out of descriptors or memory/, 'says why');
};

subtest 'kernel: the accept on its own socket runs out of descriptors' => sub {
    # The own socket is a listener with a connection waiting, as the
    # overflow here.
    my ($self, $supervisor) = a_worker('kernel');
    $self->{listeners} = $self->{overflow};
    my $fh = board_file();
    my (undef, $returned) = in_child(sub {
        $self->{board} = Forkpool::Board->open(fileno($fh), SLOT, \&Forkpool::Worker::syscall_number);
        set_nofile(64);
        fill_table();
        Forkpool::Worker::Kernel::serve($self, sub { });
        return 'returned';
    });
    is($returned, 'returned', 'serve returns');
    is(messages($supervisor), 'KX', 'K, then X');
    is_deeply(record($fh), [0, 0, 0, 0], 'busy, nothing taken');
    ok(still_waiting($self), 'the connection waits on the own socket');
};

done_testing;
