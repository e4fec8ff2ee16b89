package Forkpool::Spamd::SocketOwner;

# spamd's --socketowner and --socketgroup. forkpool creates the Unix
# socket after forkpool-spamd has exec'd it, so a detached helper process
# (not forkpool's child: it is forked twice) waits for the new socket file
# to appear and gives it its owner and group, as spamd does after binding.

use strict;
use warnings;

use POSIX ();
use Time::HiRes ();

our $VERSION = '1';

# How long the helper waits for forkpool to create the socket.
use constant WAIT_SECONDS => 120;
use constant POLL_SECONDS => 0.05;

# Starts the helper for the socket at $path when --socketowner or --socketgroup is
# set; returns at once in the calling process. Dies on an unknown user or
# group, before anything starts.
sub arrange {
    my ($opt) = @_;
    my ($owner, $group) = @$opt{qw(socketowner socketgroup)};
    return unless defined $owner || defined $group;
    my $path = $opt->{socketpath}
        // die "forkpool-spamd: --socketowner and --socketgroup need --socketpath\n";
    my $uid = -1;
    my $gid = -1;
    if (defined $owner) {
        $uid = $owner =~ /^\d+$/ ? $owner : getpwnam($owner);
        defined $uid or die "forkpool-spamd: --socketowner: no such user '$owner'\n";
    }
    if (defined $group) {
        $gid = $group =~ /^\d+$/ ? $group : getgrnam($group);
        defined $gid or die "forkpool-spamd: --socketgroup: no such group '$group'\n";
    }
    my $old = (lstat $path)[1] // 0;
    my $first = fork // die "forkpool-spamd: fork: $!\n";
    if ($first) {
        waitpid($first, 0);
        return;
    }
    my $second = fork;
    POSIX::_exit(0) if !defined $second || $second;
    my $deadline = Time::HiRes::time() + WAIT_SECONDS;
    while (Time::HiRes::time() < $deadline) {
        my $inode = (lstat $path)[1];
        if (-S _ && $inode != $old) {
            chown($uid, $gid, $path)
                or warn "forkpool-spamd: cannot set the owner of $path: $!\n";
            POSIX::_exit(0);
        }
        Time::HiRes::sleep(POLL_SECONDS);
    }
    warn "forkpool-spamd: $path did not appear; its owner is unchanged\n";
    POSIX::_exit(1);
}

1;
