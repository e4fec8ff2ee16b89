# The app of Plack::Test::Suite (see plack_suite.pl): each request runs
# the test its X-Plack-Test header names, behind Plack::Middleware::Lint.
use strict;
use warnings;

use Plack::Middleware::Lint;
use Plack::Test::Suite;

my $app = Plack::Middleware::Lint->wrap(Plack::Test::Suite->test_app_handler);

$app;
