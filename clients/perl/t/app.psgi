# A small Plack app the tests serve through forkpool-psgi (and
# `plackup -s Forkpool`): every response names the worker that served it
# in X-Forkpool-Slot and X-Forkpool-Pid.
use strict;
use warnings;

use Plack::Builder;
use Plack::Request;
use Plack::Response;

# Looked up at each request: preloaded, the app is loaded in the template,
# and each worker forked from it has its own slot and pid.
sub whoami { ('X-Forkpool-Slot' => $ENV{FORKPOOL_SLOT} // '-', 'X-Forkpool-Pid' => $$) }

sub text {
    my ($body, $status) = @_;
    my $res = Plack::Response->new($status // 200);
    $res->headers([whoami(), 'Content-Type' => 'text/plain']);
    $res->body($body);
    return $res->finalize;
}

builder {
    # The whole body through Plack::Request: echoes it.
    mount '/echo' => sub {
        my $req = Plack::Request->new(shift);
        return text($req->content);
    };
    # Reads the body in 64 KiB pieces as it arrives and answers its
    # length and a checksum, without ever holding it.
    mount '/count' => sub {
        my $env = shift;
        my ($length, $sum) = (0, 0);
        while ($env->{'psgi.input'}->read(my $piece, 65536)) {
            $length += length $piece;
            $sum = ($sum + unpack('%32C*', $piece)) % 4294967296;
        }
        return text("$length $sum\n");
    };
    mount '/die' => sub { die "the app failed on purpose\n" };
    # A header value with a line break, as an app that copies its input
    # into a header would give: the server must answer 500 instead.
    mount '/inject' => sub {
        return [200, ['Content-Type', 'text/plain', whoami(),
            'X-Injected', "a\r\nSet-Cookie: stolen=1"], ["injected\n"]];
    };
    mount '/stream' => sub {
        my $req = Plack::Request->new(shift);
        my $parts = $req->parameters->{parts} // 3;
        return sub {
            my $writer = shift->([200, ['Content-Type', 'text/plain', whoami()]]);
            $writer->write("part $_\n") for 1 .. $parts;
            $writer->close;
        };
    };
    mount '/harakiri' => sub {
        my $env = shift;
        $env->{'psgix.harakiri.commit'} = $env->{'psgix.harakiri'};
        return text("leaving\n");
    };
    mount '/file' => sub {
        open(my $fh, '<', __FILE__) or die "cannot open myself: $!";
        return [200, ['Content-Type', 'text/plain', 'Content-Length', -s $fh, whoami()], $fh];
    };
    mount '/' => sub {
        my $req = Plack::Request->new(shift);
        my $name = $req->parameters->{name} // 'world';
        return text("hello $name\n");
    };
};
