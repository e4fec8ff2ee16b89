package Forkpool::Worker;

# Serve connections as a forkpool worker, in Perl (core modules only).
#
#     use FindBin; use lib $FindBin::Bin;
#     use Forkpool::Worker;
#
#     my $worker = Forkpool::Worker->from_env;
#     $worker->serve(sub {
#         my ($conn, $listener) = @_;
#         print {$conn} "hello\n";
#     });
#
# `forkpool run --dispatch order -- perl my_worker.pl` starts the program
# once per slot. The handler is called once per connection with a
# connected, blocking socket handle and the index of the listener it
# arrived on; the worker closes the connection after the handler returns.
# If the handler dies, the worker dies (the message goes to stderr, which
# the supervisor logs with the slot) and the supervisor starts another.
#
# Dispatch modes: `order` (recommended: the supervisor tells the lowest
# idle worker to accept) and `shared`/`herd` (every idle worker waits on the
# listeners with select(); core Perl has no epoll, so `shared` behaves like
# `herd` and every idle worker wakes for each connection). `handoff` is not
# supported: it passes each connection's descriptor with SCM_RIGHTS, which
# needs recvmsg(2), and core Perl's Socket module does not have it (the
# CPAN module Socket::MsgHdr does). The wire format is in forkpool's
# docs/protocol.md.

use strict;
use warnings;

use Errno qw(EAGAIN EWOULDBLOCK EINTR);
use Fcntl qw(F_GETFD F_SETFD FD_CLOEXEC);
use IO::Handle;
use IO::Select;
use Socket qw(SOL_SOCKET SO_TYPE SOCK_SEQPACKET);

our $VERSION = '1';

use constant PROTOCOL_VERSION => 1;
use constant LISTEN_FDS_START => 3;
# Longer than any message (10 bytes): a longer datagram shows up as a
# length no message has, instead of being cut to a valid one.
use constant RECV_SIZE => 16;

# Parent-to-child messages: kind => payload length.
my %PAYLOAD = (A => 2, C => 2, p => 4, Q => 0);

sub from_env {
    my ($class, %env) = @_;
    %env = %ENV unless %env;
    my $required = sub {
        my ($name) = @_;
        defined $env{$name}
            or die "$name is not set: run this program under "
            . "`forkpool run ... -- perl PROGRAM`\n";
        return $env{$name};
    };
    my $dispatch = $required->('FORKPOOL_DISPATCH');
    if ($dispatch eq 'none') {
        die "the pool runs with --dispatch none, which has no back-channel: "
            . "accept on the LISTEN_FDS listeners directly instead\n";
    }
    if ($dispatch eq 'handoff') {
        die "dispatch 'handoff' passes connections with SCM_RIGHTS, which needs "
            . "recvmsg(2), and core Perl has none: run the pool with "
            . "--dispatch order (or shared)\n";
    }
    my $version = $required->('FORKPOOL_PROTOCOL');
    $version eq PROTOCOL_VERSION
        or die "the supervisor speaks back-channel protocol $version, "
        . "this helper speaks " . PROTOCOL_VERSION . "\n";
    my $count = 0;
    if (defined $env{LISTEN_FDS}) {
        $required->('LISTEN_PID') == $$
            or die "LISTEN_PID names another process: the listeners were passed "
            . "to a parent (a shell wrapper that forks instead of exec'ing?)\n";
        $count = $env{LISTEN_FDS};
    }
    my $channel_fd = $required->('FORKPOOL_CHANNEL_FD');
    $channel_fd == LISTEN_FDS_START + $count
        or die "FORKPOOL_CHANNEL_FD is $channel_fd, but with $count listener(s) "
        . "it must be " . (LISTEN_FDS_START + $count) . "\n";

    # The listeners' open file is shared with the supervisor and every
    # other worker: leave its flags (non-blocking) alone.
    my @listeners = map { _adopt(LISTEN_FDS_START + $_) } 0 .. $count - 1;
    my $channel = _adopt($channel_fd);
    my $type = unpack('i', getsockopt($channel, SOL_SOCKET, SO_TYPE) // pack('i', -1));
    $type == SOCK_SEQPACKET
        or die "descriptor $channel_fd is not the back-channel\n";
    return bless {
        channel    => $channel,
        listeners  => \@listeners,
        slot       => $required->('FORKPOOL_SLOT'),
        generation => $required->('FORKPOOL_GENERATION'),
        dispatch   => $dispatch,
        pid        => $$,
    }, $class;
}

sub slot       { $_[0]{slot} }
sub generation { $_[0]{generation} }
sub pid        { $_[0]{pid} }
sub dispatch   { $_[0]{dispatch} }
sub channel    { $_[0]{channel} }

# Says Ready, then serves until told to quit or the supervisor is gone;
# returns normally in both cases and dies on a message it does not
# understand.
sub serve {
    my ($self, $handler) = @_;
    # A client that hangs up mid-response must not kill the worker.
    local $SIG{PIPE} = 'IGNORE';
    $self->_send('R', pack('N', $$));
    if ($self->{dispatch} eq 'order') {
        while ($self->_take_message($handler)) { }
    }
    elsif ($self->{dispatch} eq 'shared' || $self->{dispatch} eq 'herd') {
        $self->_wait_on_listeners($handler);
    }
    else {
        die "unknown dispatch mode '$self->{dispatch}'\n";
    }
    return;
}

# Takes an inherited descriptor as a handle, close-on-exec from now on.
sub _adopt {
    my ($fd) = @_;
    open(my $fh, '+<&=', $fd) or die "descriptor $fd is not open: $!\n";
    my $flags = fcntl($fh, F_GETFD, 0) or die "fcntl on $fd: $!\n";
    fcntl($fh, F_SETFD, $flags | FD_CLOEXEC) or die "fcntl on $fd: $!\n";
    return $fh;
}

sub _send {
    my ($self, $kind, $payload) = @_;
    my $message = pack('C', PROTOCOL_VERSION) . $kind . ($payload // '');
    defined send($self->{channel}, $message, 0)
        or die "cannot write to the supervisor: $!\n";
    return;
}

# One message as (kind, payload), or an empty list at end of file.
sub _receive {
    my ($self) = @_;
    my $data;
    while (1) {
        last if defined recv($self->{channel}, $data, RECV_SIZE, 0);
        next if $!{EINTR};
        die "cannot read from the supervisor: $!\n";
    }
    return () if $data eq '';    # the supervisor is gone
    my ($version, $kind) = unpack('C a', $data);
    $version == PROTOCOL_VERSION
        or die "protocol version $version is not supported\n";
    my $payload = substr($data, 2);
    defined $PAYLOAD{$kind} && $PAYLOAD{$kind} == length($payload)
        or die 'malformed message from the supervisor: ' . unpack('H*', $data) . "\n";
    return ($kind, $payload);
}

# Acts on one message; false when it is time to exit.
sub _take_message {
    my ($self, $handler) = @_;
    my ($kind, $payload) = $self->_receive;
    return 0 unless defined $kind;
    if ($kind eq 'p') {
        $self->_send('P', $payload);
    }
    elsif ($kind eq 'Q') {
        return 0;
    }
    elsif ($kind eq 'A' && $self->{dispatch} eq 'order') {
        my $listener = unpack('n', $payload);
        $listener < @{ $self->{listeners} }
            or die "told to accept on unknown listener $listener\n";
        $self->_accept($listener, $handler);
    }
    else {
        die "'$kind' is not expected in $self->{dispatch} mode\n";
    }
    return 1;
}

# Accepts one connection: B and serve it, or M if none is waiting.
sub _accept {
    my ($self, $listener, $handler) = @_;
    my $conn;
    unless (accept($conn, $self->{listeners}[$listener])) {
        warn "forkpool worker: accept failed: $!\n"
            unless $!{EAGAIN} || $!{EWOULDBLOCK} || $!{EINTR};
        $self->_send('M');
        return;
    }
    $self->_send('B');
    # Keep a duplicate open until Idle is sent, so the client sees the
    # connection close only once the supervisor knows this worker is free.
    open(my $held, '+<&', $conn) or die "cannot duplicate the connection: $!\n";
    $conn->autoflush(1);
    $handler->($conn, $listener);
    close($conn);
    $self->_send('I');
    close($held);
    return;
}

sub _wait_on_listeners {
    my ($self, $handler) = @_;
    my $channel   = $self->{channel};
    my @listeners = @{ $self->{listeners} };
    my $select    = IO::Select->new($channel, @listeners);
    while (1) {
        for my $ready ($select->can_read) {
            if ($ready == $channel) {
                return unless $self->_take_message($handler);
                next;
            }
            my ($index) = grep { $listeners[$_] == $ready } 0 .. $#listeners;
            $self->_accept($index, $handler);
        }
    }
}

1;
