# Unit tests of Forkpool::HTTP: `prove -I clients/perl clients/perl/t`
# (crates/forkpool-cli/tests/psgi.rs runs them with the test suite).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..";

use Test::More;
use Forkpool::HTTP qw(
    find_head_end parse_head body_framing keeps_alive expects_continue
    parse_chunk_size status_text response_head access_line
);

sub head { parse_head(join('', map { "$_\r\n" } @_) . "\r\n") }

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
    is_deeply($blanks->{env}, { HTTP_X_TAB => "a\tb", HTTP_X_EMPTY => '', HTTP_X_HIGH => "caf\xe9" },
        'blanks inside a value kept, around it dropped; empty and non-ASCII values');
};

subtest 'parse_head: refusals' => sub {
    my @cases = (
        ['GARBAGE', 400],
        ['GET /  HTTP/1.1', 400],
        ['GET / HTTP/2.0', 505],
        ["GET /\x01 HTTP/1.1", 400],
        ["GET / HTTP/1.1\r\nBad Name: x", 400],
        ["GET / HTTP/1.1\r\nName : x", 400],
        ["GET / HTTP/1.1\r\nA: 1\r\n  folded", 400],
        ["GET / HTTP/1.1\r\nA: \x01", 400],
    );
    for my $case (@cases) {
        my ($req, $status, $why) = head($case->[0]);
        ok(!$req, "refused: $case->[0]");
        is($status, $case->[1], "status for $case->[0]");
        ok(length $why, 'says why');
    }
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
    is((body_framing(head('POST / HTTP/1.1', 'Transfer-Encoding: gzip'), 0))[1], 501);
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
        HTTP_X_FORWARDED_FOR => 'a, b',
    });
};

subtest 'parse_chunk_size' => sub {
    is(parse_chunk_size('1a'), 26);
    is(parse_chunk_size('0'), 0);
    is(parse_chunk_size('ff;name=value'), 255, 'extensions ignored');
    is(parse_chunk_size(''), undef);
    is(parse_chunk_size('xyz'), undef);
    is(parse_chunk_size('-1'), undef);
    is(parse_chunk_size('1' x 16), undef, 'no sizes beyond 60 bits');
};

subtest 'responses' => sub {
    is(status_text(404), 'Not Found');
    is(status_text(599), 'Server Error');
    is(response_head(200, ['Content-Type', 'text/plain'], 'Content-Length: 2'),
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n");
    ok(!eval { response_head(200, ['X-Bad', "a\r\nSet-Cookie: x"]); 1 },
        'a header value cannot split the response');
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
