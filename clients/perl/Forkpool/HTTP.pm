package Forkpool::HTTP;

# HTTP/1.x message parsing and framing for forkpool's Perl servers, with
# no I/O: every function takes bytes or parsed data and returns data, so
# each is tested on its own (clients/perl/t/http.t). Core modules only.
#
# The rules are docs/http.md's, strict RFC 9110/9112 throughout: a line
# ends in CRLF (a bare CR or LF is refused), header names are tokens with
# no space before the colon, obsolete line folding and NUL are refused, an
# HTTP/1.1 request has exactly one Host, the body's framing has one
# meaning (no Content-Length with Transfer-Encoding, no differing lengths,
# chunked last), and the limits answer 414 for a long request line, 431
# for a long field line, too many fields or a large head. The shared
# corpus, tests/http-corpus/, holds one request per rule.

use strict;
use warnings;

use Exporter 'import';
use POSIX ();

our $VERSION = '1';

our @EXPORT_OK = qw(
    find_head_end incomplete_head_problem parse_head body_framing keeps_alive
    expects_continue parse_chunk_size trailer_problem status_text
    response_head clf_time access_line
);

my %STATUS_TEXT = (
    100 => 'Continue',                 101 => 'Switching Protocols',
    200 => 'OK',                       201 => 'Created',
    202 => 'Accepted',                 203 => 'Non-Authoritative Information',
    204 => 'No Content',               205 => 'Reset Content',
    206 => 'Partial Content',          300 => 'Multiple Choices',
    301 => 'Moved Permanently',        302 => 'Found',
    303 => 'See Other',                304 => 'Not Modified',
    307 => 'Temporary Redirect',       308 => 'Permanent Redirect',
    400 => 'Bad Request',              401 => 'Unauthorized',
    403 => 'Forbidden',                404 => 'Not Found',
    405 => 'Method Not Allowed',       406 => 'Not Acceptable',
    408 => 'Request Timeout',          409 => 'Conflict',
    410 => 'Gone',                     411 => 'Length Required',
    412 => 'Precondition Failed',      413 => 'Content Too Large',
    414 => 'URI Too Long',             415 => 'Unsupported Media Type',
    416 => 'Range Not Satisfiable',    417 => 'Expectation Failed',
    422 => 'Unprocessable Content',    429 => 'Too Many Requests',
    431 => 'Request Header Fields Too Large',
    500 => 'Internal Server Error',    501 => 'Not Implemented',
    502 => 'Bad Gateway',              503 => 'Service Unavailable',
    504 => 'Gateway Timeout',          505 => 'HTTP Version Not Supported',
);

my $TOKEN = qr/[!#\$%&'*+\-.^_`|~0-9A-Za-z]+/;

# The limits docs/http.md sets (the head as a whole is bounded by the
# server's --max-header-size).
use constant MAX_LINE   => 8190;    # request line, and each field line
use constant MAX_FIELDS => 100;

# The offset just past the blank line that ends a request head in $buf,
# or -1 if the head is not complete yet. A bare LF ends the head too, so
# that parse_head can refuse it instead of waiting for a CRLF that never
# comes.
sub find_head_end {
    my ($buf) = @_;
    return $+[0] if $buf =~ /\n\r?\n/;
    return -1;
}

# The status for a head that is still incomplete in $buf but already
# breaks a limit: 414 when the request line is over MAX_LINE, else 0.
# (A head over the byte limit is the caller's 431.)
sub incomplete_head_problem {
    my ($buf) = @_;
    $buf =~ /\A(?:\r\n)*/g;
    my $from = pos($buf) // 0;
    my $eol = index($buf, "\n", $from);
    my $line = ($eol < 0 ? length $buf : $eol) - $from;
    return $line > MAX_LINE + 1 ? 414 : 0;
}

# Parses a complete request head. Returns a hash reference
#   { method, target, path, query, protocol, minor, host, env }
# where `path` is the target's path (still percent-encoded), `query` its
# query without `?`, any `#fragment` stripped from both, and `env` holds
# the headers as PSGI/CGI environment keys (HTTP_X_FOO for X-Foo;
# CONTENT_TYPE and CONTENT_LENGTH without the prefix; repeated headers
# joined with ", ", as RFC 9110 section 5.3 allows), or (undef, STATUS,
# WHY) for a request to refuse with that status. A header name with an
# underscore would collide with the dash form once translated, and is
# dropped, as nginx does. The framing rules below read the same keys, so
# a header is looked at once, where it is parsed.
#
# Core Perl only. HTTP::Parser::XS was tried for plain heads: with the
# checks that keep its result to these rules (no merged repeats, no "_"
# for "-", no trailing blanks) it took 6.7 us for wrk's head and 13.8 us
# for curl's, against 3.9 and 8.3 us for this parser (Benchmark, one core).
sub parse_head {
    my ($head) = @_;
    # One pass with \G: the head is parsed where it lies, line by line,
    # without splitting it into copies first. /o: $TOKEN never changes, so
    # the patterns are compiled once, not checked for a change on every
    # request. The patterns let no CR, LF or NUL into a line and end each
    # line in CRLF, so a bare CR or LF or a NUL fails one of them, and
    # only then does a slow path look for the reason.
    $head =~ m{\G(?:\r\n)*($TOKEN) ([\x21-\x7e]+) HTTP/(\d)\.(\d)\r\n}gco
        or return (undef, _request_line_problem($head));
    my ($method, $target, $major, $minor) = ($1, $2, $3, $4);
    # $-[1]: where the method starts, after the empty lines.
    return (undef, 400, 'more than 8 empty lines before the request line')
        if $-[1] > 16;
    return (undef, 414, 'request line over ' . MAX_LINE . ' bytes')
        if pos($head) - $-[1] > MAX_LINE + 2;
    return (undef, 505, "HTTP/$major.$minor is not supported") unless $major == 1;
    $minor = 1 if $minor > 1;    # a later 1.x is served as 1.1 (RFC 9110 section 2.5)
    # Only a head longer than a line can hold a field line too long.
    my $long = length $head > MAX_LINE;
    my (%env, $fields);
    # A value is empty or ends in a visible byte, so the blanks after it
    # fall to `[ \t]*`. (A lazy `*?` before the blanks says the same and
    # took 3 us a header: it tries the rest of the line after every byte.)
    while ($head =~ /\G($TOKEN):[ \t]*((?:[^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f])?)[ \t]*\r\n/gco) {
        return (undef, 431, 'more than ' . MAX_FIELDS . ' header fields') if ++$fields > MAX_FIELDS;
        return (undef, 431, "header field $1 over " . MAX_LINE . ' bytes')
            if $long && $+[0] - $-[0] > MAX_LINE + 2;
        next if index($1, '_') >= 0;
        my $value = $2;
        (my $key = uc $1) =~ tr/-/_/;
        $key = "HTTP_$key" unless $key eq 'CONTENT_TYPE' || $key eq 'CONTENT_LENGTH';
        if (exists $env{$key}) {
            return (undef, 400, 'more than one Host header') if $key eq 'HTTP_HOST';
            $env{$key} .= ", $value";
        }
        else {
            $env{$key} = $value;
        }
    }
    $head =~ /\G\r\n\z/gc
        or return (undef, _field_problem(substr($head, pos($head) // 0)));
    my $req = {
        method   => $method,
        target   => $target,
        protocol => "HTTP/$major.$minor",
        minor    => $minor + 0,
        env      => \%env,
    };
    if (substr($target, 0, 1) eq '/' && index($target, '#') < 0 && index($target, '%') < 0) {
        @$req{qw(path query)} = split /\?/, $target, 2;    # the common case, inline
        $req->{query} //= '';
    }
    else {
        my ($status, $why) = _read_target($req);
        return (undef, $status, $why) if $status;
    }
    my $host = $env{HTTP_HOST};
    if (defined $host) {
        # uri-host [":" port], in one match in the common case (a sub
        # call costs as much as the match).
        return (undef, 400, "malformed Host header '$host'")
            unless $host =~ /\A[-A-Za-z0-9._~%!\$&'()*+;=]*(?::[0-9]*)?\z/o || _valid_host($host);
        $env{HTTP_HOST} = $req->{authority} if defined $req->{authority};
    }
    elsif ($minor == 1) {
        return (undef, 400, 'an HTTP/1.1 request without a Host header');
    }
    return $req;
}

# True if $host is `uri-host [":" port]`: a reg-name without commas, or
# an IP literal in brackets (docs/http.md, "Host"). Counted with tr, not
# matched, in the common case: it runs on every request.
sub _valid_host {
    my ($host) = @_;
    if (substr($host, 0, 1) eq '[') {
        return $host =~ /\A\[[0-9A-Fa-f:.]+\](?::\d*)?\z/;
    }
    return 0 if ($host =~ tr/-A-Za-z0-9._~%!$&'()*+;=://c);
    my $colon = index($host, ':');
    return 1 if $colon < 0;
    my $port = substr($host, $colon + 1);
    return !($port =~ tr/0-9//c);
}

# Sets the path and query of $req from its target, in the forms RFC 9112
# section 3.2 allows for its method; the status and reason if none fits.
sub _read_target {
    my ($req) = @_;
    my $target = $req->{target};
    if (index($target, '#') >= 0) {
        $target =~ s/#.*//s;    # a fragment is not for the server
        $req->{target} = $target;
    }
    if (substr($target, 0, 1) eq '/') {
        @$req{qw(path query)} = split /\?/, $target, 2;
    }
    elsif ($target =~ m{\A(?i:https?)://([^/?]*)(.*)\z}s) {
        # absolute-form: its authority is the Host (RFC 9112 section 3.2.2)
        my ($authority, $rest) = ($1, $2);
        return (400, 'absolute-form target without a host')
            if $authority eq '' || $authority =~ /@/;
        $req->{authority} = $authority;
        $rest = "/$rest" unless $rest =~ m{\A/};
        @$req{qw(path query)} = split /\?/, $rest, 2;
    }
    elsif ($target eq '*') {
        return (400, "the target '*' is only for OPTIONS") unless $req->{method} eq 'OPTIONS';
        @$req{qw(path query)} = ('*', '');
    }
    elsif ($req->{method} eq 'CONNECT') {
        return (501, 'CONNECT is not served: this is an origin server, not a tunnel');
    }
    else {
        return (400, "request target '$target' is not a path starting with '/' "
            . 'nor an absolute URI');
    }
    $req->{query} //= '';
    return (400, 'a % in the path not followed by two hex digits')
        if index($req->{path}, '%') >= 0 && $req->{path} =~ /%(?![0-9A-Fa-f]{2})/;
    return;
}

# The status and reason for a head whose request line was refused.
sub _request_line_problem {
    my ($head) = @_;
    my ($empty, $line, $end) = $head =~ /\A((?:\r\n)*)([^\r\n]*)(\r\n|\r|\n|)/;
    return (400, 'more than 8 empty lines before the request line') if length $empty > 16;
    return (414, 'request line over ' . MAX_LINE . ' bytes') if length $line > MAX_LINE;
    return (400, 'NUL byte in the request line') if index($line, "\0") >= 0;
    return (400, 'the request line does not end in CRLF') if $end ne "\r\n";
    return (400, 'request target with control or non-ASCII bytes')
        if $line =~ m{\A$TOKEN (.+) HTTP/\d\.\d\z}o && $1 !~ / /;
    return (400, 'malformed request line');
}

# The status and reason for the header line at the start of $rest.
sub _field_problem {
    my ($rest) = @_;
    my ($line, $end) = $rest =~ /\A([^\r\n]*)(\r\n|\r|\n|)/;
    return (431, 'a header field over ' . MAX_LINE . ' bytes') if length $line > MAX_LINE;
    return (400, 'NUL byte in the request head') if index($line, "\0") >= 0;
    return (400, 'a line of the request head does not end in CRLF') if $end ne "\r\n";
    return (400, 'obsolete header line folding') if $line =~ /\A[ \t]/;
    return (400, "whitespace before the colon of header $1") if $line =~ /\A($TOKEN)[ \t]+:/o;
    return (400, "control character in header $1") if $line =~ /\A($TOKEN):/o;
    return (400, 'malformed header line');
}

# The comma-separated items of a header's (joined) value; an empty item
# stays, as '' (so that `chunked,` is not `chunked`).
sub _items {
    my ($value) = @_;
    return () unless defined $value;
    return map { s/\A[ \t]+|[ \t]+\z//gr } split /,/, $value, -1;
}

# How the request's body is delimited: ('none'), ('length', N) or
# ('chunked'), or (undef, STATUS, WHY). $max_body (0: no limit) turns a
# declared length beyond it into 413. A list of equal Content-Length
# values becomes that one value in the environment.
sub body_framing {
    my ($req, $max_body) = @_;
    my ($te, $cl) = @{ $req->{env} }{qw(HTTP_TRANSFER_ENCODING CONTENT_LENGTH)};
    return ('none') unless defined $te || defined $cl;
    if (defined $te) {
        return (undef, 400, 'both Transfer-Encoding and Content-Length') if defined $cl;
        return (undef, 400, 'Transfer-Encoding in an HTTP/1.0 request')
            if $req->{minor} == 0;
        my @te = map { lc } _items($te);
        return (undef, 400, "Transfer-Encoding '$te' does not end in chunked")
            unless @te && $te[-1] eq 'chunked';
        return (undef, 400, "malformed Transfer-Encoding '$te'")
            if grep { !/\A$TOKEN\z/o } @te;
        return (undef, 400, "Transfer-Encoding '$te' has chunked twice")
            if grep({ $_ eq 'chunked' } @te) > 1;
        return (undef, 501, "Transfer-Encoding '$te' is not supported") if @te > 1;
        return ('chunked');
    }
    my %lengths = map { $_ => 1 } _items($cl);
    return (undef, 400, "malformed Content-Length '$cl'")
        if grep { !/\A\d{1,18}\z/ } keys %lengths;
    my %values = map { $_ + 0 => 1 } keys %lengths;
    return (undef, 400, "conflicting Content-Length values '$cl'") if keys %values != 1;
    my ($length) = keys %values;
    return (undef, 413, "body of $length bytes is over the limit of $max_body")
        if $max_body && $length > $max_body;
    $req->{env}{CONTENT_LENGTH} = $length;
    return ('length', $length + 0);
}

# True if the client lets the connection stay open after the response:
# HTTP/1.1 unless it says `Connection: close`, HTTP/1.0 only if it says
# `Connection: keep-alive`.
sub keeps_alive {
    my ($req) = @_;
    my $connection = $req->{env}{HTTP_CONNECTION};
    return $req->{minor} >= 1 unless defined $connection;
    my %options = map { lc($_) => 1 } _items($connection);
    return !$options{close} if $req->{minor} >= 1;
    return !!$options{'keep-alive'};
}

# 1 if the request says `Expect: 100-continue`, 0 if it expects nothing,
# (undef, 417, WHY) for any other expectation.
sub expects_continue {
    my ($req) = @_;
    my @expect = _items($req->{env}{HTTP_EXPECT});
    return 0 unless @expect;
    return 1 if @expect == 1 && lc $expect[0] eq '100-continue' && $req->{minor} >= 1;
    return 0 if @expect == 1 && lc $expect[0] eq '100-continue';    # HTTP/1.0: ignore
    return (undef, 417, "unsupported expectation '@expect'");
}

# The size in a chunk-size line (without its CRLF), its extensions
# checked against RFC 9112 section 7.1.1's grammar and ignored; undef if
# the line is malformed or the size is over 2^63 - 1.
my $QUOTED = qr/"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"/;
sub parse_chunk_size {
    my ($line) = @_;
    my ($hex) = $line =~ /\A([0-9A-Fa-f]{1,16})(?:[ \t]*;[ \t]*$TOKEN(?:[ \t]*=[ \t]*(?:$TOKEN|$QUOTED))?)*\z/o
        or return undef;
    return undef if length $hex == 16 && $hex =~ /\A[89A-Fa-f]/;
    no warnings 'portable';
    return hex $hex;
}

# Checks the trailer field lines of a chunked body (each without its
# CRLF) by the rules of header field lines: undef if they are well
# formed, else (STATUS, WHY). They are then discarded: the app has been
# called with the header section, and no trailer may change it
# (docs/http.md, "Trailers").
sub trailer_problem {
    my (@lines) = @_;
    for my $line (@lines) {
        $line =~ /\A$TOKEN:[ \t]*(?:[^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f])?[ \t]*\z/o
            or return (400, 'malformed trailer field line');
    }
    return;
}

# The reason phrase for a status code.
sub status_text {
    my ($status) = @_;
    return $STATUS_TEXT{$status} // ($status < 200 ? 'Informational'
        : $status < 300 ? 'Success' : $status < 400 ? 'Redirection'
        : $status < 500 ? 'Client Error' : 'Server Error');
}

# A response head: "HTTP/1.1 STATUS TEXT", the header pairs of the flat
# list $headers (as PSGI gives them), then each line of @extra; or
# (undef, WHY) naming the first header that cannot be sent: a name that
# is not a token, or a value with CR, LF, NUL or another control byte but
# tab, or with a character beyond Latin-1 (docs/http.md, "Responses from
# the app"). CR and LF would let an app's input split the response or
# smuggle another behind it. Checked while the head is built, on every
# response: a header passes on two tr counts, the head as a whole on one
# look at its UTF-8 flag (a value with a character beyond Latin-1 makes
# the whole head a character string), and only a bad one goes through
# the matches that say why.
sub response_head {
    my ($status, $headers, @extra) = @_;
    my $head = "HTTP/1.1 $status " . ($STATUS_TEXT{$status} // status_text($status)) . "\r\n";
    for (my $i = 0; $i < @$headers; $i += 2) {
        my ($name, $value) = @$headers[$i, $i + 1];
        return (undef, _header_problem($name, $value))
            unless defined $name && length $name && defined $value
            && !($name =~ tr/!#$%&'*+\-.^_`|~0-9A-Za-z//c)
            && !($value =~ tr/\x00-\x08\x0a-\x1f\x7f//);
        $head .= "$name: $value\r\n";
    }
    if (utf8::is_utf8($head) && $head =~ /[^\x00-\xff]/) {
        for (my $i = 1; $i < @$headers; $i += 2) {
            return (undef, _header_problem(@$headers[$i - 1, $i]))
                if $headers->[$i] =~ /[^\x00-\xff]/;
        }
    }
    $head .= "$_\r\n" for @extra;
    return "$head\r\n";
}

# Why the app's header ($name, $value) cannot be sent.
sub _header_problem {
    my ($name, $value) = @_;
    return 'a response header has no name' unless defined $name && length $name;
    (my $shown = $name) =~ s/([^\x21-\x7e])/sprintf('\\x%02x', ord $1)/ge;
    return "the response header name '$shown' is not a token" if $name !~ /\A$TOKEN\z/o;
    return "the response header $name has no value" unless defined $value;
    return "the app's header '$name' has a CR, LF or NUL" if $value =~ /[\r\n\0]/;
    return "the app's header '$name' has a control character"
        if $value =~ /[\x01-\x08\x0b-\x1f\x7f]/;
    return "the app's header '$name' has a character beyond Latin-1 (encode it to bytes)";
}

my ($clf_second, $clf_text) = (-1, '');

# A time as the common log format writes it: 10/Oct/2000:13:55:36 +0000
# (local time). Formatted once per second.
sub clf_time {
    my ($epoch) = @_;
    my $second = int $epoch;
    if ($second != $clf_second) {
        ($clf_second, $clf_text) = ($second,
            POSIX::strftime('%d/%b/%Y:%H:%M:%S %z', localtime $second));
    }
    return $clf_text;
}

# One access log line: the common log format (host, ident, user, time,
# request line, status, bytes of body sent), then the referer and user
# agent in quotes as the combined format has them, the duration in
# seconds and the worker's slot.
sub access_line {
    my (%f) = @_;
    my $quote = sub {
        my ($s) = @_;
        return '-' unless defined $s && length $s;
        $s =~ s/(["\\])/\\$1/g;
        $s =~ s/([^\x20-\x7e])/sprintf('\\x%02x', ord $1)/ge;
        return $s;
    };
    return sprintf(qq{%s - %s [%s] "%s" %s %s "%s" "%s" %.6f slot=%s\n},
        $f{host} // '-', $f{user} // '-', clf_time($f{start}),
        $quote->($f{request}), $f{status} // '-', $f{bytes} || '-',
        $quote->($f{referer}), $quote->($f{agent}), $f{duration}, $f{slot});
}

1;
