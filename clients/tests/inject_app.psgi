# A PSGI app that tries to split its response: a CRLF in a header value
# (/header) or a status that is not a number (/status). The server must
# send none of it and answer 500 (docs/http.md, "Responses from the app").
# Core modules only.
use strict;
use warnings;

my $app = sub {
    my ($env) = @_;
    my $path = $env->{PATH_INFO};
    return [200, ['X-Bad', "a\r\nX-Injected: 1"], ['split']] if $path eq '/header';
    return ["200 OK\r\nX-Injected: 1", [], ['split']] if $path eq '/status';
    return [200, ['Content-Length', 2], ['ok']];
};

$app;
