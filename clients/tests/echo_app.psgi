# The echo app of the shared HTTP corpus (tests/http-corpus/, docs/http.md):
# answers 200 with a JSON object of what the app saw of the request, built
# from the PSGI environment as any app would read it: method, PATH_INFO
# (which PSGI gives percent-decoded), QUERY_STRING, the headers (HTTP_*,
# CONTENT_TYPE and CONTENT_LENGTH mapped back to lower-case names) and the
# body read from psgi.input. Core modules only, so it runs without Plack.
use strict;
use warnings;

use JSON::PP ();

# Every byte of a string is a character of the same code point (Latin-1),
# escaped as \u00XX past ASCII, as the corpus writes bodies.
my $json = JSON::PP->new->ascii->canonical;

my $app = sub {
    my ($env) = @_;
    my %headers;
    for my $key (keys %$env) {
        my $name = $key =~ /\AHTTP_(.+)\z/ ? $1
            : $key eq 'CONTENT_TYPE' || $key eq 'CONTENT_LENGTH' ? $key
            : next;
        ($name = lc $name) =~ tr/_/-/;
        $headers{$name} = "$env->{$key}";    # a header is text, even a length
    }
    my $body = '';
    while ($env->{'psgi.input'}->read(my $piece, 65536)) {
        $body .= $piece;
    }
    my $text = $json->encode({
        method  => $env->{REQUEST_METHOD},
        path    => $env->{PATH_INFO},
        query   => $env->{QUERY_STRING},
        headers => \%headers,
        body    => $body,
    });
    return [200, ['Content-Type', 'application/json', 'Content-Length', length $text], [$text]];
};

$app;
