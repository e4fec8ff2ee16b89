# forkpool-spamd's command line: spamd's options and defaults, the
# refused ones named, and the `forkpool run` command they become. Needs
# no SpamAssassin.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..";
use Test::More;

use Forkpool::Spamd::Options;
use Forkpool::Spamd::Command;

my $parse = \&Forkpool::Spamd::Options::parse;

my $defaults = $parse->();
is($defaults->{'max-children'}, 5, 'spamd: 5 children at most by default');
is($defaults->{'max-conn-per-child'}, 200, 'and 200 connections per child');
is($defaults->{'timeout-child'}, 300, 'and a 300 s child timeout');
is($defaults->{'user-config'}, 1, 'user configuration on by default');
is($parse->('-x')->{'user-config'}, 0, '-x turns it off');

my $opt = $parse->('-Lxl', '-m', 3, '--cf=use_bayes 0', '--cf', 'skip_rbl_checks 1');
ok($opt->{local} && $opt->{'allow-tell'}, 'bundled switches, as spamd reads them');
is_deeply($opt->{cf}, ['use_bayes 0', 'skip_rbl_checks 1'], '--cf is repeatable');

for my $refused (['--ssl'], ['--ssl-port', 1], ['--server-key', 'k'], ['-q'], ['-Q'],
    ['--sql-config'], ['--ldap-config'], ['--setuid-with-ldap'], ['-v'], ['--vpopmail'],
    ['--virtual-config-dir', '/x'], ['-P'], ['--timing'])
{
    my ($name) = @$refused;
    my $ok = eval { $parse->(@$refused); 1 };
    ok(!$ok, "$name is refused");
    like($@, qr/\Q$name\E.* is not supported \(/, "$name: the message names it and says why");
}
ok(!eval { $parse->('--no-such-option'); 1 }, 'an unknown option is refused');

my @args = Forkpool::Spamd::Command::pool_options(
    $parse->('-m', 4, '--min-children', 2, '--max-conn-per-child', 50,
        '-i', '127.0.0.1:7830', '-i', '[::1]:7831', '--socketpath', '/run/spamd.sock',
        '--socketmode', '0660', '--dispatch', 'order', '--refork-after', '100',
        '--merge-pages'));
my $line = join ' ', @args;
like($line, qr/^--preload /, 'the template preloads SpamAssassin');
like($line, qr/--listen 127\.0\.0\.1:7830 --listen \[::1\]:7831 --listen unix:\/run\/spamd\.sock/,
    'every -i, and --socketpath, becomes a listener');
like($line, qr/--min-children 2 --max-children 4 --min-spare 1 --max-spare 2/, 'the pool sizes');
like($line, qr/--max-requests-per-child 50/, '--max-conn-per-child');
like($line, qr/--unix-mode 0660/, '--socketmode');
like($line, qr/--dispatch order/, "forkpool's own options pass through");
like($line, qr/--refork-after 100/, '--refork-after too');
like($line, qr/--merge-pages/, 'and its switches');
like(join(' ', Forkpool::Spamd::Command::pool_options($parse->('-m', 2))),
    qr/--refork-after $Forkpool::Spamd::Options::DEFAULT_REFORK_AFTER\b/,
    'a refork by default');
unlike(join(' ', Forkpool::Spamd::Command::pool_options($parse->('--refork-after', 0))),
    qr/--refork-after/, '--refork-after 0: none');
unlike(join(' ', Forkpool::Spamd::Command::pool_options($parse->('-m', 2))), qr/--merge-pages/,
    'a switch not given is not passed');

my $fixed = join ' ', Forkpool::Spamd::Command::pool_options($parse->('--round-robin', '-m', 3, '-p', 7832));
like($fixed, qr/--min-children 3 --max-children 3 --min-spare 0 --max-spare 3/,
    '--round-robin: a fixed pool, no scaling');
like($fixed, qr/--listen 127\.0\.0\.1:7832/, '-p with the default address (localhost)');

ok(!eval { Forkpool::Spamd::Command::pool_options($parse->('-i', 'ssl:127.0.0.1:1')); 1 },
    'an ssl: listener is refused');
like($@, qr/ssl:127\.0\.0\.1:1 is not supported/, 'naming it');

{
    local $ENV{FORKPOOL_BIN} = '/opt/forkpool/bin/forkpool';
    is(Forkpool::Spamd::Command::forkpool_bin(__FILE__), '/opt/forkpool/bin/forkpool',
        'FORKPOOL_BIN names the binary');
}

done_testing;
