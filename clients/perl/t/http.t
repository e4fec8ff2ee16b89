# Unit tests of Forkpool::HTTP: `prove -I clients/perl clients/perl/t`
# (crates/forkpool-cli/tests/psgi.rs runs them with the test suite).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..";

use Test::More;
use Forkpool::HTTP qw(
    find_head_end incomplete_head_problem parse_head body_framing keeps_alive
    expects_continue parse_chunk_size trailer_problem status_text
    response_head access_line
);

# A head from its lines; an HTTP/1.1 request line gets a Host unless the
# lines name one.
sub head {
    my @lines = @_;
    push @lines, 'Host: h' if $lines[0] =~ /1\.[1-9]\z/ && !grep { /\Ahost:/i } @lines;
    return parse_head(join('', map { "$_\r\n" } @lines) . "\r\n");
}

subtest 'find_head_end' => sub {
    is(find_head_end("GET / HTTP/1.1\r\nHost: a\r\n"), -1, 'incomplete');
    my $head = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    is(find_head_end("${head}body"), length $head, 'CRLF CRLF');
    is(find_head_end("GET / HTTP/1.0\n\nx"), length "GET / HTTP/1.0\n\n", 'bare LF');
};

subtest 'parse_head: a good request' => sub {
    my $req = head('GET /a%20b?x=1&y=2 HTTP/1.1', 'Host: example', 'X-Two: 1', 'x-two:  2 ');
    is($req->{method}, 'GET');
    is($req->{path}, '/a%20b');
    is($req->{query}, 'x=1&y=2');
    is($req->{minor}, 1);
    is_deeply($req->{env}, { HTTP_HOST => 'example', HTTP_X_TWO => '1, 2' },
        'repeated headers joined in order, blanks around a value dropped');
    ok(head("\r\nGET / HTTP/1.0"), 'a leading empty line is skipped');
    my $blanks = head('GET / HTTP/1.1', "X-Tab: a\tb \t", 'X-Empty:   ', "X-High: caf\xe9");
    is_deeply($blanks->{env}, { HTTP_X_TAB => "a\tb", HTTP_X_EMPTY => '', HTTP_X_HIGH => "caf\xe9",
        HTTP_HOST => 'h' },
        'blanks inside a value kept, around it dropped; empty and non-ASCII values');
};

subtest 'parse_head: refusals' => sub {
    my @cases = (
        ['GARBAGE', 400],
        ['GET /  HTTP/1.1', 400],
        ['GET / HTTP/2.0', 505],
        ['GET / HTTP/0.9', 505],
        ['GET /%zz HTTP/1.1', 400],
        ['GET / HTTP/1.11', 400],
        ["GET /\x01 HTTP/1.1", 400],
        ["GET / HTTP/1.1\r\nBad Name: x", 400],
        ["GET / HTTP/1.1\r\nName : x", 400],
        ["GET / HTTP/1.1\r\nA: 1\r\n  folded", 400],
        ["GET / HTTP/1.1\r\nA: \x01", 400],
        ["GET / HTTP/1.1\r\nA: a\rb", 400],
        ["GET / HTTP/1.1\r\nA: a\0b", 400],
        ["GET / HTTP/1.1\nA: b", 400],
        ["GET / HTTP/1.1\r\nHost: a\r\nHost: b", 400],
        ["GET / HTTP/1.1\r\nHost: a b", 400],
        ['GET foo HTTP/1.1', 400],
        ['GET * HTTP/1.1', 400],
        ['GET example.com:443 HTTP/1.1', 400],
        ['CONNECT example.com:443 HTTP/1.1', 501],
        ['GET /' . ('a' x 8190) . ' HTTP/1.1', 414],
        ["GET / HTTP/1.1\r\nX: " . ('a' x 8190), 431],
        ["GET / HTTP/1.1\r\n" . join("\r\n", map { "X$_: 1" } 1 .. 101), 431],
    );
    my ($none, $no_host) = parse_head("GET / HTTP/1.1\r\n\r\n");
    is($no_host, 400, 'HTTP/1.1 without Host');
    for my $case (@cases) {
        my ($req, $status, $why) = head($case->[0]);
        ok(!$req, "refused: $case->[0]");
        is($status, $case->[1], "status for $case->[0]");
        ok(length $why, 'says why');
    }
};

subtest 'parse_head: targets' => sub {
    my $req = head('GET /p?q=1#frag HTTP/1.1');
    is_deeply([@$req{qw(path query target)}], ['/p', 'q=1', '/p?q=1'], 'fragment stripped');
    $req = head('GET http://other.example:8080/a?b HTTP/1.1', 'Host: h');
    is_deeply([@$req{qw(path query)}, $req->{env}{HTTP_HOST}], ['/a', 'b', 'other.example:8080'],
        'absolute-form: the URI names the host');
    $req = head('OPTIONS * HTTP/1.1');
    is($req->{path}, '*', 'OPTIONS *');
    ok(head('GET / HTTP/1.0'), 'HTTP/1.0 without Host');
    is(head('GET / HTTP/1.5')->{protocol}, 'HTTP/1.1', 'a later 1.x is 1.1');
    is(incomplete_head_problem('GET /' . ('a' x 9000)), 414, 'a long line is 414 before its end');
    is(incomplete_head_problem("GET / HTTP/1.1\r\nX: " . ('a' x 9000)), 0, 'not a long field');
};

subtest 'body_framing' => sub {
    is_deeply([body_framing(head('GET / HTTP/1.1'), 0)], ['none']);
    is_deeply([body_framing(head('POST / HTTP/1.1', 'Content-Length: 12'), 0)], ['length', 12]);
    is_deeply([body_framing(head('POST / HTTP/1.1', 'Content-Length: 12, 12'), 0)], ['length', 12],
        'the same length twice is one length');
    is_deeply([body_framing(head('POST / HTTP/1.1', 'Transfer-Encoding: chunked'), 0)], ['chunked']);
    is((body_framing(head('POST / HTTP/1.1', 'Content-Length: 12', 'Content-Length: 13'), 0))[1], 400);
    is((body_framing(head('POST / HTTP/1.1', 'Content-Length: -1'), 0))[1], 400);
    is((body_framing(head('POST / HTTP/1.1', 'Content-Length: 12',
        'Transfer-Encoding: chunked'), 0))[1], 400, 'smuggling: both');
    is((body_framing(head('POST / HTTP/1.1', 'Transfer-Encoding: gzip, chunked'), 0))[1], 501);
    is((body_framing(head('POST / HTTP/1.1', 'Transfer-Encoding: chunked, gzip'), 0))[1], 400);
    is((body_framing(head('POST / HTTP/1.1', 'Transfer-Encoding: chunked, chunked'), 0))[1], 400);
    is((body_framing(head('POST / HTTP/1.1', 'Content-Length: 5, 6'), 0))[1], 400);
    my $req = head('POST / HTTP/1.1', 'Content-Length: 5', 'Content-Length: 5');
    is_deeply([body_framing($req, 0)], ['length', 5]);
    is($req->{env}{CONTENT_LENGTH}, 5, 'the app sees one length');
    is((body_framing(head('POST / HTTP/1.0', 'Transfer-Encoding: chunked'), 0))[1], 400);
    is((body_framing(head('POST / HTTP/1.1', 'Content-Length: 101'), 100))[1], 413);
    is_deeply([body_framing(head('POST / HTTP/1.1', 'Content-Length: 100'), 100)], ['length', 100]);
};

subtest 'keeps_alive' => sub {
    ok(keeps_alive(head('GET / HTTP/1.1')), '1.1 by default');
    ok(!keeps_alive(head('GET / HTTP/1.1', 'Connection: close')), '1.1 close');
    ok(!keeps_alive(head('GET / HTTP/1.1', 'Connection: TE, Close')), 'close among others');
    ok(!keeps_alive(head('GET / HTTP/1.0')), '1.0 by default');
    ok(keeps_alive(head('GET / HTTP/1.0', 'Connection: Keep-Alive')), '1.0 keep-alive');
};

subtest 'expects_continue' => sub {
    is(expects_continue(head('POST / HTTP/1.1')), 0);
    is(expects_continue(head('POST / HTTP/1.1', 'Expect: 100-Continue')), 1);
    is(expects_continue(head('POST / HTTP/1.0', 'Expect: 100-continue')), 0, 'not to 1.0');
    is((expects_continue(head('POST / HTTP/1.1', 'Expect: teapot')))[1], 417);
};

subtest 'parse_head: environment keys' => sub {
    my $env = head('POST / HTTP/1.1', 'Content-Type: text/plain',
        'Content-Length: 3', 'X-Forwarded-For: a', 'x-forwarded-for: b', 'X_Sneaky: 1')->{env};
    is_deeply($env, {
        CONTENT_TYPE => 'text/plain', CONTENT_LENGTH => 3,
        HTTP_X_FORWARDED_FOR => 'a, b', HTTP_HOST => 'h',
    });
};

subtest 'parse_chunk_size' => sub {
    is(parse_chunk_size('1a'), 26);
    is(parse_chunk_size('0'), 0);
    is(parse_chunk_size('ff;name=value'), 255, 'extensions ignored');
    is(parse_chunk_size(''), undef);
    is(parse_chunk_size('xyz'), undef);
    is(parse_chunk_size('-1'), undef);
    is(parse_chunk_size('7' . ('f' x 15)), '9223372036854775807', 'the largest size');
    is(parse_chunk_size('8' . ('0' x 15)), undef, 'no sizes of 2^63 or more');
    is(parse_chunk_size('0' x 17), undef, 'no more than 16 digits');
    is(parse_chunk_size('5 '), undef, 'no blank after the size');
    is(parse_chunk_size(' 5'), undef, 'no blank before it');
    is(parse_chunk_size('5 ; a = "b\\"c" ; d'), 5, 'extensions per the grammar');
    is(parse_chunk_size("5;a=\rb"), undef, 'no CR in an extension');
    is(parse_chunk_size('5;'), undef, 'no empty extension');
    is(trailer_problem('X-T: 1', 'Content-Length: 9'), undef, 'trailers checked');
    is((trailer_problem('Bad : 1'))[0], 400);
};

subtest 'responses' => sub {
    is(status_text(404), 'Not Found');
    is(status_text(599), 'Server Error');
    is(response_head(200, ['Content-Type', 'text/plain'], 'Content-Length: 2'),
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n");
    my $problem = sub { (response_head(200, $_[0]))[1] };
    like($problem->(['X-Ok', 'a', 'X-Bad', "a\r\nSet-Cookie: x"]), qr/X-Bad/,
        'a header value cannot split the response');
    like($problem->(["X-Bad\n", 'a']), qr/X-Bad/, 'nor a name');
    like($problem->(['X-Nul', "a\0"]), qr/X-Nul/, 'no NUL');
    like($problem->(['X-Ctl', "a\x01"]), qr/X-Ctl/, 'no other control');
    like($problem->(['X-Wide', "caf\x{e9}\x{263a}"]), qr/X-Wide/, 'nothing beyond Latin-1');
    like($problem->(['X-Ok', "caf\x{e9}", 'X-Wide', "\x{263a}"]), qr/'X-Wide'/,
        'the header beyond Latin-1 is named, not the first character string');
    my $upgraded = "caf\xe9";
    utf8::upgrade($upgraded);
    is($problem->(['X-Latin', $upgraded]), undef, 'a character string within Latin-1 is fine');
    is($problem->(['X-Ok', "a\tb \xe9"]), undef, 'tabs and high bytes are fine');
};

subtest 'access_line' => sub {
    my $line = access_line(host => '127.0.0.1', start => 0, request => 'GET /"x" HTTP/1.1',
        status => 200, bytes => 5, agent => "curl\n", duration => 0.0015, slot => 3);
    like($line, qr{\A127\.0\.0\.1 - - \[\d\d/\w\w\w/\d{4}:\d\d:\d\d:\d\d [-+]\d{4}\] }, 'CLF start');
    like($line, qr{"GET /\\"x\\" HTTP/1\.1" 200 5 "-" "curl\\x0a" 0\.001500 slot=3\n\z},
        'request, status, bytes, referer, agent, duration, slot');
    like(access_line(host => '::1', start => 0, status => 408, bytes => 0,
        duration => 1, slot => 0), qr{"-" 408 - }, 'no request line, no bytes');
};

done_testing;
