package Plack::Handler::Forkpool;

# plackup's handler for forkpool: under `forkpool run`,
#
#     forkpool run --listen 127.0.0.1:8080 -- \
#         plackup -I clients/perl -s Forkpool app.psgi
#
# makes each worker serve the app with Forkpool::PSGI. The listeners are
# the supervisor's: plackup's --host, --port and --listen are ignored.
# The server's options are plackup options of the same name, such as
# --keepalive-timeout 2 or --max-keepalive-requests 1 (see
# `perl clients/perl/forkpool-psgi --help`); --no-access-log is
# --access-log 0.

use strict;
use warnings;

use Forkpool::PSGI;

our $VERSION = '1';

sub new {
    my ($class, %args) = @_;
    my %options = map { $_ => $args{$_} }
        grep { exists $args{$_} } keys %Forkpool::PSGI::DEFAULTS;
    return bless { server => Forkpool::PSGI->new(%options) }, $class;
}

sub run {
    my ($self, $app) = @_;
    $self->{server}->run($app);
    return;
}

1;
