package Forkpool::Spamd::Server;

# The worker side of forkpool-spamd. Under `forkpool run --preload` this
# runs once as the template: it loads SpamAssassin, reads and compiles the
# rules (compile_now), refuses to serve rules with errors (so that a HUP
# onto broken rules rolls back), and saves the configuration. Every
# worker is forked from it: it calls the `spamd_child_init` plugins, then
# answers one connection at a time (Forkpool::Spamd::Connection), and
# after each calls the `spamd_child_post_connection_close` plugins,
# switches back to its own user and restores the saved configuration
# (copy_config), as a spamd child does.

use strict;
use warnings;

use File::Spec ();
use File::Temp ();
use Mail::SpamAssassin ();
use Mail::SpamAssassin::Logger qw(info dbg);
use Mail::SpamAssassin::NetSet ();

use Forkpool::Worker;
use Forkpool::Spamd::Command;
use Forkpool::Spamd::Connection;
use Forkpool::Spamd::Log;
use Forkpool::Spamd::Users;

our $VERSION = '1';

# Debian's paths, as its spamd has them built in.
my %PATHS = (
    PREFIX          => '/usr',
    DEF_RULES_DIR   => '/usr/share/spamassassin',
    LOCAL_RULES_DIR => '/etc/spamassassin',
    LOCAL_STATE_DIR => '/var/lib/spamassassin',
);

# Loads SpamAssassin for the parsed options $opt, compiles the rules and
# dies if they have errors.
sub new {
    my ($class, $opt) = @_;
    Forkpool::Spamd::Log::setup($opt);
    my $home = _helper_home($opt);
    my $sa = Mail::SpamAssassin->new({
        dont_copy_prefs      => ($opt->{'create-prefs'} ? 0 : 1),
        rules_filename       => ($opt->{configpath} ? File::Spec->rel2abs($opt->{configpath}) : 0),
        site_rules_filename  => ($opt->{siteconfigpath} ? File::Spec->rel2abs($opt->{siteconfigpath}) : 0),
        pre_config_text      => join("\n", @{ $opt->{pre} }) . "\n",
        post_config_text     => join("\n", @{ $opt->{cf} }) . "\n",
        force_ipv4           => ($opt->{ipv4} || 0),
        local_tests_only     => ($opt->{local} || 0),
        debug                => ($opt->{debug} || 0),
        paranoid             => 0,
        require_rules        => 1,
        skip_prng_reseeding  => 1,
        home_dir_for_helpers => $home,
        %PATHS,
    });
    my $self = bless { opt => $opt, sa => $sa }, $class;
    $self->_preload;
    $self->{users}   = Forkpool::Spamd::Users->new($opt, $sa);
    $self->{allowed} = _allowed_nets($opt);
    # What each listener is, in forkpool's order (the handler gets its index).
    $self->{listeners} = [Forkpool::Spamd::Command::listeners($opt)];
    $self->{copy_config} = $opt->{'max-conn-per-child'} > 1;
    if ($self->{copy_config}) {
        for (qw(username user_dir userstate_dir learn_to_journal)) {
            $self->{msa_backup}{$_} = $sa->{$_} if exists $sa->{$_};
        }
        $self->{conf_backup} = {};
        $sa->copy_config(undef, $self->{conf_backup})
            or die "spamd: error returned from copy_config\n";
    }
    return $self;
}

# The home directory SpamAssassin's helpers (Razor, Pyzor) use: -H's, or
# the one HOME names (the -u user's, set by forkpool-spamd), and HOME is
# then unset, as spamd does.
sub _helper_home {
    my ($opt) = @_;
    my $home = defined $opt->{'helper-home-dir'} && $opt->{'helper-home-dir'} ne ''
        ? File::Spec->rel2abs($opt->{'helper-home-dir'}) : $ENV{HOME};
    delete $ENV{HOME};
    return $home;
}

# Compiles everything now, in a scratch HOME, so that the workers fork
# with the rules compiled; dies naming the first errors in the rules.
sub _preload {
    my ($self) = @_;
    my $sa = $self->{sa};
    my $tmp = File::Temp->newdir('forkpool-spamd-XXXXXX', TMPDIR => 1);
    mkdir "$tmp/.spamassassin", 0700 or die "cannot create $tmp/.spamassassin: $!\n";
    {
        local $ENV{HOME} = "$tmp";
        my @errors;
        local $sa->{lint_callback} = sub {
            my %report = @_;
            info($report{msg});
            push @errors, "$report{msg}\n" if $report{iserror};
        };
        $sa->compile_now(0, 1);
        $/ = "\n";    # Razor resets it
        if (@errors) {
            die "forkpool-spamd: the rules have " . @errors . " error(s); not serving them:\n"
                . join('', @errors[0 .. ($#errors < 4 ? $#errors : 4)]);
        }
    }
    $sa->init_learner({ opportunistic_expire_check_only => 1 });
    $sa->finish_learner;
    return;
}

# -A's networks (127.0.0.1 and ::1 by default, as spamd).
sub _allowed_nets {
    my ($opt) = @_;
    my $nets = Mail::SpamAssassin::NetSet->new;
    my @ips = grep { length } map { split /,/ } @{ $opt->{'allowed-ips'} };
    @ips = ('127.0.0.1', '::1') unless @ips;
    for my $ip (@ips) {
        $nets->add_cidr($ip) > 0 or die "forkpool-spamd: aborting due to add_cidr error for $ip\n";
    }
    return $nets;
}

# Whether -A allows the client at numeric address $addr.
sub allowed {
    my ($self, $addr) = @_;
    return $self->{allowed}->contains_ip($addr);
}

# Serves as a forkpool worker (forked from this template) until told to
# quit.
sub run {
    my ($self) = @_;
    my $sa = $self->{sa};
    Forkpool::Worker->after_fork(sub {
        $0 = 'spamd child';
        Forkpool::Spamd::Log::reopen($self->{opt});
        $sa->call_plugins('spamd_child_init');
    });
    my $worker = Forkpool::Worker->from_env;
    $worker->serve(sub { $self->connection(@_) });
    return;
}

# One connection, then the clean-up a spamd child does after each.
sub connection {
    my ($self, $sock, $listener) = @_;
    my ($path) = ($self->{listeners}[$listener // 0] // '') =~ /^unix:(.*)\z/s;
    my $ok = eval { Forkpool::Spamd::Connection->serve($self, $sock, $path); 1 };
    warn "spamd: error: $@, continuing\n" unless $ok;
    close $sock;
    my $sa = $self->{sa};
    $sa->call_plugins('spamd_child_post_connection_close');
    $self->{users}->restore;
    if ($self->{copy_config}) {
        $sa->{$_} = $self->{msa_backup}{$_} for keys %{ $self->{msa_backup} };
        $sa->copy_config($self->{conf_backup}, undef)
            or die "spamd: error returned from copy_config\n";
    }
    return;
}

1;
