package Forkpool::Worker::Kernel;

# A Forkpool::Worker's life in `kernel` dispatch (docs/protocol.md,
# "`kernel` dispatch"): the kernel queues each new connection on the own
# socket of the lowest idle worker, which it reads on the scoreboard; the
# worker keeps its record there (Forkpool::Board) and tells the
# supervisor nothing per connection. It says K instead of R, waits on its
# own sockets and the channel, and as it finishes a connection takes the
# next one waiting on the pool's listener (the overflow) itself or goes
# idle; it says I only when the board's word 2 asks for it. A worker whose
# slot the board's word 5 puts outside the pool's dispatch width takes
# nothing from the overflow: it goes idle. Given a memory or lifetime
# limit (FORKPOOL_MAX_CHILD_MEMORY, FORKPOOL_MAX_CHILD_LIFETIME_MS), it
# looks after each connection, before it would go idle, and past one it
# leaves instead (busy, X), then waits for the supervisor to let it go.

use strict;
use warnings;

use POSIX ();
use Time::HiRes ();

# open(2)'s O_CLOEXEC on Linux (x86-64 and aarch64, the only systems a
# board is used on); neither Fcntl nor POSIX exports it.
use constant O_CLOEXEC => 0x80000;

# Serves until told to quit, the supervisor is gone, or it leaves; a
# worker that left for a limit returns once the supervisor let it go.
sub serve {
    my ($self, $handler) = @_;
    _serve_on_board($self, $handler);
    _await_release($self) if $self->{past_limit};
    return;
}

sub _serve_on_board {
    my ($self, $handler) = @_;
    # Its lifetime counts from here, its K.
    _start_limits($self);
    $self->_send('K', pack('N', $$));
    if (delete $self->{seat_pending}) {
        return unless _take_seat($self);
    }
    my $board = $self->{board};
    # Idle, and a wake-up if the supervisor already holds connections.
    $self->_send('I') if $board->idle;
    my @own = @{ $self->{listeners} };
    my $channel_fd = fileno($self->{channel});
    my $bits = '';
    vec($bits, $_, 1) = 1 for $channel_fd, map { fileno($_) } @own;
    # As a connection on listener i ends: the channel and overflow i, to
    # see in one call whether a message or a connection waits.
    $self->{finish_bits} = [
        map {
            my $v = '';
            vec($v, $_, 1) = 1 for $channel_fd, fileno($_);
            $v;
        } @{ $self->{overflow} }
    ];
    while (1) {
        my $n = select(my $ready = $bits, undef, undef, undef);
        if ($n < 0) {
            next if $!{EINTR};
            die "select: $!\n";
        }
        # The channel first: pings, quit and end of file come before work.
        if (vec($ready, $channel_fd, 1)) {
            return unless _take_message($self, $handler);
        }
        for my $i (0 .. $#own) {
            next unless vec($ready, fileno($own[$i]), 1);
            # Another worker cannot take it, but the connection may have
            # been reset since: nothing to do then. Out of descriptors: busy,
            # so the kernel queues nothing more here, and leave.
            my $conn;
            unless (accept($conn, $own[$i])) {
                next unless Forkpool::Worker::_exhausted();
                $self->_accept_failed;
                $board->busy;
                eval { $self->_send('X') };
                return;
            }
            $board->took;
            return unless _serve($self, $conn, $i, $handler);
        }
    }
}

# Forked by a template: reads the seat, S, its own sockets and the
# scoreboard (answering pings before it). False on Q or end of file.
sub _take_seat {
    my ($self) = @_;
    while (1) {
        my ($kind, $payload, @fds) = $self->_receive or return 0;
        if ($kind eq 'p') {
            $self->_send('P', $payload);
            next;
        }
        return 0 if $kind eq 'Q';
        unless ($kind eq 'S') {
            POSIX::close($_) for @fds;
            die "'$kind' came before the seat (S) in kernel mode\n";
        }
        my ($count, $max_requests) = unpack('n Q>', $payload);
        my $map = pop @fds;
        unless ($count == @{ $self->{overflow} }) {
            POSIX::close($_) for @fds, $map;
            die "a seat for $count listener(s), but the pool has "
                . @{ $self->{overflow} } . "\n";
        }
        $self->{listeners} = [ map { Forkpool::Worker::_adopt($_) } @fds ];
        $self->{board} = eval { $self->_map_board($map) }
            or Forkpool::Worker::_refuse_board($self, $map, $@);
        $self->{max_requests} = $max_requests || undef;
        return 1;
    }
}

# What each message from the supervisor does: false when it is time to
# exit. p: answer. Q: serve what is queued, then exit. C: the supervisor
# marked this worker busy before handing it the connection.
my %ON_MESSAGE = (
    p => sub { $_[0]->_send('P', $_[2]); 1 },
    Q => sub { _drain(@_[0, 1]); 0 },
    # Refork (forked by a template): busy, then it gives up its own
    # sockets and the board, and becomes the template with the pool's
    # listeners, at 3 .. 3+n-1 where a template has them.
    T => sub {
        my ($self, $handler, $payload, $fd) = @_;
        delete($self->{board})->busy;
        close($_) for @{ $self->{listeners} };
        $self->{listeners} = delete $self->{overflow};
        $self->{become_template} = $fd;
        return 0;
    },
    C => sub {
        my ($self, $handler, $payload, $fd) = @_;
        my $listener = unpack('n', $payload);
        unless ($listener < @{ $self->{listeners} }) {
            POSIX::close($fd);
            die "handed a connection on unknown listener $listener\n";
        }
        open(my $conn, '+<&=', $fd) or die "descriptor $fd is not open: $!\n";
        return _serve($self, $conn, $listener, $handler);
    },
);

# Acts on one message; false when it is time to exit (also at end of file).
sub _take_message {
    my ($self, $handler) = @_;
    my ($kind, $payload, $fd) = $self->_receive or return 0;
    my $on = $ON_MESSAGE{$kind};
    return $on->($self, $handler, $payload, $fd) if $on;
    POSIX::close($fd) if defined $fd;
    die "'$kind' is not expected in kernel mode\n";
}

# Step 7 of the worker's life, "finish early" (Forkpool::Worker's
# ending_connection): idle now, served counted, unless the worker leaves
# after this connection or a connection waits on its overflow listener
# (the finish takes it). The look at the overflow is the finish's select
# (this helper cannot add to word 4, so words 3 and 4 would not say),
# taken here: when it sees a connection waiting and no message, the
# finish takes that connection without looking again. Once per
# connection.
sub ending_connection {
    my ($self) = @_;
    my $i = $self->{serving};
    return if !defined $i || $self->{idle_early} || $self->{headroom_checked};
    $self->check_headroom;
    _check_limits($self);
    $self->{headroom_checked} = 1;
    return if _leaving($self);
    my $board = $self->{board};
    if ($board->within_width) {
        my ($waits, $message) = _look($self, $i);
        if ($waits) {
            $self->{next_seen} = !$message;
            return;
        }
    }
    $self->{idle_early} = 1;
    $self->_send('I') if $board->idle_after_serving;
    return;
}

# Serves $conn, from listener $i, then the next connection waiting on
# overflow listener $i, if any and the channel is quiet, and so on; then
# goes idle. False if the handler asked to leave.
sub _serve {
    my ($self, $conn, $i, $handler) = @_;
    my $board = $self->{board};
    while (1) {
        $conn->autoflush(1);
        $self->{serving} = $i;
        $handler->($conn, $i);
        delete $self->{serving};
        my $seen = delete $self->{next_seen};
        if (delete $self->{idle_early}) {
            # Idle and counted already (ending_connection); only a worker
            # that leaves after all (asked to after the answer) has more
            # to do: busy again, and X.
            delete $self->{headroom_checked};
            if ($self->{leave}) {
                $board->busy;
                eval { $self->_send('X') };
                close($conn);
                return 0;
            }
            close($conn);
            return 1;
        }
        unless (delete $self->{headroom_checked}) {    # else in ending_connection
            $self->check_headroom;
            _check_limits($self);
        }
        my $next = _leaving($self) ? undef : _next_from_overflow($self, $i, $seen);
        if (_leaving($self)) {
            # Asked to leave, out of descriptors (here or at the accept of
            # the next one), past its memory or lifetime limit, or its
            # share served. Busy, so the kernel
            # queues nothing more here: leaving loses nothing. X makes the
            # exit a retirement, not a death.
            $board->served;
            eval { $self->_send('X') };
            close($conn);
            return 0;
        }
        last unless $next;
        $board->took_next;
        close($conn);
        $conn = $next;
    }
    # Idle before the close, so a client that reconnects as soon as it
    # sees it finds this worker, hot, idle.
    $self->_send('I') if $board->idle_after_serving;
    close($conn);
    return 1;
}

# The limits it checks after each connection, started in this process (a
# worker forked by a template starts them after its fork, so that
# /proc/self is its own): nothing without one; a lifetime is a clock read
# (no system call); memory is one pread(2) of /proc/self/statm, kept
# open, for the resident size, and /proc/self/smaps_rollup (about 16 us
# per resident MiB) only when that is above the limit (USS, what the limit
# is on, is never above it), and then only when rollup_due says so.
sub _start_limits {
    my ($self) = @_;
    my $limits = delete $self->{limits};
    POSIX::close($limits->{statm}) if $limits && defined $limits->{statm};
    my ($max, $ms) = ($self->{max_memory} || 0, $self->{lifetime_ms} || 0);
    return unless $max || $ms;
    $limits = { max => $max };
    $limits->{leave_at} = _now() + $ms / 1000 if $ms;
    if ($max) {
        my $pread = Forkpool::Worker::syscall_number('pread64');
        my $statm = POSIX::open('/proc/self/statm', POSIX::O_RDONLY() | O_CLOEXEC);
        my $page  = POSIX::sysconf(POSIX::_SC_PAGESIZE());
        if (defined $pread && defined $statm && $page) {
            @$limits{qw(pread statm page)} = ($pread, $statm, $page);
        }
        else {
            # The supervisor's own look (every second) still holds.
            POSIX::close($statm) if defined $statm;
            warn "forkpool worker (slot $self->{slot}): cannot read /proc/self/statm: "
                . "the worker does not check its memory\n";
        }
    }
    $self->{limits} = $limits;
    return;
}

sub _now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

# The longest, in seconds, a worker whose resident size is above its memory
# limit goes between two reads of smaps_rollup while that size does not
# grow enough to matter: memory that becomes its own without the resident
# size growing (a copy-on-write break) is seen within this.
use constant SMAPS_REREAD => 0.1;

# rollup_due($limit, $rss, $last, $now): whether a worker whose resident
# size $rss is above its memory $limit reads smaps_rollup now, given its
# last read, [USS, RSS, when] or undef: when there was none; when RSS grew
# since then by at least what USS had left below the limit (USS grows by
# at most what RSS grows, plus copy-on-write breaks, so a smaller growth
# cannot by itself have taken it past); or when SMAPS_REREAD has passed
# (copy-on-write breaks raise USS without RSS: they are seen within that).
# Otherwise it counts as under the limit: a --preload worker sitting above
# the limit on what it shares with its template reads it every 100 ms at
# most, not after every connection.
sub rollup_due {
    my ($limit, $rss, $last, $now) = @_;
    return 1 unless $last;
    my ($uss_then, $rss_then, $then) = @$last;
    my $grown = $rss > $rss_then ? $rss - $rss_then : 0;
    return $grown >= $limit - $uss_then || $now - $then >= SMAPS_REREAD;
}

# memory_past($limits, $rss, $now, $read_uss): the memory look given the
# resident size $rss at $now: the USS when it is above $limits->{max},
# read with $read_uss->() (and kept in $limits->{last_rollup}) only when
# $rss is above the limit and rollup_due says so; else undef.
sub memory_past {
    my ($limits, $rss, $now, $read_uss) = @_;
    my $max = $limits->{max};
    return if $rss <= $max || !rollup_due($max, $rss, $limits->{last_rollup}, $now);
    my $uss = $read_uss->();
    $limits->{last_rollup} = [$uss, $rss, $now];
    return $uss > $max ? $uss : undef;
}

# After a connection, before the worker would go idle: past its memory
# or lifetime limit, it leaves (busy, X) instead.
sub _check_limits {
    my ($self) = @_;
    return if $self->{leave};
    my $past = _past_limit($self) or return;
    $self->{past_limit} = $past;
    $self->{leave}      = 1;
    return;
}

# 'memory' or 'lifetime' when the worker is past that limit now; else
# false.
sub _past_limit {
    my ($self) = @_;
    my $limits = $self->{limits} or return;
    if (defined $limits->{statm}) {
        my $buf = "\0" x 128;
        my $n = syscall($limits->{pread}, $limits->{statm}, $buf, 128, 0);
        if ($n > 0) {
            my (undef, $resident) = split ' ', substr($buf, 0, $n);
            my $rss = $resident * $limits->{page};
            # Under the limit (the usual case): no clock read either.
            return 'memory'
                if $rss > $limits->{max}
                && defined memory_past($limits, $rss, _now(), \&unshared_memory);
        }
    }
    return 'lifetime' if $limits->{leave_at} && _now() >= $limits->{leave_at};
    return;
}

# This process's unshared memory (USS) in bytes, as the supervisor counts
# it: Private_Clean plus Private_Dirty in /proc/self/smaps_rollup (0 if
# it cannot be read).
sub unshared_memory {
    open(my $rollup, '<', '/proc/self/smaps_rollup') or return 0;
    my $uss = 0;
    while (<$rollup>) {
        $uss += $1 * 1024 if /^Private_(?:Clean|Dirty):\s+(\d+)/;
    }
    close($rollup);
    return $uss;
}

# After its X for a limit: reads the channel until Q or end of file
# (ignoring what the supervisor sent before it read the X), so that the
# supervisor, which reads the worker's memory itself, finds it still
# there; it shuts its end down once it has.
sub _await_release {
    my ($self) = @_;
    my $bits = '';
    vec($bits, fileno($self->{channel}), 1) = 1;
    while (1) {
        my $n = select(my $ready = $bits, undef, undef, undef);
        next if $n < 0 && $!{EINTR};
        return if $n < 0;
        my ($kind, $payload, $fd) = eval { $self->_receive };
        return if !defined $kind || $kind eq 'Q';
        POSIX::close($fd) if defined $fd;
    }
}

# Whether the worker leaves after the connection it served: asked to (or
# out of descriptors, or past a limit), or its share served.
sub _leaving {
    my ($self) = @_;
    return $self->{leave}
        || ($self->{max_requests} && $self->{board}->served_so_far + 1 >= $self->{max_requests});
}

# One select of the channel and overflow $i: (whether a connection waits
# there, whether a message waits on the channel).
sub _look {
    my ($self, $i) = @_;
    my $ready;
    return (0, 0) unless select($ready = $self->{finish_bits}[$i], undef, undef, 0) > 0;
    return (vec($ready, fileno($self->{overflow}[$i]), 1), vec($ready, fileno($self->{channel}), 1));
}

# A connection waiting on overflow $i, unless a message waits or the board
# puts this slot outside the dispatch width; else undef. $seen: the early
# idle's look saw one waiting and no message, so none is taken again. An
# accept that runs out of descriptors makes the worker leave.
sub _next_from_overflow {
    my ($self, $i, $seen) = @_;
    unless ($seen) {
        return undef unless $self->{board}->within_width;
        my ($waits, $message) = _look($self, $i);
        return undef if !$waits || $message;
    }
    my $next;
    unless (accept($next, $self->{overflow}[$i])) {
        $self->_accept_failed if Forkpool::Worker::_exhausted();
        return undef;
    }
    return $next;
}

# Quit: busy, then serves what the kernel queued on the own sockets just
# before (no one else would take it).
sub _drain {
    my ($self, $handler) = @_;
    my $board = $self->{board};
    $board->busy;
    my @own = @{ $self->{listeners} };
    for my $i (0 .. $#own) {
        while (accept(my $conn, $own[$i])) {
            $board->took;
            $conn->autoflush(1);
            $handler->($conn, $i);
            $board->served;
            close($conn);
        }
    }
    return;
}

1;
