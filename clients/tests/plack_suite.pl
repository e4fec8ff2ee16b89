# Plack's own server test suite (Plack::Test::Suite, which Starman runs)
# against forkpool-psgi under `forkpool run`:
#
#     perl clients/tests/plack_suite.pl path/to/forkpool
#
# The suite starts "the server" on a port in a child process and sends its
# requests to it; here that child execs `forkpool run` on that port with
# two forkpool-psgi workers serving the suite's app (it picks each test's
# app by the request's X-Plack-Test header), wrapped in
# Plack::Middleware::Lint as the suite wraps every server's. TAP on
# stdout; the exit status is the suite's.
use strict;
use warnings;

use File::Basename ();
use File::Spec ();
use Plack::Test::Suite;
use Test::More;

my $forkpool = shift // die "usage: perl plack_suite.pl FORKPOOL_BINARY\n";
-x $forkpool or die "$forkpool is not an executable\n";
my $perl_dir = File::Spec->rel2abs(File::Basename::dirname(__FILE__) . '/../perl');
my $app = File::Spec->rel2abs(File::Basename::dirname(__FILE__) . '/plack_suite_app.psgi');

Plack::Test::Suite->run_server_tests(sub {
    my ($port) = @_;
    exec($forkpool, 'run', '--listen', "127.0.0.1:$port", '--min-children', '2',
        '--max-children', '2', '--', $^X, "$perl_dir/forkpool-psgi", '--no-access-log', $app)
        or die "cannot run $forkpool: $!\n";
});
done_testing();
