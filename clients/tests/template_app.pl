# A worker program for the template tests (the Perl twin of
# template_app.py): it preloads, hooks and reports, with or without a
# template. Each connection gets one JSON line: pid, slot, preloaded (the
# pid that loaded this program), warm (the pid that served its first
# connection), after_fork (whether the hook ran in this process).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/../perl";
use Forkpool::Worker;

my $preloaded = $$;
# A descriptor opened while loading: a forked worker must not have it.
open(my $loaded_from, '<', __FILE__) or die "cannot open myself: $!\n";
my ($warm, $hooked);

Forkpool::Worker->after_fork(sub {
    $hooked = $$;
    print STDERR "after_fork ran in $$\n";
});

Forkpool::Worker->from_env->serve(sub {
    my ($conn) = @_;
    $warm //= $$;
    my $after = defined $hooked && $hooked == $$ ? 'true' : 'false';
    print $conn qq({"pid": $$, "slot": $ENV{FORKPOOL_SLOT}, "preloaded": $preloaded, )
        . qq("warm": $warm, "after_fork": $after}\n);
});
