# Unit tests of Forkpool::Board, the worker's record on the kernel dispatch
# scoreboard (and of the finish in Forkpool::Worker::Kernel, which reads its
# word 5), on a file mapped like the board: `prove -I clients/perl
# clients/perl/t` (crates/forkpool-cli/tests/psgi.rs runs them with the
# test suite). The file's pages are the mapping's, so reading the file
# reads what the worker stored.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..";

use File::Temp ();
use Test::More;
use Forkpool::Board;
use Forkpool::Worker;

plan skip_all => 'Forkpool::Board needs a 64-bit perl on Linux with syscall.ph'
    unless defined Forkpool::Worker::syscall_number('mmap');

my $SLOTS = 3;

# A board file: magic, slot count, word 2, then each slot's record.
sub board_file {
    my (%words) = @_;
    my $fh = File::Temp->new;
    my @words = (unpack('Q<', 'fkpbrd01'), $SLOTS, (0) x (6 + 4 * $SLOTS));
    $words[$_] = $words{$_} for keys %words;
    syswrite($fh, pack('Q<*', @words) . "\0" x (4096 - 8 * @words)) or die "write: $!";
    return $fh;
}

sub words {
    my ($fh, $from, $count) = @_;
    sysseek($fh, 8 * $from, 0) or die "seek: $!";
    sysread($fh, my $bytes, 8 * $count) == 8 * $count or die "read: $!";
    return [unpack('Q<*', $bytes)];
}

sub set_word {
    my ($fh, $word, $value) = @_;
    sysseek($fh, 8 * $word, 0) or die "seek: $!";
    syswrite($fh, pack('Q<', $value)) == 8 or die "write: $!";
}

sub board_open {
    my ($fh, $slot, $numbers) = @_;
    return Forkpool::Board->open(fileno($fh), $slot,
        $numbers // \&Forkpool::Worker::syscall_number);
}

subtest 'a connection: took, then idle after serving, counts kept' => sub {
    my $fh = board_file(8 + 4 * 1 => 1);    # slot 1 idle (a leftover)
    my $board = board_open($fh, 1);
    is_deeply(words($fh, 12, 4), [0, 0, 0, 0], 'opening stores busy');
    ok(!$board->idle, 'idle; word 2 is clear');
    is_deeply(words($fh, 12, 4), [1, 0, 0, 0], 'idle');
    $board->took;
    is_deeply(words($fh, 12, 4), [0, 1, 0, 0], 'busy, taken 1');
    $board->took_next;
    is_deeply(words($fh, 12, 4), [0, 2, 1, 1], 'taken 2, served 1, next 1');
    ok(!$board->idle_after_serving, 'no wake-up asked');
    is_deeply(words($fh, 12, 4), [1, 2, 2, 1], 'idle, served 2');
    is($board->served_so_far, 2, 'served so far');
    $board->busy;
    $board->served;
    is_deeply(words($fh, 12, 4), [0, 2, 3, 1], 'busy, served 3');
    is_deeply(words($fh, 8, 4), [0, 0, 0, 0], 'slot 0 untouched');
    is_deeply(words($fh, 16, 4), [0, 0, 0, 0], 'slot 2 untouched');
};

subtest 'word 2 set: going idle says so' => sub {
    my $fh = board_file(2 => 1);
    my $board = board_open($fh, 0);
    $board->took;
    ok($board->idle_after_serving, 'the supervisor waits for an I');
};

subtest 'counts start from the record' => sub {
    my $fh = board_file(8 + 1 => 7, 8 + 2 => 6, 8 + 3 => 2);
    my $board = board_open($fh, 0);
    $board->took;
    ok(!$board->idle_after_serving, 'idle');
    is_deeply(words($fh, 8, 4), [1, 8, 7, 2], 'counted on from 7, 6 and 2');
};

subtest 'word 5: a slot at or beyond the bound takes nothing from the overflow' => sub {
    # Words 3 and 4 say one waits on the overflow (this helper does not
    # read them; it looks every time): only word 5 may keep it from there.
    my $fh = board_file(3 => 2, 4 => 1);
    my $board = board_open($fh, 2);
    ok($board->within_width, 'bound 0: no bound');
    set_word($fh, 5, 3);
    ok($board->within_width, 'bound 3, above slot 2');
    set_word($fh, 5, 2);
    ok(!$board->within_width, 'bound 2, the slot itself');
    set_word($fh, 5, 1);
    ok(!$board->within_width, 'bound 1, below the slot');
    set_word($fh, 5, 0);
    ok($board->within_width, 'bound cleared: as before');
};

subtest 'a finishing worker outside the width goes idle, inside it takes the next' => sub {
    require Forkpool::Worker::Kernel;
    require IO::Socket::INET;
    require Socket;
    for my $case ([0, 2], [3, 2], [2, 1], [1, 1]) {
        my ($bound, $served) = @$case;
        my $fh = board_file(5 => $bound);
        my $board = board_open($fh, 2);
        my $overflow = IO::Socket::INET->new(
            Listen => 4, LocalAddr => '127.0.0.1', LocalPort => 0) or die "listen: $!";
        my $client = IO::Socket::INET->new(
            PeerAddr => '127.0.0.1', PeerPort => $overflow->sockport) or die "connect: $!";
        socketpair(my $channel, my $supervisor, Socket::AF_UNIX(), Socket::SOCK_SEQPACKET(), 0)
            or die "socketpair: $!";
        socketpair(my $conn, my $peer, Socket::AF_UNIX(), Socket::SOCK_STREAM(), 0)
            or die "socketpair: $!";
        my $bits = '';
        vec($bits, fileno($_), 1) = 1 for $channel, $overflow;
        # As Forkpool::Worker::Kernel::serve sets a worker up.
        my $self = bless {
            board => $board, channel => $channel, overflow => [$overflow],
            finish_bits => [$bits],
        }, 'Forkpool::Worker';
        $board->took;
        my $handled = 0;
        ok(Forkpool::Worker::Kernel::_serve($self, $conn, 0, sub { $handled++ }),
            "bound $bound: serves on");
        is($handled, $served, "bound $bound: connections served");
        is_deeply(words($fh, 16, 4), [1, $served, $served, $served - 1],
            "bound $bound: idle, the overflow's one counted as next or left");
        my $left = '';
        vec($left, fileno($overflow), 1) = 1;
        is(select($left, undef, undef, 0), 2 - $served, "bound $bound: what the overflow holds");
    }
};

subtest 'refused: not a board, or a slot beyond it' => sub {
    my $fh = board_file(0 => unpack('Q<', 'notboard'));
    ok(!eval { board_open($fh, 0) }, 'wrong magic');
    like($@, qr/not a forkpool scoreboard/, 'says so');
    ok(!ref $@, 'a refusal, not a fallback');
    ok(!eval { board_open(board_file(), $SLOTS) }, 'slot beyond the count');
    like($@, qr/slot 3 is beyond its 3 slots/, 'says so');
};

subtest 'no way to store: a fallback, said as such' => sub {
    ok(!eval { board_open(board_file(), 0, sub { undef }) }, 'no system-call numbers');
    is(ref $@, 'HASH', 'the worker can fall back to R');
    like($@->{unsupported}, qr/syscall\.ph/, 'says what is missing');
};

done_testing;
