package Forkpool::Spamd::Log;

# Where a worker's log lines go, from spamd's -s and -D, set up as spamd
# sets it up: SpamAssassin's own logger (Mail::SpamAssassin::Logger) to
# stderr (which forkpool logs with the worker's slot) and, unless -s says
# `stderr`, also to syslog (a facility name, `mail` by default) or to a file
# (a value with a character a facility has not, like a path).

use strict;
use warnings;

use Mail::SpamAssassin::Logger ();

our $VERSION = '1';

# The logger method added besides stderr (`file` or `syslog`), if any.
my $SINK;

# Sets up logging from the parsed options.
sub setup {
    my ($opt) = @_;
    Mail::SpamAssassin::Logger::add_facilities($opt->{debug} || 'info');
    _add_sink($opt);
    return;
}

# In a worker just forked from the template: the template's log file or
# syslog socket was closed with every descriptor the template had opened
# (docs/protocol.md), so the worker opens its own.
sub reopen {
    my ($opt) = @_;
    return unless $SINK;
    {
        # The template's sink is gone with its descriptor: no need to say so.
        local $SIG{__WARN__} = sub { };
        Mail::SpamAssassin::Logger::remove($SINK);
    }
    _add_sink($opt);
    return;
}

sub _add_sink {
    my ($opt) = @_;
    my $facility = $opt->{syslog} || 'mail';
    return if lc $facility eq 'stderr' || lc $facility eq 'null';
    my $ok;
    if ($facility =~ /[^a-z0-9]/i || lc $facility eq 'file') {
        my $file = lc $facility eq 'file' ? 'spamd.log' : $facility;
        $SINK = 'file';
        $ok = Mail::SpamAssassin::Logger::add(method => 'file', filename => $file, escape => 1);
    }
    else {
        $SINK = 'syslog';
        $ok = Mail::SpamAssassin::Logger::add(method => 'syslog', socket => 'unix',
            facility => lc $facility, ident => 'spamd', escape => 1);
    }
    warn "forkpool-spamd: cannot log to '$facility'; logging to stderr only\n" unless $ok;
    return;
}

1;
