package Forkpool::Board;

# A worker's record on the scoreboard of `kernel` dispatch (docs/protocol.md,
# "`kernel` dispatch"), in core Perl.
#
# Core Perl can neither map memory nor store into it, so:
# - the map is mapped with mmap(2) through the `syscall` builtin (its number
#   from syscall.ph, as for recvmsg in Forkpool::Worker);
# - a word is read straight from the mapping with unpack's 'P' (a pointer
#   to a fixed-length string): no system call;
# - a store is one pwrite(2) to /proc/self/mem at the mapped address. The
#   kernel copies the bytes into the map's page, the page the supervisor
#   and the eBPF program see. One pwrite stores several adjacent words
#   (state and taken, or state, taken and served), so a connection costs
#   two system calls: one when the worker takes it, one when it goes idle.
#
# The fence the protocol asks for between storing "idle" and reading word
# 2: on x86-64 the kernel's write path ends with locked instructions (it
# drops its reference to the page and releases its lock on the address
# space) after the copy, and a locked instruction is a full fence there.
# Elsewhere a rare missed wake-up costs at most the supervisor's 100 ms
# re-read of the board.
#
# The copy is the kernel's memcpy: 8-byte moves, or a string move
# (`rep movsb`) the processor does not promise to make in 8-byte pieces.
# Going idle, which the eBPF program may answer at once with a
# reservation, stores three words so that the 8-byte moves write the
# state word once (a copy of 8 or 16 bytes writes its first word twice,
# and the second write could undo a reservation made between the two).
# Were a string move to write the word byte by byte, a reservation made
# meanwhile would read as another reservation (never idle), and the
# worker, which accepts that connection, then stores busy over it. Busy,
# stored over idle or a reservation, reads as busy or reserved at every
# step.
#
# /proc/self/mem names the address space of the process that opened it:
# a worker opens its own (a forked process must not inherit it).
#
# The header words it reads: 0 the magic, 1 the slot count, 2 the wake-up
# the supervisor asks for, and 5 the dispatch bound (0, or the first slot
# outside the pool's dispatch width; the supervisor writes it). Words 3
# and 4 (the overflow's counts) it leaves alone: it cannot add to word 4
# atomically, so it looks on the overflow (one select) at every finish,
# and before it goes idle early, as a worker may.

use strict;
use warnings;

use Config;

use constant MAGIC        => 'fkpbrd01';
use constant PAGE         => 4096;
use constant HEADER_WORDS => 8;
use constant RECORD_WORDS => 4;
use constant PROT_RW      => 3;    # PROT_READ | PROT_WRITE
use constant MAP_SHARED   => 1;
use constant BUSY         => 0;
use constant IDLE         => 1;
use constant BOUND_WORD   => 5;

# Why this perl cannot store into a scoreboard, or undef when it can.
# $syscall_number is Forkpool::Worker::syscall_number. Returns the
# system-call numbers and /proc/self/mem, opened, when it can.
sub support {
    my ($class, $syscall_number) = @_;
    $^O eq 'linux' && $Config{ptrsize} == 8 && $Config{ivsize} == 8
        or return "that needs a 64-bit perl on Linux";
    my ($mmap, $pwrite) = map { $syscall_number->($_) } qw(mmap pwrite64);
    defined $mmap && defined $pwrite
        or return "syscall.ph (the system-call numbers) is missing or has no mmap or pwrite64";
    CORE::open(my $mem, '+<', '/proc/self/mem')
        or return "/proc/self/mem does not open for writing: $!";
    return (undef, $mmap, $pwrite, $mem);
}

# The record of slot $slot on the scoreboard map $fd. Dies with a string
# when the map is not a scoreboard for this slot, and with
# { unsupported => why } when this perl cannot store into it (the worker
# then works without it). $syscall_number is Forkpool::Worker::syscall_number.
sub open {
    my ($class, $fd, $slot, $syscall_number) = @_;
    my $unsupported = sub { die { unsupported => "cannot store into the scoreboard: $_[0]" } };
    my ($why, $mmap, $pwrite, $mem) = $class->support($syscall_number);
    $unsupported->($why) if defined $why;
    my $length = 8 * (HEADER_WORDS + RECORD_WORDS * ($slot + 1));
    $length = PAGE * int(($length + PAGE - 1) / PAGE);
    my $base = syscall($mmap, 0, $length, PROT_RW, MAP_SHARED, $fd + 0, 0);
    $base != -1 or die "mmap failed: $!\n";
    my $read = sub { unpack('P8', pack('Q', $base + 8 * $_[0])) };
    $read->(0) eq MAGIC
        or die "not a forkpool scoreboard (magic " . unpack('H16', $read->(0)) . ")\n";
    my $slots = unpack('Q<', $read->(1));
    $slot < $slots or die "slot $slot is beyond its $slots slots\n";
    my $record = $base + 8 * (HEADER_WORDS + RECORD_WORDS * $slot);
    my $self = bless {
        mem     => $mem,
        mem_fd  => fileno($mem),
        pwrite  => $pwrite,
        record  => $record,
        waiting => pack('Q', $base + 16),
        bound   => pack('Q', $base + 8 * BOUND_WORD),
        slot    => $slot,
        # This worker is the only writer of its counts: kept here, stored.
        taken   => unpack('Q<', $read->(HEADER_WORDS + RECORD_WORDS * $slot + 1)),
        served  => unpack('Q<', $read->(HEADER_WORDS + RECORD_WORDS * $slot + 2)),
        next    => unpack('Q<', $read->(HEADER_WORDS + RECORD_WORDS * $slot + 3)),
    }, $class;
    # The slot is busy until the worker says K: storing busy proves the
    # store works before the worker promises to keep the record.
    eval { $self->busy; 1 } or $unsupported->($@ =~ s/\n\z//r);
    return $self;
}

# Stores the 8-byte words $bytes from word $word of the record on.
sub _store {
    my ($self, $word, $bytes) = @_;
    my $n = syscall($self->{pwrite}, $self->{mem_fd}, $bytes, length $bytes,
        $self->{record} + 8 * $word);
    $n == length $bytes
        or die "pwrite to /proc/self/mem failed: $!\n";
    return;
}

# The worker accepted a connection from its own socket: busy, taken + 1.
sub took {
    my ($self) = @_;
    $self->_store(0, pack('Q<Q<', BUSY, ++$self->{taken}));
    return;
}

# The worker finished a connection and took the next from the overflow:
# taken, served and next + 1 (still busy).
sub took_next {
    my ($self) = @_;
    $self->_store(1, pack('Q<Q<Q<', ++$self->{taken}, ++$self->{served}, ++$self->{next}));
    return;
}

# The connections this worker finished, as its record says.
sub served_so_far { $_[0]{served} }

# The worker finished a connection (and takes no other, or leaves).
sub served {
    my ($self) = @_;
    $self->_store(2, pack('Q<', ++$self->{served}));
    return;
}

# The worker finished a connection and waits: idle, served + 1. True when
# the supervisor wants to hear of it (word 2, read after the store).
sub idle_after_serving {
    my ($self) = @_;
    $self->_store(0, pack('Q<Q<Q<', IDLE, $self->{taken}, ++$self->{served}));
    return unpack('P8', $self->{waiting}) ne "\0" x 8;
}

# The worker waits (at start): idle. True as for idle_after_serving.
# Three words, as there (see "the state word once" above).
sub idle {
    my ($self) = @_;
    $self->_store(0, pack('Q<Q<Q<', IDLE, $self->{taken}, $self->{served}));
    return unpack('P8', $self->{waiting}) ne "\0" x 8;
}

# True when the worker, finishing a connection, may take the next one
# waiting on the overflow: no dispatch bound (word 5 is 0), or its slot is
# below it. Under load that computes, the supervisor narrows the set of
# workers that serve, so that each stays hot in its CPU's cache; a worker
# outside it that kept taking from the overflow would keep serving and
# never leave the set, so it goes idle instead. One read, no system call.
sub within_width {
    my ($self) = @_;
    my $bound = unpack('Q<', unpack('P8', $self->{bound}));
    return !$bound || $self->{slot} < $bound;
}

# The worker is busy (quitting or leaving).
sub busy {
    my ($self) = @_;
    $self->_store(0, pack('Q<', BUSY));
    return;
}

1;
