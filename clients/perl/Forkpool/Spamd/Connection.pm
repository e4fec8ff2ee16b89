package Forkpool::Spamd::Connection;

# One spamc connection, answered as spamd answers it: the request line
# (CHECK, SYMBOLS, REPORT, REPORT_IFSPAM, PROCESS, HEADERS, TELL, PING,
# SKIP), the request headers (Content-length, User, Compress,
# Message-class, Set, Remove), the message, and the answer with spamd's
# status codes, status lines and headers, byte for byte. The client's
# wrong requests get spamd's error lines (76 EX_PROTOCOL, 69
# EX_UNAVAILABLE, 79 EX_TIMEOUT) and the worker goes on.

use strict;
use warnings;

use Mail::SpamAssassin ();
use Mail::SpamAssassin::Logger qw(info dbg);
use Mail::SpamAssassin::PerMsgStatus ();
use Socket qw(AF_UNIX NI_NAMEREQD NI_NUMERICHOST NIx_NOSERV getnameinfo);

our $VERSION = '1';

# sysexits codes spamd answers with.
our %CODE = (
    EX_OK          => 0,
    EX_UNAVAILABLE => 69,
    EX_PROTOCOL    => 76,
    EX_TIMEOUT     => 79,
);

# The most request headers spamd reads before calling it an attack.
use constant MAX_HEADERS => 256;

# What each request header does.
my %HEADERS = (
    'Content-length' => \&_header_content_length,
    'User'           => \&_header_user,
    'Message-class'  => \&_header_message_class,
    'Set'            => \&_header_set,
    'Remove'         => \&_header_remove,
    'Compress'       => \&_header_compress,
);

# Answers one connection $sock for $server (Forkpool::Spamd::Server);
# $path is the Unix socket's path when it came on one.
sub serve {
    my ($class, $server, $sock, $path) = @_;
    my $self = bless { server => $server, sa => $server->{sa}, sock => $sock,
        opt => $server->{opt}, start => time, unix_path => $path }, $class;
    $self->{sa}->timer_reset;
    $self->_peer or return;
    my $line = $self->_with_alarm($self->{opt}{'timeout-tcp'}, sub { scalar readline($sock) });
    if ($self->{timed_out}) {
        return $self->_timeout("($self->{opt}{'timeout-tcp'} second socket timeout reading input from client)");
    }
    return $self->protocol_error('(closed before headers)') unless defined $line;
    $line =~ s/\r?\n//;
    if ($line =~ /(PROCESS|CHECK|SYMBOLS|REPORT|HEADERS|REPORT_IFSPAM) SPAMC\/(.*)/) {
        my ($method, $version) = ($1, $2);
        $self->_timed($method, sub { $self->check($method, $version) });
    }
    elsif ($line =~ /(TELL) SPAMC\/(.*)/) {
        my ($method, $version) = ($1, $2);
        $self->_timed($method, sub { $self->tell($method, $version) });
    }
    elsif ($line =~ /(SKIP|PING) SPAMC\/(.*)/) {
        my ($method, $version) = ($1, $2);
        info('spamd: skipped large message in %3.1f seconds', time - $self->{start})
            if $method eq 'SKIP';
        $self->skip_or_ping($method, $version);
    }
    else {
        $self->protocol_error($line);
    }
    return;
}

# The peer's port, address and name, as spamd logs and tags them; false
# (the connection closed) for an address -A does not allow.
sub _peer {
    my ($self) = @_;
    my $sock = $self->{sock};
    my $peer = getpeername($sock);
    my $family = $peer ? Socket::sockaddr_family($peer) : AF_UNIX;
    if ($family == AF_UNIX) {
        @$self{qw(host addr port)} = ('localhost', '127.0.0.1', $self->{unix_path} // '');
        info('spamd: got connection over %s', $self->{port});
        return 1;
    }
    my ($err, $addr, $port) = getnameinfo($peer, NI_NUMERICHOST | Socket::NI_NUMERICSERV());
    my ($nerr, $host) = getnameinfo($peer, NI_NAMEREQD, NIx_NOSERV);
    my $local_port = (getnameinfo(getsockname($sock), NI_NUMERICHOST | Socket::NI_NUMERICSERV()))[2];
    @$self{qw(host addr port)} = ($nerr ? $addr : $host, $addr, $port);
    my $msg = sprintf('connection from %s [%s]:%s to port %d, fd %d',
        $self->{host}, $addr, $port, $local_port, fileno($sock));
    if ($self->{server}->allowed($addr)) {
        info("spamd: $msg");
        return 1;
    }
    warn "spamd: unauthorized $msg\n";
    return 0;
}

# Runs $code with an alarm of $secs (0: none); sets timed_out when it
# went off.
sub _with_alarm {
    my ($self, $secs, $code) = @_;
    my @result;
    my $ok = eval {
        local $SIG{ALRM} = sub { die "forkpool-spamd timeout\n" };
        alarm $secs if $secs;
        @result = $code->();
        alarm 0;
        1;
    };
    alarm 0;
    unless ($ok) {
        die $@ unless $@ eq "forkpool-spamd timeout\n";
        $self->{timed_out} = 1;
    }
    return wantarray ? @result : $result[0];
}

# A command under --timeout-child.
sub _timed {
    my ($self, $method, $code) = @_;
    my $secs = $self->{opt}{'timeout-child'};
    $self->_with_alarm($secs, $code);
    $self->_timeout("($secs second timeout while trying to $method)") if $self->{timed_out};
    return;
}

# Writes all of $buf as spamd does: retries short writes, at most ten
# tries; the bytes written.
sub write_all {
    my ($self, $buf) = @_;
    my ($written, $tries) = (0, 0);
    while ($written < length($buf) && $tries++ < 10) {
        my $n = syswrite($self->{sock}, $buf, length($buf) - $written, $written);
        if (!defined $n) {
            return unless $!{EAGAIN} || $!{EWOULDBLOCK} || $!{EINTR};
            next;
        }
        last if $n == 0;
        $written += $n;
    }
    return $written;
}

# spamd's one-line error answers: the line to the client, the reason to
# the log; false, for the caller to return.
sub protocol_error { $_[0]->_error(EX_PROTOCOL => 'Bad header line', 'bad protocol: header error', $_[1]) }
sub unavailable    { $_[0]->_error(EX_UNAVAILABLE => 'Service Unavailable', 'service unavailable', $_[1]) }
sub _timeout       { $_[0]->_error(EX_TIMEOUT => 'Timeout', 'timeout', $_[1]) }

sub _error {
    my ($self, $code, $what, $log, $err) = @_;
    syswrite($self->{sock}, "SPAMD/1.0 $CODE{$code} $what: $err\r\n");
    warn "spamd: $log: $err\n";
    return 0;
}

# The request headers into a hash; false after answering an error.
sub read_headers {
    my ($self) = @_;
    my %h;
    for (1 .. MAX_HEADERS) {
        my $line = readline($self->{sock});
        return $self->protocol_error('(EOF during headers)') unless defined $line;
        $line =~ s/\r\n$//;
        return \%h unless length $line;
        my ($name, $value) = split /:\s*/, $line, 2;
        return $self->protocol_error("(header not in 'Name: value' format)") unless defined $value;
        # Names are matched case-sensitively, as spamd does; others are ignored.
        my $take = $HEADERS{$name} or next;
        $take->($self, \%h, $value) or return 0;
    }
    return $self->protocol_error('(too many headers)');
}

sub _header_content_length {
    my ($self, $h, $value) = @_;
    $value =~ /^(\d*)$/ or return $self->protocol_error('(Content-Length contains non-numeric bytes)');
    $h->{length} = $1;
    return 1;
}

sub _header_user {
    my ($self, $h, $value) = @_;
    $value =~ /^([\x20-\xFF]*)$/ or return $self->protocol_error('(User header contains control chars)');
    $self->{user} = $1;
    $self->{server}{users}->take_user($1);
    return 1;
}

sub _header_message_class {
    my ($self, $h, $value) = @_;
    $h->{message_class} = $value;
    return 1;
}

sub _header_set    { $_[0]->_local_remote($_[1], 'set', $_[2]) }
sub _header_remove { $_[0]->_local_remote($_[1], 'remove', $_[2]) }

sub _local_remote {
    my ($self, $h, $what, $value) = @_;
    $h->{"${what}_local"}  = $value =~ /local/i  ? 1 : 0;
    $h->{"${what}_remote"} = $value =~ /remote/i ? 1 : 0;
    return 1;
}

sub _header_compress {
    my ($self, $h, $value) = @_;
    $value =~ /zlib/i or return $self->protocol_error("(compression type not supported: $value)");
    eval { require Compress::Zlib; 1 }
        or return $self->protocol_error("(compression not supported, Compress::Zlib not installed: $@)");
    $h->{zlib} = 1;
    dbg("spamd: compress header received: $value");
    return 1;
}

# The message: (mail object, bytes read), or an empty list after
# answering an error.
sub read_body {
    my ($self, $h) = @_;
    my $expected = $h->{length};
    my (@lines, $actual);
    if ($h->{zlib}) {
        return $self->unavailable('Compress requires Content-length header') unless defined $expected;
        $actual = $self->_inflate($expected, \@lines);
        return if $actual < 0;
    }
    else {
        $actual = 0;
        while (defined(my $line = readline($self->{sock}))) {
            $actual += length $line;
            push @lines, $line;
            last if defined $expected && $actual >= $expected;
        }
    }
    my $timeout = $self->{opt}{'timeout-child'};
    my $mail = $self->{sa}->parse(\@lines, 0,
        $timeout ? { master_deadline => $self->{start} + $timeout } : ());
    return ($mail, $actual);
}

sub _inflate {
    my ($self, $expected, $lines) = @_;
    my $out;
    my $ok = eval {
        my ($zlib, $status) = Compress::Zlib::inflateInit();
        $zlib or die "inflateInit failed: $status";
        my ($buf, $red) = ('', 0);
        while (1) {
            my $n = read($self->{sock}, $buf, 65536, $red);
            defined $n or die "read of zlib data failed: $!";
            last if $n == 0;
            $red += $n;
        }
        if ($red > $expected) {
            warn "spamd: zlib read $red > expected_length $expected\n";
            substr($buf, $expected) = '';
        }
        ($out, $status) = $zlib->inflate($buf);
        $status == Compress::Zlib::Z_STREAM_END() or die "failed to find end of zlib stream\n";
        1;
    };
    unless ($ok) {
        $self->unavailable("zlib: $@");
        return -1;
    }
    # Lines keep their endings; a last line without one gains one, as in spamd.
    @$lines = map { my $s = $_; $s =~ s/$/\n/gs; $s } split /\n/, $out;
    return length $out;
}

# The message's Message-Id and Resent-Message-Id, cleaned for the log.
sub message_ids {
    my ($mail) = @_;
    my @ids = map { $mail->get_pristine_header($_) } 'Message-Id', 'Resent-Message-Id';
    for my $id (@ids) {
        next unless $id;
        1 while $id =~ s/\([^\(\)]*\)//;
        $id =~ s/^\s+|\s+$//g;
        $id =~ s/\s+/ /g;
        $id =~ s/^.*?<(.*?)>.*$/$1/;
        $id =~ s/[^\x21-\x7e]/?/g;
        $id =~ s/[<>]/?/g;
        $id =~ s/^(.+)$/<$1>/;
    }
    return @ids;
}

# The checking commands; true once answered.
sub check {
    my ($self, $method, $version) = @_;
    my $h = {};
    if ($version > 1.0) {
        $h = $self->read_headers or return 0;
    }
    $self->{server}{users}->before_check;
    die "spamd: still running as root! dying" if $> == 0;
    my ($mail, $actual) = $self->read_body($h) or return 0;
    my $expected = $h->{zlib} ? $actual : $h->{length};
    my ($msgid, $rmsgid) = message_ids($mail);
    $msgid ||= '(unknown)';
    my $user = $self->{user} ||= '(unknown)';
    info('spamd: ' . ($method eq 'PROCESS' ? 'processing' : 'checking')
        . " message $msgid" . ($rmsgid ? " aka $rmsgid" : '') . " for $user:$>");
    if (defined $expected && $actual != $expected) {
        $self->protocol_error("(Content-Length mismatch: Expected $expected bytes, got $actual bytes)");
        $mail->finish;
        return 0;
    }
    my $sa = $self->{sa};
    $sa->init(1);
    my $status = Mail::SpamAssassin::PerMsgStatus->new($sa, $mail);
    $status->check;
    $self->write_all($self->answer($status, $method, $version));
    $self->_log_result($status, $actual, $msgid, $rmsgid);
    if ($status->{bayes_expiry_due}) {
        $sa->rebuild_learner_caches;
        $sa->finish_learner;
    }
    $status->finish;
    $mail->finish;
    return 1;
}

# The whole answer to a checking command, as spamd writes it.
sub answer {
    my ($self, $status, $method, $version) = @_;
    my $score = Mail::SpamAssassin::Util::get_tag_value_for_score(
        $status->get_score, $status->get_required_score, $status->is_spam);
    my $threshold = sprintf '%2.1f', $status->get_required_score;
    my $verdict = $status->is_spam
        ? ($method eq 'REPORT_IFSPAM' ? 'Yes' : 'True')
        : ($method eq 'REPORT_IFSPAM' ? 'No' : 'False');
    my $spam = "Spam: $verdict ; $score / $threshold";
    my $ok = "SPAMD/1.1 $CODE{EX_OK} EX_OK\r\n";
    if ($method eq 'PROCESS' || $method eq 'HEADERS') {
        $status->set_tag('REMOTEHOSTNAME', $self->{host});
        $status->set_tag('REMOTEHOSTADDR', $self->{addr});
        my $body = $status->rewrite_mail;
        $body =~ s/(\015?\012\015?\012).*$/$1/gs if $method eq 'HEADERS';
        my $length = length $body;
        return "${ok}Content-length: $length\r\n$spam\r\n\r\n$body" if $version >= 1.3;
        return "${ok}Content-length: $length\r\n\r\n$body" if $version >= 1.2;
        return "SPAMD/1.0 $CODE{EX_OK} EX_OK\r\n$body";
    }
    return "$ok$spam\r\n\r\n" if $method eq 'CHECK';
    my $body = '';
    if ($method eq 'REPORT' || ($method eq 'REPORT_IFSPAM' && $status->is_spam)) {
        $body = $status->get_report;
    }
    elsif ($method eq 'SYMBOLS') {
        $body = $status->get_names_of_tests_hit;
        $body .= "\r\n" if $version < 1.3;
    }
    return "${ok}Content-length: " . length($body) . "\r\n$spam\r\n\r\n$body" if $version >= 1.3;
    return "$ok$spam\r\n\r\n$body";
}

sub _log_result {
    my ($self, $status, $actual, $msgid, $rmsgid) = @_;
    my $score = Mail::SpamAssassin::Util::get_tag_value_for_score(
        $status->get_score, $status->get_required_score, $status->is_spam);
    my $threshold = sprintf '%2.1f', $status->get_required_score;
    my $scantime = sprintf '%.1f', time - $self->{start};
    info('spamd: ' . ($status->is_spam ? 'identified spam' : 'clean message')
        . " ($score/$threshold) for $self->{user}:$> in $scantime seconds, $actual bytes.");
    my @extra = ("scantime=$scantime", "size=$actual", "user=$self->{user}", "uid=$>",
        "required_score=$threshold", "rhost=$self->{host}", "raddr=$self->{addr}",
        "rport=$self->{port}");
    for ([mid => $msgid], [rmid => $rmsgid]) {
        my ($key, $id) = @$_;
        next unless $id;
        (my $safe = $id) =~ s/[\x00-\x20\s,]/_/gs;
        push @extra, "$key=$safe";
    }
    push @extra, 'bayes=' . sprintf('%06f', $status->{bayes_score}) if defined $status->{bayes_score};
    push @extra, 'autolearn=' . $status->get_autolearn_status, $status->get_spamd_result_log_items;
    my $tests = join ',', sort grep { length } $status->get_names_of_tests_hit;
    my $log = sprintf 'spamd: result: %s %2d - %s %s', $status->is_spam ? 'Y' : '.',
        $status->get_score, $tests, join(',', @extra);
    info($log);
    $self->{sa}->call_plugins('log_scan_result', { result => $log });
    return;
}

# TELL (learning and reporting); true once answered.
sub tell {
    my ($self, $method, $version) = @_;
    my $h = $self->read_headers or return 0;
    $self->{server}{users}->before_check;
    die "spamd: still running as root! dying" if $> == 0;
    return $self->unavailable('TELL commands are not enabled, set the --allow-tell switch.')
        unless $self->{opt}{'allow-tell'};
    return $self->protocol_error('Unable to set local and remove local in the same operation.')
        if $h->{set_local} && $h->{remove_local};
    return $self->protocol_error('Unable to set remote and remove remote in the same operation.')
        if $h->{set_remote} && $h->{remove_remote};
    my ($mail, $actual) = $self->read_body($h) or return 0;
    my $sa = $self->{sa};
    my $expected = $h->{zlib} ? $actual : $h->{length};
    if ($mail->get_header('X-Spam-Checker-Version')) {
        my $clean = $sa->parse($sa->remove_spamassassin_markup($mail), 1);
        $mail->finish;
        $mail = $clean;
    }
    $self->{user} ||= '(unknown)';
    if (defined $expected && $actual != $expected) {
        $self->protocol_error("(Content-Length mismatch: Expected $expected bytes, got $actual bytes)");
        $mail->finish;
        return 0;
    }
    my (@set, @removed);
    if (defined $sa->{bayes_scanner} && $sa->{conf}{bayes_learn_during_report}) {
        if ($h->{set_local}) {
            my $s = $sa->learn($mail, undef, (($h->{message_class} // '') eq 'spam' ? 1 : 0), 0);
            push @set, 'local' if $s->did_learn;
            $s->finish;
        }
        if ($h->{remove_local}) {
            my $s = $sa->learn($mail, undef, undef, 1);
            push @removed, 'local' if $s->did_learn;
            $s->finish;
        }
    }
    if ($h->{set_remote} || $h->{remove_remote}) {
        require Mail::SpamAssassin::Reporter;
        my $reporter = Mail::SpamAssassin::Reporter->new($sa, $mail);
        push @set, 'remote' if $h->{set_remote} && $reporter->report;
        push @removed, 'remote' if $h->{remove_remote} && $reporter->revoke;
    }
    my $head = '';
    $head .= 'DidSet: ' . join(',', @set) . "\r\n" if @set;
    $head .= 'DidRemove: ' . join(',', @removed) . "\r\n" if @removed;
    $self->write_all("SPAMD/1.1 $CODE{EX_OK} EX_OK\r\n$head\r\n\r\n");
    my $did = (@set ? ' Setting ' . join(',', @set) . ' ' : '')
        . (@removed ? ' Removing ' . join(',', @removed) . ' ' : '');
    info('spamd: Tell:' . ($did || ' Did nothing ') . "for $self->{user}:$> in "
        . sprintf('%.1f', time - $self->{start}) . " seconds, $actual bytes");
    $mail->finish;
    return 1;
}

# PING and SKIP; protocol 1.5 and later sends (empty) headers first.
sub skip_or_ping {
    my ($self, $method, $version) = @_;
    if ($version >= 1.5) {
        $self->read_headers or return 0;
    }
    syswrite($self->{sock}, "SPAMD/1.5 $CODE{EX_OK} PONG\r\n") if $method eq 'PING';
    return 1;
}

1;
