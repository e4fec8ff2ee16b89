package Forkpool::Spamd::Users;

# Per-user configuration, as spamd does it without SQL, LDAP or vpopmail:
# the `User` header names the user; with user configuration on (spamd's
# default; -x turns it off) the user's ~/.spamassassin/user_prefs is read
# (scores and options only); a worker running as root (no -u) switches its
# effective user to the named one for the message, and to the default user
# (-U, `nobody`) when no user is named, so that no message is checked as
# root. After the message the worker switches back and the configuration
# is restored (Forkpool::Spamd::Server).

use strict;
use warnings;

use Mail::SpamAssassin::Logger qw(info dbg);

our $VERSION = '1';

# A user switcher for these options and SpamAssassin object. It switches
# effective users only when the worker runs as root without -u, as spamd.
sub new {
    my ($class, $opt, $sa) = @_;
    return bless {
        opt     => $opt,
        sa      => $sa,
        setuid  => !$opt->{username} && $> == 0 ? 1 : 0,
    }, $class;
}

# The `User` header's value $user: switches to that user's preferences
# (and, as root, to that user). A user that cannot be found keeps the
# defaults, with a log line, as in spamd.
sub take_user {
    my ($self, $user) = @_;
    my $suidto = $self->{opt}{username} || $user;
    my ($uid, $home) = (getpwnam($suidto))[2, 7];
    if (!defined $uid) {
        info("spamd: handle_user (getpwnam) unable to find user: '$suidto'");
        return;
    }
    if ($self->{setuid}) {
        $self->_become($uid, $suidto);
        info("spamd: setuid to $suidto succeeded");
    }
    my $dir;
    if ($self->{opt}{'user-config'}) {
        $dir = $user eq $suidto ? $home : (getpwnam($user))[7];
        if (!defined $dir) {
            info("spamd: handle_user (userdir) unable to find user: '$user'\n");
            return;
        }
    }
    $self->_set_prefs($dir, $user);
    return;
}

# Before a message is checked: a worker still root falls back to the
# default user, as spamd does (nobody checks mail as root).
sub before_check {
    my ($self) = @_;
    return unless $self->{setuid} && $> == 0;
    warn "spamd: still running as root: user not specified with -u, not found, "
        . "or set to root, falling back to $self->{opt}{'default-user'}\n";
    my ($name, $uid, $dir) = (getpwnam($self->{opt}{'default-user'}))[0, 2, 7];
    defined $uid or die "spamd: setuid to $self->{opt}{'default-user'} failed";
    $self->_become($uid, $name);
    $self->{sa}->signal_user_changed({ username => $name, user_dir => $dir });
    return;
}

# After a connection: back to the worker's own user.
sub restore {
    my ($self) = @_;
    return unless $self->{setuid};
    if ($> != $<) {
        $) = "$( $(";
        $> = $<;
        $> == $< or die "spamd: return setuid failed";
    }
    return;
}

# Effective uid $uid and the groups of user $name (the primary one and
# every group listing it), as spamd's seteuid does; dies if it did not take.
sub _become {
    my ($self, $uid, $name) = @_;
    my $groups = join ' ', (getpwuid($uid))[3],
        map { $_->[2] } grep { grep { $_ eq $name } split ' ', $_->[3] } _groups();
    $) = $groups;
    $> = $uid;
    $> == $uid or die "spamd: fatal error: setuid to $name failed";
    return;
}

# Every group: (name, password, gid, members).
sub _groups {
    my @all;
    setgrent();
    while (my @g = getgrent()) { push @all, \@g }
    endgrent();
    return @all;
}

# Reads the user's user_prefs from $dir (none without one) and tells
# SpamAssassin's plugins the user changed.
sub _set_prefs {
    my ($self, $dir, $user) = @_;
    if ($dir) {
        my $file = "$dir/.spamassassin/user_prefs";
        # -c (--create-prefs): a user without a file gets the default one.
        if (!-r $file && !$self->{sa}{dont_copy_prefs}) {
            info("spamd: creating default_prefs: $file");
            $self->{sa}->create_default_prefs($file, $user, $dir);
            info("spamd: failed to create readable default_prefs: $file") unless -r $file;
        }
        $self->{sa}->read_scoreonly_config($file);
    }
    $self->{sa}->signal_user_changed({ username => $user, user_dir => $dir });
    return;
}

1;
