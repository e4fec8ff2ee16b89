package Forkpool::Spamd::Command;

# spamd's options (Forkpool::Spamd::Options) as a `forkpool run`
# command line: the listeners, the pool's sizes and limits, the user, and
# the worker program (forkpool-spamd itself, with --forkpool-worker and
# the same options), preloaded.

use strict;
use warnings;

use File::Basename ();
use File::Spec ();
use Forkpool::Spamd::Options ();
use Socket qw(AF_INET AF_INET6 AF_UNSPEC SOCK_STREAM AI_PASSIVE AI_ADDRCONFIG
    NI_NUMERICHOST NIx_NOSERV getaddrinfo getnameinfo);

our $VERSION = '1';

# The forkpool binary: $FORKPOOL_BIN, else `forkpool` on PATH, else the
# checkout's build (target/release, then target/debug) next to $script.
sub forkpool_bin {
    my ($script) = @_;
    return $ENV{FORKPOOL_BIN} if defined $ENV{FORKPOOL_BIN} && $ENV{FORKPOOL_BIN} ne '';
    for my $dir (File::Spec->path) {
        my $path = File::Spec->catfile($dir, 'forkpool');
        return $path if -f $path && -x _;
    }
    my $root = File::Spec->catdir(File::Basename::dirname(File::Spec->rel2abs($script)),
        File::Spec->updir, File::Spec->updir);
    for my $profile (qw(release debug)) {
        my $path = File::Spec->catfile($root, 'target', $profile, 'forkpool');
        return $path if -f $path && -x _;
    }
    die "forkpool-spamd: cannot find the forkpool binary: set FORKPOOL_BIN, put "
        . "forkpool on PATH, or build it (cargo build --release)\n";
}

# forkpool's --listen values for spamd's -i, -p and --socketpath.
sub listeners {
    my ($opt) = @_;
    my @specs = @{ $opt->{listen} };
    push @specs, $opt->{socketpath} if defined $opt->{socketpath} && $opt->{socketpath} ne '';
    @specs = ('localhost') unless @specs;
    my @listen;
    for my $spec (@specs) {
        $spec = '*' if $spec eq '';
        if ($spec =~ m{^ssl:}i) {
            die "forkpool-spamd: -i $spec is not supported (TLS is not implemented: "
                . "terminate TLS in front)\n";
        }
        if ($spec =~ m{^(/.*)\z}s) {
            push @listen, "unix:$1";
            next;
        }
        $spec =~ m{^ (?: \[ ([^\]]*) \] | ([a-z0-9._-]*) | ([a-f0-9]*:[a-f0-9]*:[a-f0-9:]*) | (\*) )?
                     (?: : ([a-z0-9-]*) )? \z}xsi
            or die "forkpool-spamd: invalid socket specification syntax: $spec\n";
        my $addr = $1 // $2 // $3 // $4;
        my $port = $5;
        $addr = 'localhost' if !defined $addr || $addr eq '';
        $port = $opt->{port} if !defined $port || $port eq '';
        $port = 783 if !defined $port || $port eq '';
        if ($port !~ /^\d+\z/) {
            my $number = (getservbyname($port, 'tcp'))[2]
                or die "forkpool-spamd: invalid port: $port, socket: $spec\n";
            $port = $number;
        }
        push @listen, map { /:/ ? "[$_]:$port" : "$_:$port" } _addresses($addr, $opt);
    }
    return @listen;
}

# The numeric addresses $name stands for (`*`: every interface).
sub _addresses {
    my ($name, $opt) = @_;
    return ($opt->{ipv6} ? '::' : '0.0.0.0') if $name eq '*';
    my $family = $opt->{ipv4} ? AF_INET : $opt->{ipv6} ? AF_INET6 : AF_UNSPEC;
    my ($err, @found) = getaddrinfo($name, 0,
        { family => $family, socktype => SOCK_STREAM, flags => AI_PASSIVE | AI_ADDRCONFIG });
    die "forkpool-spamd: cannot resolve '$name': $err\n" if $err;
    my (%seen, @addresses);
    for my $found (@found) {
        my ($e, $ip) = getnameinfo($found->{addr}, NI_NUMERICHOST, NIx_NOSERV);
        push @addresses, $ip if !$e && !$seen{$ip}++;
    }
    return @addresses;
}

# The `forkpool run` options for the pool.
sub pool_options {
    my ($opt) = @_;
    my @args = ('--preload', map { ('--listen', $_) } listeners($opt));
    my $max = $opt->{'max-children'};
    if ($opt->{'round-robin'}) {
        push @args, '--min-children', $max, '--max-children', $max,
            '--min-spare', 0, '--max-spare', $max;
    }
    else {
        push @args, '--min-children', $opt->{'min-children'}, '--max-children', $max,
            '--min-spare', $opt->{'min-spare'}, '--max-spare', $opt->{'max-spare'};
    }
    push @args, '--max-requests-per-child', $opt->{'max-conn-per-child'};
    push @args, '--unix-mode', $opt->{socketmode} if defined $opt->{socketmode};
    if (defined $opt->{username}) {
        push @args, '--user', $opt->{username};
        push @args, '--group', $opt->{groupname} if defined $opt->{groupname};
    }
    elsif (defined $opt->{groupname}) {
        die "forkpool-spamd: -g needs -u (as spamd's does)\n";
    }
    for my $name (@Forkpool::Spamd::Options::POOL_OPTIONS) {
        my $value = $opt->{"pool-$name"};
        next if !defined $value || ($name eq 'refork-after' && $value eq '0');
        push @args, "--$name", $value;
    }
    for my $name (@Forkpool::Spamd::Options::POOL_SWITCHES) {
        push @args, "--$name" if $opt->{"pool-$name"};
    }
    return @args;
}

# The whole command: forkpool run, its options, and the worker program.
sub command {
    my ($opt, $script, @original) = @_;
    my $lib = File::Basename::dirname(File::Spec->rel2abs($script));
    return (forkpool_bin($script), 'run', pool_options($opt), '--',
        $^X, "-I$lib", File::Spec->rel2abs($script), '--forkpool-worker', @original);
}

1;
