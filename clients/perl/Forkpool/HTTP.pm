package Forkpool::HTTP;

# HTTP/1.x message parsing and framing for forkpool's Perl servers, with
# no I/O: every function takes bytes or parsed data and returns data, so
# each is tested on its own (clients/perl/t/http.t). Core modules only.
#
# The rules follow RFC 9112 where a lenient parser would open a hole:
# a request with both Transfer-Encoding and Content-Length, or with two
# different lengths, is refused (request smuggling); header names are
# tokens with no space before the colon; obsolete line folding is refused.
# Where being strict buys nothing, parsing is lenient: a bare LF ends a
# line as well as CRLF.

use strict;
use warnings;

use Exporter 'import';
use POSIX ();

our $VERSION = '1';

our @EXPORT_OK = qw(
    find_head_end parse_head body_framing keeps_alive expects_continue
    parse_chunk_size status_text response_head clf_time access_line
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

# The offset just past the blank line that ends a request head in $buf,
# or -1 if the head is not complete yet. Empty lines before the request
# line (RFC 9112 section 2.2) are part of the head and skipped by
# parse_head.
sub find_head_end {
    my ($buf) = @_;
    return $+[0] if $buf =~ /\n\r?\n/;
    return -1;
}

# Parses a complete request head. Returns a hash reference
#   { method, target, path, query, protocol, minor, env }
# where `env` holds the headers as PSGI/CGI environment keys (HTTP_X_FOO
# for X-Foo; CONTENT_TYPE and CONTENT_LENGTH without the prefix; repeated
# headers joined with ", ", as RFC 9110 section 5.3 allows), or (undef,
# STATUS, WHY) for a request to refuse with that status. A header name
# with an underscore would collide with the dash form once translated,
# and is dropped, as nginx does. The framing rules below read the same
# keys, so a header is looked at once, where it is parsed.
#
# Core Perl only. HTTP::Parser::XS was tried for plain heads: with the
# checks that keep its result to these rules (no merged repeats, no "_"
# for "-", no trailing blanks) it took 6.7 us for wrk's head and 13.8 us
# for curl's, against 3.9 and 8.3 us for this parser (Benchmark, one core).
sub parse_head {
    my ($head) = @_;
    # One pass with \G: the head is parsed where it lies, line by line,
    # without splitting it into copies first. Empty lines before the
    # request line are skipped. /o: $TOKEN never changes, so the patterns
    # are compiled once, not checked for a change on every request.
    $head =~ m{\G(?:\r?\n)*($TOKEN) ([\x21-\x7e]+) HTTP/(\d)\.(\d)\r?\n}gco
        or return (undef, 400, _request_line_problem($head));
    my ($method, $target, $major, $minor) = ($1, $2, $3, $4);
    return (undef, 505, "HTTP/$major.$minor is not supported") unless $major == 1;
    my %env;
    # A value is empty or ends in a visible byte, so the blanks after it
    # fall to `[ \t]*`. (A lazy `*?` before the blanks says the same and
    # took 3 us a header: it tries the rest of the line after every byte.)
    while ($head =~ /\G($TOKEN):[ \t]*((?:[^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f])?)[ \t]*\r?\n/gco) {
        next if index($1, '_') >= 0;
        my $value = $2;
        (my $key = uc $1) =~ tr/-/_/;
        $key = "HTTP_$key" unless $key eq 'CONTENT_TYPE' || $key eq 'CONTENT_LENGTH';
        $env{$key} = exists $env{$key} ? "$env{$key}, $value" : $value;
    }
    $head =~ /\G\r?\n\z/gc
        or return (undef, 400, _header_problem(substr($head, pos($head) // 0)));
    my ($path, $query) = split /\?/, $target, 2;
    return {
        method   => $method,
        target   => $target,
        path     => $path,
        query    => $query // '',
        protocol => "HTTP/$major.$minor",
        minor    => $minor + 0,
        env      => \%env,
    };
}

# Why a request line was refused.
sub _request_line_problem {
    my ($head) = @_;
    my ($line) = $head =~ /\A(?:\r?\n)*([^\n]*)/;
    return 'request target with control or non-ASCII bytes'
        if $line =~ m{\A$TOKEN (.+) HTTP/\d\.\d\r?\z} && $1 !~ / /;
    return 'malformed request line';
}

# Why the header line at the start of $rest was refused.
sub _header_problem {
    my ($rest) = @_;
    return 'obsolete header line folding' if $rest =~ /\A[ \t]/;
    return "control character in header $1" if $rest =~ /\A($TOKEN):/;
    return 'malformed header line';
}

# The comma-separated items of a header's (joined) value.
sub _items {
    my ($value) = @_;
    return defined $value ? split(/\s*,\s*/, $value) : ();
}

# How the request's body is delimited: ('none'), ('length', N) or
# ('chunked'), or (undef, STATUS, WHY). $max_body (0: no limit) turns a
# declared length beyond it into 413.
sub body_framing {
    my ($req, $max_body) = @_;
    my ($te, $cl) = @{ $req->{env} }{qw(HTTP_TRANSFER_ENCODING CONTENT_LENGTH)};
    return ('none') unless defined $te || defined $cl;
    my @te = _items($te);
    if (@te) {
        return (undef, 400, 'both Transfer-Encoding and Content-Length') if defined $cl;
        return (undef, 400, 'Transfer-Encoding in an HTTP/1.0 request')
            if $req->{minor} == 0;
        return (undef, 501, "Transfer-Encoding '@te' is not supported")
            unless @te == 1 && lc $te[0] eq 'chunked';
        return ('chunked');
    }
    return ('none') unless defined $cl;
    my %lengths = map { $_ => 1 } _items($cl);
    my @lengths = keys %lengths;
    return (undef, 400, 'conflicting Content-Length values') if @lengths != 1;
    my ($length) = @lengths;
    return (undef, 400, 'malformed Content-Length') unless $length =~ /\A\d{1,18}\z/;
    return (undef, 413, "body of $length bytes is over the limit of $max_body")
        if $max_body && $length > $max_body;
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

# The size in a chunk-size line (without its line end), ignoring chunk
# extensions; undef if the line is malformed.
sub parse_chunk_size {
    my ($line) = @_;
    my ($hex) = $line =~ /\A([0-9A-Fa-f]{1,15})[ \t]*(?:;.*)?\z/s or return undef;
    return hex $hex;
}

# The reason phrase for a status code.
sub status_text {
    my ($status) = @_;
    return $STATUS_TEXT{$status} // ($status < 200 ? 'Informational'
        : $status < 300 ? 'Success' : $status < 400 ? 'Redirection'
        : $status < 500 ? 'Client Error' : 'Server Error');
}

# A response head: "HTTP/1.1 STATUS TEXT", the header pairs of the flat
# list $headers (as PSGI gives them), then each line of @extra.
# Header values with a line break are refused with a die, since they
# would let an app's input split the response.
sub response_head {
    my ($status, $headers, @extra) = @_;
    my $head = "HTTP/1.1 $status " . status_text($status) . "\r\n";
    for (my $i = 0; $i < @$headers; $i += 2) {
        $head .= "$headers->[$i]: $headers->[$i + 1]\r\n";
    }
    # One count of line-break bytes over the whole head, instead of a
    # look at each header: one CR and one LF per line, no more.
    my $lines = 1 + @$headers / 2;
    ($head =~ tr/\n//) == $lines && ($head =~ tr/\r//) == $lines
        or die "a response header has a line break in its name or value\n";
    $head .= "$_\r\n" for @extra;
    return "$head\r\n";
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
