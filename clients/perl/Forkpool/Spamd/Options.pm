package Forkpool::Spamd::Options;

# spamd's command line, read as spamd reads it (Getopt::Long, bundling),
# with spamd's defaults, plus forkpool's own pool options. Options that
# forkpool-spamd does not implement are refused by name, never ignored.
#
#     my $opt = Forkpool::Spamd::Options::parse(@ARGV);   # dies on a bad one

use strict;
use warnings;

use Getopt::Long qw(GetOptionsFromArray);

our $VERSION = '1';

# spamd's options forkpool-spamd refuses, and why (one phrase each).
my %REFUSED = (
    'ssl'                => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'ssl-port'           => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'ssl-verify'         => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'ssl-ca-file'        => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'ssl-ca-path'        => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'server-cert'        => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'server-key'         => 'TLS is not implemented: terminate TLS in front (stunnel, haproxy)',
    'sql-config'         => 'SQL user preferences are not implemented',
    'setuid-with-sql'    => 'SQL user preferences are not implemented',
    'ldap-config'        => 'LDAP user preferences are not implemented',
    'setuid-with-ldap'   => 'LDAP user preferences are not implemented',
    'vpopmail'           => 'vpopmail users are not implemented',
    'virtual-config-dir' => 'virtual configuration directories are not implemented',
    'paranoid'           => 'paranoid mode is not implemented',
    'timing'             => 'timing reports are not implemented',
    'syslog-socket'      => 'only the default syslog socket is implemented',
    'log-timestamp-fmt'  => 'SpamAssassin\'s default log timestamps only',
);

# Refused options that take a value, and refused switches.
my @REFUSED_VALUE = qw(ssl-port ssl-ca-file ssl-ca-path server-cert server-key
    virtual-config-dir syslog-socket log-timestamp-fmt);
my @REFUSED_FLAG = qw(ssl ssl-verify timing paranoid vpopmail sql-config ldap-config
    setuid-with-sql setuid-with-ldap);

# forkpool's own options, passed to `forkpool run` as they are: with a
# value, and switches.
our @POOL_OPTIONS = qw(dispatch control metrics agent refork-after max-child-memory);
our @POOL_SWITCHES = qw(merge-pages);

# Unless told otherwise, the lowest child becomes the template once it has
# checked this many messages, and the pool rolls onto children forked from
# it: what checking messages builds (SpamAssassin's lazily compiled
# parts, Perl's arenas) is then shared, and each child owns about 6% less
# (docs/spamd.md, *Benchmark*). `--refork-after 0` turns it off.
our $DEFAULT_REFORK_AFTER = 100;

# The options, parsed from @args, with spamd's defaults filled in. Dies
# with a message naming the option on a refused or malformed one.
sub parse {
    my @args = @_;
    my %opt = (
        'user-config'  => 1,
        'min-children' => 1,
        'min-spare'    => 1,
        'max-spare'    => 2,
        'listen'       => [],
        'allowed-ips'  => [],
        'pre'          => [],
        'cf'           => [],
    );
    my @refused;
    my $refuse = sub { push @refused, "$_[0]" };
    my $p = Getopt::Long::Parser->new(config => [qw(bundling no_ignore_case no_auto_abbrev)]);
    my @messages;
    local $SIG{__WARN__} = sub { push @messages, $_[0] };
    $p->getoptionsfromarray(\@args,
        'allow-tell|l'              => \$opt{'allow-tell'},
        'allowed-ips|A=s'           => $opt{'allowed-ips'},
        'create-prefs|c!'           => \$opt{'create-prefs'},
        'configpath|C=s'            => \$opt{configpath},
        'daemonize|d'               => \$opt{daemonize},
        'debug|D:s'                 => \$opt{debug},
        'default-user|U=s'          => \$opt{'default-user'},
        'groupname|g=s'             => \$opt{groupname},
        'helper-home-dir|H:s'       => \$opt{'helper-home-dir'},
        'help|h'                    => \$opt{help},
        '4|ipv4only|ipv4-only|ipv4' => sub { $opt{ipv4} = 1; $opt{ipv6} = 0 },
        '6'                         => sub { $opt{ipv6} = 1; $opt{ipv4} = 0 },
        'listen|listen-ip|ip-address|i:s' => $opt{listen},
        'local|L!'                  => \$opt{local},
        'round-robin!'              => \$opt{'round-robin'},
        'min-children=i'            => \$opt{'min-children'},
        'max-children|m=i'          => \$opt{'max-children'},
        'min-spare=i'               => \$opt{'min-spare'},
        'max-spare=i'               => \$opt{'max-spare'},
        'max-conn-per-child=i'      => \$opt{'max-conn-per-child'},
        'nouser-config|x'           => sub { $opt{'user-config'} = 0 },
        'user-config'               => sub { $opt{'user-config'} = 1 },
        'pidfile|r=s'               => \$opt{pidfile},
        'port|p=s'                  => \$opt{port},
        'siteconfigpath=s'          => \$opt{siteconfigpath},
        'pre=s'                     => $opt{pre},
        'cf=s'                      => $opt{cf},
        'socketgroup=s'             => \$opt{socketgroup},
        'socketmode=s'              => \$opt{socketmode},
        'socketowner=s'             => \$opt{socketowner},
        'socketpath=s'              => \$opt{socketpath},
        'syslog|s=s'                => \$opt{syslog},
        'timeout-tcp|T=i'           => \$opt{'timeout-tcp'},
        'timeout-child|t=i'         => \$opt{'timeout-child'},
        'username|u=s'              => \$opt{username},
        'version|V'                 => \$opt{version},
        # Refused: each names itself.
        (map { my $name = $_; ("$name:s" => sub { $refuse->("--$name") }) } @REFUSED_VALUE),
        (map { my $name = $_; ("$name!" => sub { $refuse->("--$name") }) } @REFUSED_FLAG),
        'q' => sub { $refuse->('-q (--sql-config)') },
        'Q' => sub { $refuse->('-Q (--setuid-with-sql)') },
        'v' => sub { $refuse->('-v (--vpopmail)') },
        'P' => sub { $refuse->('-P (--paranoid)') },
        # forkpool's own.
        (map { ("$_=s" => \$opt{"pool-$_"}) } @POOL_OPTIONS),
        (map { ($_ => \$opt{"pool-$_"}) } @POOL_SWITCHES),
        # The workers' side of the command line (set by forkpool-spamd itself).
        'forkpool-worker' => \$opt{'forkpool-worker'},
        # Not a server: tells the running one to reload (HUP).
        'reload' => \$opt{reload},
    ) or die join('', @messages) || "bad command line\n";
    if (@refused) {
        my ($first) = @refused;
        (my $key = $first) =~ s/^--//;
        $key =~ s/^-\w \(--(.*)\)$/$1/;
        die "forkpool-spamd: $first is not supported ($REFUSED{$key}); "
            . "remove it, or run Debian's spamd for it\n";
    }
    @args and die "forkpool-spamd: unexpected arguments: @args\n";
    $opt{'pool-refork-after'} //= $DEFAULT_REFORK_AFTER;
    check(\%opt);
    return \%opt;
}

# spamd's own consistency rules and limits.
sub check {
    my ($opt) = @_;
    for my $name (qw(max-children min-children min-spare max-spare max-conn-per-child
                     timeout-tcp timeout-child)) {
        next unless defined $opt->{$name};
        $opt->{$name} =~ /\A-?\d+\z/ or die "forkpool-spamd: --$name must be a number\n";
    }
    my $max = $opt->{'max-children'};
    $max = 5 if !defined $max || $max < 1;
    $opt->{'max-children'} = $max;
    my $conns = $opt->{'max-conn-per-child'};
    $opt->{'max-conn-per-child'} = defined $conns && $conns >= 1 ? $conns : 200;
    $opt->{'min-children'} = 1 if $opt->{'min-children'} < 1;
    $opt->{'min-children'} = $max if $opt->{'min-children'} > $max;
    $opt->{'min-spare'} = 0 if $opt->{'min-spare'} < 0;
    $opt->{'min-spare'} = $max - 1 if $opt->{'min-spare'} > $max;
    $opt->{'max-spare'} = $opt->{'min-spare'} + 1 if $opt->{'max-spare'} < $opt->{'min-spare'};
    $opt->{'timeout-tcp'}   = 30  unless defined $opt->{'timeout-tcp'}   && $opt->{'timeout-tcp'} >= 0;
    $opt->{'timeout-child'} = 300 unless defined $opt->{'timeout-child'} && $opt->{'timeout-child'} >= 0;
    $opt->{'default-user'} //= 'nobody';
    if (defined $opt->{debug}) {
        $opt->{debug} ||= 'all';
    }
    if (defined $opt->{socketpath} && $opt->{socketpath} ne '') {
        $opt->{socketpath} =~ m{^/}
            or die "forkpool-spamd: --socketpath must be an absolute path: $opt->{socketpath}\n";
    }
    if (defined $opt->{socketmode}) {
        $opt->{socketmode} =~ /\A[0-7]{3,4}\z/
            or die "forkpool-spamd: --socketmode must be octal, like 0660\n";
    }
    return;
}

1;
