package SupervisorEnd;

# What the unit tests read on the supervisor's end of a worker's channel
# (a socketpair standing in for the supervisor).

use strict;
use warnings;

use Exporter 'import';
our @EXPORT_OK = qw(messages);

# The kinds of the messages the worker sent so far, in order.
sub messages {
    my ($supervisor) = @_;
    my $kinds = '';
    my $bits = '';
    vec($bits, fileno($supervisor), 1) = 1;
    while (select(my $ready = $bits, undef, undef, 0) > 0) {
        defined recv($supervisor, my $message, 16, 0) or die "recv: $!";
        last if $message eq '';
        $kinds .= substr($message, 1, 1);
    }
    return $kinds;
}

1;
