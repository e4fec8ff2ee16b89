package Forkpool::PSGI;

# A PSGI server for forkpool workers (core modules only).
#
#     my $server = Forkpool::PSGI->new(keepalive_timeout => 5);
#     $server->run($app);    # under `forkpool run`; returns when told to quit
#
# Each worker serves one connection at a time: HTTP/1.1 keep-alive (a
# bounded number of requests, a timeout between them), HTTP/1.0, HEAD,
# `Expect: 100-continue`, chunked and Content-Length request bodies read
# from the socket as the app asks (`psgi.input`), delayed and streamed
# responses (`psgi.streaming`), chunked responses when the app gives no
# length, sendfile for file bodies, and `psgix.harakiri`. An app that
# dies gets its request a 500; the error goes to stderr, which the
# supervisor logs with the worker's slot, and the worker goes on.
# `clients/perl/forkpool-psgi` is the command; Plack::Handler::Forkpool
# the plackup handler.

use strict;
use warnings;

use Errno ();
use File::Temp ();
use IO::Handle ();
use overload ();
use POSIX ();
use Scalar::Util qw(blessed reftype);
use Socket qw(
    SOL_SOCKET SO_RCVTIMEO SO_SNDTIMEO IPPROTO_TCP TCP_NODELAY MSG_DONTWAIT
    AF_INET AF_INET6 inet_ntop sockaddr_family unpack_sockaddr_in
    unpack_sockaddr_in6
);
use Time::HiRes ();

use Forkpool::HTTP qw(
    find_head_end incomplete_head_problem parse_head body_framing keeps_alive
    expects_continue status_text response_head
    access_line
);
use Forkpool::Worker;

our $VERSION = '1';

# Every option, its default, and what it must be.
our %DEFAULTS = (
    header_timeout         => 10,         # seconds for a whole request head
    keepalive_timeout      => 5,          # seconds of silence between requests
    max_keepalive_requests => 1000,       # requests per connection
    keepalive_turn         => 0.02,       # seconds a kept-alive connection keeps
                                          # its worker while others wait
    timeout                => 60,         # seconds per read or write of a body
    body_timeout           => 30,         # seconds for a whole request body
    max_header_size        => 65536,      # bytes of request head
    max_body_size          => 1 << 30,    # bytes of request body; 0: no limit
    access_log             => 1,
);

# When a kept-alive connection waiting for its next request gives way to
# a connection waiting on a listener (docs/http.md, "Give-way"): once it
# has been idle GIVE_WAY_IDLE (a client merely slow to send its next
# request keeps its connection), and the other has waited GIVE_WAY_STEP
# times the slot modulo 4, plus one (long enough for a free worker to take
# it, and one idle worker gives way, not all at once): at most 90 ms,
# inside the 100 ms docs/http.md allows. The same as forkpool_wsgi's.
use constant GIVE_WAY_IDLE => 0.05;
use constant GIVE_WAY_STEP => 0.01;
# Unread body left after a response that is read and thrown away to keep
# the connection; beyond it the connection is closed instead.
use constant MAX_DRAIN => 256 * 1024;
# How long an error response waits for the client to stop sending before
# the socket is closed (a close with unread data would reset the
# connection and could destroy the response before the client reads it).
use constant LINGER => 1;
use constant READ_SIZE => 65536;
# The largest last write of a connection its worker goes idle before
# (_ending): it fits the socket's send buffer, so it does not wait for the
# client to read.
use constant ENDING_WRITE_MAX => 16384;
# Chunked bodies up to this size are spooled in memory, larger ones to a
# temporary file.
use constant SPOOL_MEMORY => 1024 * 1024;

my $SENDFILE = Forkpool::Worker::syscall_number('sendfile');

# A server with these options (see %DEFAULTS); dies naming a bad one.
sub new {
    my ($class, %options) = @_;
    my %self = %DEFAULTS;
    for my $name (sort keys %options) {
        exists $DEFAULTS{$name} or die "unknown option '$name'\n";
        my $value = $options{$name};
        if ($name eq 'access_log') {
            $self{$name} = $value ? 1 : 0;
            next;
        }
        my $integer = $name =~ /^max_/;
        (my $flag = $name) =~ tr/_/-/;
        defined $value && ($integer ? $value =~ /\A\d+\z/ : $value =~ /\A\d+(?:\.\d+)?\z/)
            or die "--$flag must be a " . ($integer ? 'whole number' : 'number of seconds')
            . ", not '" . ($value // '') . "'\n";
        $name eq 'max_body_size' || $name eq 'keepalive_turn' || $value > 0
            or die "--$flag must be more than 0\n";
        $self{$name} = $value + 0;
    }
    return bless \%self, $class;
}

# Serves $app as a forkpool worker until the supervisor says quit (or
# the app asks to leave with psgix.harakiri). Dies if this process is not
# a forkpool worker.
sub run {
    my ($self, $app) = @_;
    ref $app eq 'CODE' || (blessed $app && overload::Method($app, '&{}'))
        or die "the app is not a code reference: " . (ref $app || "'$app'") . "\n";
    my $worker = Forkpool::Worker->from_env;
    local $self->{worker} = $worker;
    local $self->{listen_bits};
    local $self->{give_way_step};
    local $self->{app}    = $app;
    $worker->serve(sub { $self->serve_connection(@_) });
    return;
}

# True when a connection waits on the pool's listeners for a worker: the
# current one then closes after its response, so a kept-alive client does
# not keep a busy pool from the clients queued behind it. Asked only once
# the connection has had its turn (--keepalive-turn): closing at once
# would cost a new connection per request when clients outnumber workers.
# The listeners' select bits are worked out once per worker (its
# listeners do not change while it serves), not once per request.
sub _others_waiting {
    my ($self) = @_;
    my $bits = $self->_listen_bits;
    return 0 if $bits eq '';
    my $n = select(my $ready = $bits, undef, undef, 0);
    return $n > 0 ? 1 : 0;
}

# The select bits of the listeners where connections wait for a worker
# ('' for none): the pool's listeners (in kernel dispatch, the overflow).
sub _listen_bits {
    my ($self) = @_;
    return $self->{listen_bits} //= do {
        my $v = '';
        vec($v, fileno($_), 1) = 1 for $self->{worker}->waiting_listeners;
        $v;
    };
}

# One connection: requests until the client or a limit ends it.
sub serve_connection {
    my ($self, $sock) = @_;
    my $c = {
        sock => $sock, fd => fileno($sock), buf => '', served => 0,
        timeout => $self->{timeout}, armed => 0, opened => undef,
        channel_fd => fileno($self->{worker}->channel),
    };
    @$c{qw(remote_addr remote_port)} = _address(getpeername($sock));
    while (1) {
        my $req = $self->_read_request($c) or last;
        $c->{opened} //= $req->{start};
        $c->{last_start} = $req->{start};
        $c->{served}++;
        # Every 8th request of a kept-alive connection, a look at the
        # descriptor table: a leak must not fill it before the connection
        # ends (the worker then leaves, and this answer closes).
        $self->{worker}->check_headroom unless $c->{served} % 8;
        my $keep = $self->_serve_request($c, $req);
        last unless $keep && !$c->{leave};
    }
    delete $c->{informational};    # it holds $c: break the cycle
    $self->{worker}->leave if $c->{leave};
    return;
}

# Bounds each blocking read and write on the connection by --timeout,
# and turns off Nagle's delay for responses written in pieces. Done only
# when a body is read or a response written in pieces: a small request
# answered in one write needs neither, and skips three system calls.
sub _arm {
    my ($c) = @_;
    return if $c->{armed}++;
    my $timeval = pack('l!l!', int $c->{timeout},
        ($c->{timeout} - int $c->{timeout}) * 1e6);
    setsockopt($c->{sock}, SOL_SOCKET, SO_RCVTIMEO, $timeval);
    setsockopt($c->{sock}, SOL_SOCKET, SO_SNDTIMEO, $timeval);
    setsockopt($c->{sock}, IPPROTO_TCP, TCP_NODELAY, 1);
    return;
}

# An address and port from a packed socket address ('' and 0 for a Unix
# socket, which has none to give).
sub _address {
    my ($packed) = @_;
    return ('', 0) unless defined $packed && length $packed >= 2;
    my $family = sockaddr_family($packed);
    if ($family == AF_INET) {
        my ($port, $ip) = unpack_sockaddr_in($packed);
        return (inet_ntop(AF_INET, $ip), $port);
    }
    if ($family == AF_INET6) {
        my ($port, $ip) = unpack_sockaddr_in6($packed);
        return (inet_ntop(AF_INET6, $ip), $port);
    }
    return ('', 0);
}

# Waits until $fd is readable or, if given, the worker's channel is (the
# supervisor has something to say, most likely quit) or one of the
# listeners in the select bits $listeners is, for at most $timeout
# seconds. Returns 'conn', 'channel', 'listener' or '' on timeout, the
# channel first, then the connection. Linux's select says how much of
# the timeout is left, so a signal costs no clock reads.
sub _wait_readable {
    my ($fd, $timeout, $channel_fd, $listeners) = @_;
    my $bits = defined $listeners ? $listeners : '';
    vec($bits, $fd, 1) = 1;
    vec($bits, $channel_fd, 1) = 1 if defined $channel_fd;
    while (1) {
        (my $n, $timeout) = select(my $ready = $bits, undef, undef, $timeout);
        if ($n > 0) {
            return 'channel' if defined $channel_fd && vec($ready, $channel_fd, 1);
            return 'conn' if vec($ready, $fd, 1);
            return 'listener';
        }
        return '' if $n == 0;
        die "select: $!\n" unless $!{EINTR};
        return '' if $timeout <= 0;
    }
}

# Reads the next request head: a parsed request, or undef when the
# connection is to close (the client left or went quiet between
# requests, or the head was refused with an error response).
sub _read_request {
    my ($self, $c) = @_;
    if ($c->{served} && $c->{buf} eq '') {
        # Between two requests. Only the client and the channel count
        # while it is still the connection's turn (--keepalive-turn,
        # counted to the last request's start, so a little long), and in
        # any case for GIVE_WAY_IDLE, before which it never gives way: a
        # client that sends its next request by then costs one select, no
        # clock read and no call. Only a connection idle longer watches
        # the listeners as well (_next_request_comes).
        my $turn_left = $c->{opened} + $self->{keepalive_turn} - $c->{last_start};
        my $first = $turn_left > GIVE_WAY_IDLE ? $turn_left : GIVE_WAY_IDLE;
        my $timeout = $self->{keepalive_timeout};
        my $ready = _wait_readable($c->{fd}, $first < $timeout ? $first : $timeout, $c->{channel_fd});
        if ($ready ne 'conn') {
            return undef if $ready ne '' || $first >= $timeout;
            return undef unless $self->_next_request_comes($c, $first);
        }
    }
    my $start = Time::HiRes::time();
    my $end = $c->{buf} eq '' ? -1 : find_head_end($c->{buf});
    while ($end < 0) {
        if (length $c->{buf} > Forkpool::HTTP::MAX_LINE) {
            return $self->_refuse($c, $start, 414, 'request line over 8190 bytes')
                if incomplete_head_problem($c->{buf}) == 414;
        }
        return $self->_refuse($c, $start, 431, 'request head over --max-header-size')
            if length $c->{buf} > $self->{max_header_size};
        # Most requests are there already: try before waiting.
        my $n = recv($c->{sock}, my $data, READ_SIZE, MSG_DONTWAIT);
        if (defined $n) {
            return undef unless length $data;    # the client closed the connection
            $c->{buf} .= $data;
            $end = find_head_end($c->{buf});
            next;
        }
        return undef unless $!{EAGAIN} || $!{EWOULDBLOCK} || $!{EINTR};
        my $left = $start + $self->{header_timeout} - Time::HiRes::time();
        unless ($left > 0 && _wait_readable($c->{fd}, $left) eq 'conn') {
            # A client that never started a request gets no answer.
            return undef if $c->{served} && $c->{buf} eq '';
            return $self->_refuse($c, $start, 408, 'request head not complete within --header-timeout');
        }
    }
    my $head = substr($c->{buf}, 0, $end, '');
    my ($req, $status, $why) = parse_head($head);
    return $self->_refuse($c, $start, $status, $why) unless $req;
    return $self->_refuse($c, $start, 431, 'request head over --max-header-size')
        if $end > $self->{max_header_size};
    $req->{start} = $start;
    return $req;
}

# Between two requests on a kept-alive connection whose turn
# (--keepalive-turn) is over, idle for $waited seconds (at least
# GIVE_WAY_IDLE): true when the next request starts within
# --keepalive-timeout. False when the client is quiet that long, when the
# supervisor has a message for this worker (a Quit, most likely), or when
# another connection has waited on a listener this worker holds for
# GIVE_WAY_STEP times the slot modulo 4, plus one: no worker is free to
# take it, so this idle one gives way (docs/http.md, "Give-way"); its
# client expects an idle connection to close and retries on a new one.
sub _next_request_comes {
    my ($self, $c, $waited) = @_;
    my $timeout = $self->{keepalive_timeout} - $waited;
    my $deadline = Time::HiRes::time() + $timeout;
    my $listeners = $self->{listen_bits} // $self->_listen_bits;
    while (1) {
        my $ready = _wait_readable($c->{fd}, $timeout, $c->{channel_fd}, $listeners);
        return $ready eq 'conn' unless $ready eq 'listener';
        # Someone waits: give a free worker, if any, a moment to take it
        # first (this client has had its idle minimum already).
        my $step = $self->{give_way_step}
            //= GIVE_WAY_STEP * (($self->{worker}->slot // 0) % 4 + 1);
        $ready = _wait_readable($c->{fd}, $step, $c->{channel_fd});
        return $ready eq 'conn' if $ready ne '';
        return 0 if $self->_others_waiting;
        $timeout = $deadline - Time::HiRes::time();
        return 0 unless $timeout > 0;
    }
}

# Answers an unusable request with STATUS and closes the connection.
sub _refuse {
    my ($self, $c, $start, $status, $why, $req) = @_;
    my $body = "$status " . status_text($status) . ": $why\n";
    my $sent = eval {
        _write($c, response_head($status,
            ['Content-Type', 'text/plain', 'Content-Length', length $body],
            'Connection: close') . $body);
        1;
    };
    $self->_log_access($c, $req, $status, $sent ? length $body : 0, $start)
        if $self->{access_log};
    _linger($c);
    return undef;
}

# Half-closes the connection and reads what the client still sends for
# a moment, so that closing it does not reset it before the client has
# read the response.
sub _linger {
    my ($c) = @_;
    shutdown($c->{sock}, 1);
    my $deadline = Time::HiRes::time() + LINGER;
    my $read = 0;
    while ($read < MAX_DRAIN) {
        my $left = $deadline - Time::HiRes::time();
        last unless $left > 0 && _wait_readable($c->{fd}, $left) eq 'conn';
        my $n = sysread($c->{sock}, my $junk, READ_SIZE);
        last unless $n;
        $read += $n;
    }
    return;
}

# Serves one parsed request; true if the connection can serve another.
sub _serve_request {
    my ($self, $c, $req) = @_;
    # Most requests have no body, no Expect and no Connection header: the
    # checks of those headers are called only for a request that has one
    # (a call costs about as much as the check).
    my $headers = $req->{env};
    my ($framing, $length, $why) = exists $headers->{HTTP_TRANSFER_ENCODING}
        || exists $headers->{CONTENT_LENGTH}
        ? body_framing($req, $self->{max_body_size}) : ('none');
    return $self->_refuse($c, $req->{start}, $length, $why, $req) unless defined $framing;
    my ($continue, $status, $expect_why) = exists $headers->{HTTP_EXPECT}
        ? expects_continue($req) : (0);
    return $self->_refuse($c, $req->{start}, $status, $expect_why, $req)
        unless defined $continue;

    my $input = $framing eq 'none' ? $Forkpool::PSGI::Input::NO_BODY
        : Forkpool::PSGI::Input->new($self, $c, $framing, $length, $continue);
    my $env = $self->_env($c, $req, $input);
    if ($framing eq 'chunked') {
        unless (eval { _spool_chunked($env, $input); 1 }) {
            return undef if $c->{broken};
            my $error = $input->{error} || [500, 'cannot spool the request body'];
            _log_error("cannot read the body of $req->{method} $req->{target}: $@")
                unless $input->{error};
            return $self->_refuse($c, $req->{start}, @$error, $req);
        }
    }
    my $r = {
        keep => (exists $headers->{HTTP_CONNECTION} ? keeps_alive($req) : $req->{minor})
            && $c->{served} < $self->{max_keepalive_requests}
            && !$self->{worker}->leaving
            && ($req->{start} - $c->{opened} < $self->{keepalive_turn}
                || !$self->_others_waiting),
        head => $req->{method} eq 'HEAD',
        minor => $req->{minor},
        status => undef, bytes => 0,
    };
    $c->{r} = $r;    # for psgix.informational's check of the app's headers
    my $ok = eval {
        my $res = $self->{app}->($env);
        $r->{harakiri} = 1 if $env->{'psgix.harakiri.commit'};
        $self->_respond($c, $r, $res);
        1;
    };
    unless ($ok) {
        my $error = $@;
        return 0 if $c->{broken};    # the client left: nothing to answer
        if ($input->{error}) {
            # The body was bad (too large, malformed, too slow): the
            # client's fault, answered as such if nothing is sent yet.
            return $self->_refuse($c, $req->{start}, @{ $input->{error} }, $req)
                unless defined $r->{status};
        }
        elsif ($r->{bad_response}) {
            _log_error("the response of the app to $req->{method} $req->{target} "
                . "is refused, not sent: $r->{bad_response}");
            return $self->_refuse($c, $req->{start}, 500, 'the application gave a malformed response', $req)
                unless defined $r->{status};
        }
        else {
            chomp $error;
            _log_error("app died on $req->{method} $req->{target}: $error");
            return $self->_refuse($c, $req->{start}, 500, 'the application failed', $req)
                unless defined $r->{status};
        }
        # The response had begun: all we can do is cut it short.
        $r->{keep} = 0;
    }
    $self->_log_access($c, $req, $r->{status}, $r->{bytes}, $req->{start})
        if $self->{access_log};
    $c->{leave} = 1 if $env->{'psgix.harakiri.commit'};
    return 0 unless $r->{keep} && !$c->{broken};
    return $input->finish;
}

# A chunked body is decoded into a spool (memory, then a temporary file
# past SPOOL_MEMORY), and the app sees it with a CONTENT_LENGTH, as
# Starman does: Plack::Request and HTTP::Entity::Parser read a body by
# CONTENT_LENGTH, and without one would take psgi.input for the raw
# chunked stream. HTTP_TRANSFER_ENCODING stays, as sent (docs/http.md).
sub _spool_chunked {
    my ($env, $input) = @_;
    my $memory = '';
    my $file;
    my $length = 0;
    while (1) {
        my $data = $input->_take(READ_SIZE);
        last unless length $data;
        $length += length $data;
        if (!$file && length($memory) + length($data) > SPOOL_MEMORY) {
            $file = File::Temp::tempfile();
            _spool_write($input, $file, $memory);
            $memory = '';
        }
        if ($file) { _spool_write($input, $file, $data) }
        else       { $memory .= $data }
    }
    if ($file) {
        sysseek($file, 0, 0) or $input->_fail(500, "cannot rewind the spooled body: $!");
    }
    else {
        open($file, '<', \$memory) or die "cannot read the spooled body: $!\n";
    }
    $env->{CONTENT_LENGTH} = $length;
    $env->{'psgi.input'} = $file;
    $env->{'psgix.input.buffered'} = 1;
    return;
}

sub _spool_write {
    my ($input, $file, $data) = @_;
    my $offset = 0;
    while ($offset < length $data) {
        my $n = syswrite($file, $data, length($data) - $offset, $offset);
        $input->_fail(500, "cannot spool the request body to a temporary file: $!")
            unless defined $n;
        $offset += $n;
    }
    return;
}

sub _log_error {
    my ($text) = @_;
    $text =~ s/\n(?!\z)/\n    /g;
    syswrite(STDERR, "forkpool-psgi: $text\n");
    return;
}

# The access log line of a request (callers check --no-access-log).
sub _log_access {
    my ($self, $c, $req, $status, $bytes, $start) = @_;
    my $now = Time::HiRes::time();
    syswrite(STDERR, access_line(
        host     => $c->{remote_addr} || '-',
        start    => $start,
        request  => $req ? "$req->{method} $req->{target} $req->{protocol}" : undef,
        status   => $status,
        bytes    => $bytes,
        referer  => $req && $req->{referer},
        agent    => $req && $req->{agent},
        duration => $now - $start,
        # Asked per line: under --preload, $worker is the template until
        # the fork makes it this worker.
        slot     => $self->{worker}->slot,
    ));
    return;
}

# The PSGI environment of a request.
sub _env {
    my ($self, $c, $req, $input) = @_;
    my $path = $req->{path};
    $path =~ s/%([0-9A-Fa-f]{2})/chr hex $1/ge if index($path, '%') >= 0;
    my $env = $req->{env};
    # The log shows what the client sent, whatever the app does to $env.
    @$req{qw(referer agent)} = @$env{qw(HTTP_REFERER HTTP_USER_AGENT)} if $self->{access_log};
    my ($host_name, $host_port) = ($env->{HTTP_HOST} // '') =~ /\A(\[[^\]]*\]|[^:]*)(?::(\d+))?\z/;
    unless (length($host_name // '')) {
        # No Host (HTTP/1.0): the address the client connected to.
        my $addr;
        ($addr, $host_port) = _address(getsockname($c->{sock}));
        $host_name = length $addr ? $addr : 'localhost';
    }
    # psgix.informational needs the request's protocol: one closure per
    # connection, told the protocol of each request.
    $c->{minor} = $req->{minor};
    $c->{informational} //= sub { _informational($c, @_) };
    @$env{qw(
        REQUEST_METHOD SCRIPT_NAME PATH_INFO REQUEST_URI QUERY_STRING
        SERVER_NAME SERVER_PORT SERVER_PROTOCOL REMOTE_ADDR REMOTE_PORT
        psgi.version psgi.url_scheme psgi.input psgi.errors
        psgi.multithread psgi.multiprocess psgi.run_once psgi.streaming
        psgi.nonblocking psgix.input.buffered psgix.harakiri
        psgix.informational
    )} = (
        $req->{method}, '', $path, $req->{target}, $req->{query},
        $host_name, $host_port // 80, $req->{protocol}, $c->{remote_addr},
        $c->{remote_port},
        [1, 1], 'http', $input, *STDERR,
        0, 1, 0, 1,
        0, 0, 1,
        $c->{informational},
    );
    return $env;
}

# The head of a response, or a death, before anything of it is sent, if
# the app's headers would not make a well-formed head (response_head
# says why); the reason goes in $r, so that the request is answered 500
# and the log names the header.
sub _head_or_refuse {
    my ($r, @head) = @_;
    my ($head, $problem) = response_head(@head);
    return $head if defined $head;
    $r->{status} = undef;    # nothing was sent: the 500 can still go out
    $r->{bad_response} = $problem;
    die "$problem\n";
}

# psgix.informational: a 1xx response before the final one.
sub _informational {
    my ($c, $status, $headers) = @_;
    return unless $c->{minor} >= 1 && $status >= 100 && $status < 200;
    _write($c, _head_or_refuse($c->{r}, $status, $headers || []));
    return;
}

# Sends the app's response: an array reference or a delayed response.
sub _respond {
    my ($self, $c, $r, $res) = @_;
    if (ref $res eq 'ARRAY') {
        _check_response($res, 3);
        return $self->_send_response($c, $r, @$res);
    }
    if (ref $res eq 'CODE') {
        my $writer;
        $res->(sub {
            my ($response) = @_;
            ref $response eq 'ARRAY' && (@$response == 2 || @$response == 3)
                or die "the responder takes [status, headers] or [status, headers, body]\n";
            _check_response($response, scalar @$response);
            die "the responder was called twice\n" if defined $r->{status};
            if (@$response == 3) {
                $self->_send_response($c, $r, @$response);
                return;
            }
            $self->_send_head($c, $r, @$response, undef);
            return $writer = Forkpool::PSGI::Writer->new($c, $r);
        });
        defined $r->{status}
            or die "the delayed response returned without calling its responder "
            . "(this server is blocking: psgi.nonblocking is false)\n";
        if ($writer && !$writer->{closed}) {
            # The app dropped the writer without closing it: the body has
            # no proper end, so the connection cannot be reused.
            $r->{keep} = 0;
        }
        return;
    }
    die "the app returned " . (ref $res || (defined $res ? "'$res'" : 'undef'))
        . " instead of an array reference or a code reference\n";
}

sub _check_response {
    my ($res, $size) = @_;
    @$res == $size && defined $res->[0] && $res->[0] =~ /\A[1-9]\d\d\z/
        && ref $res->[1] eq 'ARRAY' && @{ $res->[1] } % 2 == 0
        or die "malformed response: want [STATUS, [HEADERS], BODY] with a "
        . "3-digit status and an even list of headers\n";
    return;
}

# Whether a response with this status carries a body at all.
sub _has_body {
    my ($status) = @_;
    return !($status < 200 || $status == 204 || $status == 304);
}

# Sends a response whose body is known: an array of strings or a handle.
sub _send_response {
    my ($self, $c, $r, $status, $headers, $body) = @_;
    my $length;
    if (ref $body eq 'ARRAY') {
        $length = 0;
        $length += length $_ for @$body;
    }
    my $head = $self->_send_head($c, $r, $status, $headers, $length, 1);
    if (!$r->{with_body}) {
        $self->_ending($r, $head);
        _write($c, $head);
        $body->close if ref $body ne 'ARRAY';
        return;
    }
    if (ref $body eq 'ARRAY') {
        my $data = join '', @$body;
        my $out = $r->{chunked} && length $data
            ? $head . sprintf('%x', length $data) . "\r\n$data\r\n0\r\n\r\n"
            : $r->{chunked} ? "${head}0\r\n\r\n" : $head . $data;
        $self->_ending($r, $out);
        _write($c, $out);
        $r->{bytes} += length $data;
        return;
    }
    _write($c, $head);
    $self->_send_handle($c, $r, $body);
    return;
}

# Just before $out, the one write of a response that ends the connection,
# goes out: the worker may go idle now (Forkpool::Worker's
# ending_connection). Not when the connection stays open, when the write
# may wait for the client (a large one), or when the app asked the worker
# to leave (psgix.harakiri).
sub _ending {
    my ($self, $r, $out) = @_;
    return if $r->{keep} || $r->{harakiri} || length $out > ENDING_WRITE_MAX;
    $self->{worker}->ending_connection;
    return;
}

# Works out the framing of a response, records it in $r and returns its
# head. Sends it unless $hold (then the caller sends it with the body).
# $length is the body's length when the server knows it.
sub _send_head {
    my ($self, $c, $r, $status, $headers, $length, $hold) = @_;
    my @headers;
    my ($app_length, $app_te, $app_close);
    for (my $i = 0; $i < @$headers; $i += 2) {
        my $name = lc $headers->[$i];
        if ($name eq 'connection') {
            $app_close = 1 if $headers->[$i + 1] =~ /\bclose\b/i;
            next;
        }
        $app_length = $headers->[$i + 1] if $name eq 'content-length';
        $app_te = 1 if $name eq 'transfer-encoding';
        push @headers, $headers->[$i], $headers->[$i + 1];
    }
    my @extra;
    $r->{status} = $status;
    my $has_body = !($status < 200 || $status == 204 || $status == 304);    # _has_body
    $r->{with_body} = !$r->{head} && $has_body;
    $r->{keep} = 0 if $app_close;
    if (!$has_body) {
        # no body, no framing
    }
    elsif (defined $app_length || $app_te) {
        $r->{keep} = 0 if $app_te;    # the app frames its own body: trust nothing after it
    }
    elsif ($r->{head}) {
        # A HEAD answer cannot say how long the GET body would be.
    }
    elsif (defined $length) {
        push @extra, "Content-Length: $length";
    }
    elsif ($r->{minor} >= 1) {
        push @extra, 'Transfer-Encoding: chunked';
        $r->{chunked} = 1;
    }
    else {
        $r->{keep} = 0;    # HTTP/1.0 with no length: the close ends the body
    }
    push @extra, !$r->{keep} ? 'Connection: close'
        : $r->{minor} == 0 ? 'Connection: keep-alive' : ();
    # _head_or_refuse, written out: it runs on every response.
    my ($head, $problem) = response_head($status, \@headers, @extra);
    unless (defined $head) {
        $r->{status} = undef;
        $r->{bad_response} = $problem;
        die "$problem\n";
    }
    _write($c, $head) unless $hold;
    return $head;
}

# Sends a body given as a handle: with sendfile(2) when it is a plain
# file and the body needs no chunk framing, else read in large blocks.
sub _send_handle {
    my ($self, $c, $r, $body) = @_;
    _arm($c);
    my $fd = ref $body eq 'GLOB' || (blessed $body && reftype $body eq 'GLOB')
        ? fileno($body) : undef;
    if (defined $SENDFILE && !$r->{chunked} && defined $fd && $fd >= 0 && -f $body
        && tell($body) == sysseek($body, 0, 1)) {
        while (1) {
            my $n = syscall($SENDFILE, $c->{fd}, $fd, 0, 1 << 24);
            if ($n > 0) { $r->{bytes} += $n; next }
            last if $n == 0;
            next if $!{EINTR};
            $c->{broken} = 1;
            die "sendfile to the client failed: $!\n";
        }
    }
    else {
        local $/ = \READ_SIZE;
        while (defined(my $data = $body->getline)) {
            next unless length $data;
            _write($c, $r->{chunked} ? sprintf('%x', length $data) . "\r\n$data\r\n" : $data);
            $r->{bytes} += length $data;
        }
        _write($c, "0\r\n\r\n") if $r->{chunked};
    }
    $body->close;
    return;
}

# Writes all of $data to the client, or marks the connection broken and
# dies (the client left, or did not read for --timeout).
sub _write {
    my ($c, $data) = @_;
    die "the client has gone\n" if $c->{broken};
    _arm($c) if length $data > READ_SIZE;
    my $offset = 0;
    while ($offset < length $data) {
        my $n = syswrite($c->{sock}, $data, length($data) - $offset, $offset);
        if (defined $n) { $offset += $n; next }
        next if $!{EINTR};
        $c->{broken} = 1;
        die "writing to the client failed: $!\n";
    }
    return;
}

# The writer of a streamed response (psgi.streaming).
package Forkpool::PSGI::Writer;

sub new {
    my ($class, $c, $r) = @_;
    Forkpool::PSGI::_arm($c);
    return bless { c => $c, r => $r, closed => 0 }, $class;
}

# Sends one piece of the body.
sub write {
    my ($self, $data) = @_;
    die "write on a closed writer\n" if $self->{closed};
    my $r = $self->{r};
    return unless defined $data && length $data && $r->{with_body};
    Forkpool::PSGI::_write($self->{c},
        $r->{chunked} ? sprintf('%x', length $data) . "\r\n$data\r\n" : $data);
    $r->{bytes} += length $data;
    return;
}

# Ends the body.
sub close {
    my ($self) = @_;
    return if $self->{closed};
    $self->{closed} = 1;
    Forkpool::PSGI::_write($self->{c}, "0\r\n\r\n")
        if $self->{r}{chunked} && $self->{r}{with_body};
    return;
}

# This server is blocking: the callback runs at once.
sub poll_cb {
    my ($self, $cb) = @_;
    $cb->($self) until $self->{closed};
    return;
}

# psgi.input: the request body, read from the socket as the app asks for
# it, never whole into memory.
package Forkpool::PSGI::Input;

use Forkpool::HTTP qw(parse_chunk_size trailer_problem);

sub new {
    my ($class, $server, $c, $framing, $length, $continue) = @_;
    return bless {
        server   => $server,
        c        => $c,
        chunked  => $framing eq 'chunked',
        left     => $framing eq 'length' ? $length : 0,
        done     => $framing eq 'none' || ($framing eq 'length' && $length == 0),
        continue => $continue,
        total    => 0,
        error    => undef,
        deadline => undef,    # set by the first read: --body-timeout from then
    }, $class;
}

# The input of every request without a body: nothing to read, nothing
# to drain, nothing per request to allocate.
our $NO_BODY = __PACKAGE__->new(undef, undef, 'none', 0, 0);

# read($buffer, $length, $offset): like Perl's read; 0 at the end of the
# body. Dies if the body is malformed, too large or too slow.
sub read {
    my ($self, undef, $length, $offset) = @_;
    $offset //= 0;
    my $data = $self->{done} || !$length ? '' : $self->_take($length);
    $_[1] //= '';
    $_[1] .= "\0" x ($offset - length $_[1]) if $offset > length $_[1];
    substr($_[1], $offset) = $data;
    return length $data;
}

# Not seekable: the body is read once, from the socket.
sub seek { return 0 }

sub close { return 1 }

# Up to $max bytes of body; '' at the end.
sub _take {
    my ($self, $max) = @_;
    $self->{deadline} //= Time::HiRes::time() + $self->{server}{body_timeout};
    if ($self->{continue}) {
        $self->{continue} = 0;
        Forkpool::PSGI::_write($self->{c}, "HTTP/1.1 100 Continue\r\n\r\n");
    }
    if (!$self->{chunked}) {
        my $data = $self->_read_some($max < $self->{left} ? $max : $self->{left});
        $self->{done} = 1 unless $self->{left} -= length $data;
        return $data;
    }
    if ($self->{left} == 0) {
        my $size = parse_chunk_size($self->_read_line);
        $self->_fail(400, 'malformed chunk size in the request body') unless defined $size;
        if ($size == 0) {
            $self->_read_trailers;
            $self->{done} = 1;
            return '';
        }
        $self->{total} += $size;
        my $limit = $self->{server}{max_body_size};
        $self->_fail(413, "chunked body over the limit of $limit bytes")
            if $limit && $self->{total} > $limit;
        $self->{left} = $size;
    }
    my $data = $self->_read_some($max < $self->{left} ? $max : $self->{left});
    unless ($self->{left} -= length $data) {
        $self->_read_line eq ''
            or $self->_fail(400, 'chunk data longer than its size');
    }
    return $data;
}

# Between 1 and $max bytes: from what is buffered, else one read.
sub _read_some {
    my ($self, $max) = @_;
    my $c = $self->{c};
    return substr($c->{buf}, 0, $max, '') if length $c->{buf};
    return $self->_recv($max);
}

# One read of at most $max bytes from the client; dies at the end of
# the stream, when the client is silent for --timeout, or when the body
# is not complete by its deadline (--body-timeout), however the bytes
# trickle in.
sub _recv {
    my ($self, $max) = @_;
    my $c = $self->{c};
    Forkpool::PSGI::_arm($c);
    while (1) {
        my $left = $self->{deadline} - Time::HiRes::time();
        my $wait = $left < $c->{timeout} ? $left : $c->{timeout};
        unless ($wait > 0 && Forkpool::PSGI::_wait_readable($c->{fd}, $wait) eq 'conn') {
            $self->_fail(408, $left <= $c->{timeout}
                ? 'request body not complete within --body-timeout'
                : 'request body not sent within --timeout');
        }
        my $n = sysread($c->{sock}, my $data, $max);
        return $data if $n;
        next if !defined $n && $!{EINTR};
        $self->_fail(408, 'request body not sent within --timeout')
            if !defined $n && ($!{EAGAIN} || $!{EWOULDBLOCK});
        $c->{broken} = 1;
        $self->_fail(400, 'the client closed the connection in the middle of the body');
    }
}

# One line of chunk framing, without its CRLF; a line ending in a bare
# LF, or holding a bare CR, is refused (docs/http.md).
sub _read_line {
    my ($self) = @_;
    my $c = $self->{c};
    my $at;
    while (($at = index($c->{buf}, "\n")) < 0) {
        $self->_fail(400, 'chunk framing line too long') if length $c->{buf} > 4096;
        $c->{buf} .= $self->_recv(Forkpool::PSGI::READ_SIZE());
    }
    $self->_fail(400, 'chunk framing line too long') if $at > 4097;
    my $line = substr($c->{buf}, 0, $at + 1, '');
    $line =~ s/\r\n\z// && index($line, "\r") < 0
        or $self->_fail(400, 'a line of the chunked body does not end in CRLF');
    return $line;
}

# Reads the trailer section after the last chunk, checks it and drops it.
sub _read_trailers {
    my ($self) = @_;
    my ($size, @lines) = (0);
    while ((my $line = $self->_read_line) ne '') {
        $size += length $line;
        $self->_fail(431, 'chunked body trailers over --max-header-size')
            if $size > $self->{server}{max_header_size} || @lines >= Forkpool::HTTP::MAX_FIELDS;
        push @lines, $line;
    }
    my ($status, $why) = trailer_problem(@lines);
    $self->_fail($status, $why) if $status;
    return;
}

sub _fail {
    my ($self, $status, $why) = @_;
    $self->{error} = [$status, $why];
    die "$why\n";
}

# After the response: reads what the app left of the body, so that the
# connection can carry the next request. False if it cannot (too much
# left, a 100 Continue never sent, a bad body).
sub finish {
    my ($self) = @_;
    return 1 if $self->{done};
    return 0 if $self->{continue} || $self->{error};
    my $read = 0;
    while (!$self->{done}) {
        return 0 if $read > Forkpool::PSGI::MAX_DRAIN();
        my $data = eval { $self->_take(Forkpool::PSGI::READ_SIZE()) };
        return 0 unless defined $data;
        $read += length $data;
    }
    return 1;
}

1;
