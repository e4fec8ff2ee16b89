# Unit tests of when a `kernel` dispatch worker reads smaps_rollup
# (Forkpool::Worker::Kernel's rollup_due and memory_past), without /proc:
# the worker's memory is a model, private pages (USS) and pages shared
# with its template (RSS counts both), and its reads are counted.
# `prove -I clients/perl clients/perl/t`.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::Bin/..";

use Test::More;
use Forkpool::Worker;
use Forkpool::Worker::Kernel;

use constant LIMIT  => 8;    # small units, to go through every case
use constant REREAD => Forkpool::Worker::Kernel::SMAPS_REREAD;

sub due { Forkpool::Worker::Kernel::rollup_due(@_) }

# The rule in other words: a read is due unless there was one, less than
# SMAPS_REREAD ago, and what USS was then plus what RSS has grown since
# stays below the limit.
sub could_pass {
    my ($limit, $rss, $last, $now) = @_;
    return 1 unless $last;
    my ($uss_then, $rss_then, $then) = @$last;
    my $grown = $rss > $rss_then ? $rss - $rss_then : 0;
    return $uss_then + $grown >= $limit || !($now - $then < REREAD) ? 1 : 0;
}

subtest 'the rule over every small case' => sub {
    my ($cases, $wrong) = (0, 0);
    for my $uss_then (0 .. LIMIT + 2) {
        for my $rss_then (LIMIT .. 2 * LIMIT + 1) {
            for my $rss (LIMIT + 1 .. 3 * LIMIT - 1) {
                for my $when (0, 0.05, REREAD - 1e-6, REREAD, 0.3) {
                    my $last = [$uss_then, $rss_then, 0];
                    my $got = due(LIMIT, $rss, $last, $when) ? 1 : 0;
                    my $want = could_pass(LIMIT, $rss, $last, $when);
                    $cases++;
                    next if $got == $want;
                    diag("uss $uss_then, rss $rss_then -> $rss, $when s: $got, want $want")
                        if $wrong++ < 5;
                }
            }
        }
    }
    is($wrong, 0, "$cases cases");
    ok(due(LIMIT, $_, undef, 0), "no read yet, RSS $_") for LIMIT + 1, 3 * LIMIT;
};

subtest 'the edges' => sub {
    my $mib  = 1 << 20;
    my $last = [40 * $mib, 100 * $mib, 0];
    ok(!due(64 * $mib, 123 * $mib, $last, 0.099), '23 MiB more cannot pass 24');
    ok(due(64 * $mib, 124 * $mib, $last, 0),      '24 MiB more could');
    ok(!due(64 * $mib, 90 * $mib, $last, 0.05),   'RSS fell');
    ok(due(64 * $mib, 100 * $mib, $last, REREAD), '100 ms on');
    ok(due(64 * $mib, 90 * $mib, [64 * $mib, 100 * $mib, 0], 0), 'no room left');
};

# A worker's memory and its look after each connection: (private, shared)
# then [alloc, free, cow, took] steps. Each look is checked: never past
# while USS is not; once USS is past, found at the first look with no
# copy-on-write break since the last read, or SMAPS_REREAD after it; no
# read with RSS at or under the limit. The number of failed checks.
sub run_connections {
    my ($private, $shared, @steps) = @_;
    my $limits = { max => LIMIT };
    my ($reads, $now, $cow_since_read, $bad) = (0, 100, 0, 0);
    for my $step (@steps) {
        my ($alloc, $free, $cow, $took) = @$step;
        my $before = $limits->{last_rollup};
        my $reads_before = $reads;
        $private += $alloc - ($free < $private ? $free : $private);
        $cow = $shared if $cow > $shared;
        $shared -= $cow;
        $private += $cow;
        $cow_since_read ||= $cow > 0;
        $now += $took;
        my $rss = $private + $shared;
        my $found = Forkpool::Worker::Kernel::memory_past($limits, $rss, $now,
            sub { $reads++; $private });
        my $read = $reads > $reads_before;
        $bad++ if $read && $rss <= LIMIT;
        $cow_since_read = 0 if $read;
        my $stale = !$before || $now - $before->[2] >= REREAD;
        if ($private > LIMIT) {
            $bad++ if (!$cow_since_read || $stale) && !(defined $found && $found == $private);
        }
        else {
            $bad++ if defined $found;
        }
        last if defined $found;
    }
    return $bad;
}

subtest 'every short run of connections' => sub {
    my @kinds;
    for my $alloc (0, 1, 4) {
        for my $free (0, 2) {
            for my $cow (0, 3) {
                push @kinds, [$alloc, $free, $cow, $_] for 0, 0.04, 0.1;
            }
        }
    }
    my ($runs, $bad) = (0, 0);
    for my $start ([0, 0], [2, 10], [7, 4], [5, 20]) {
        for my $a (@kinds) {
            for my $b (@kinds) {
                for my $c (@kinds) {
                    $runs++;
                    $bad++ if run_connections(@$start, $a, $b, $c);
                }
            }
        }
    }
    is($bad, 0, "$runs runs");
};

subtest 'long runs' => sub {
    srand(44);
    my $pick = sub { $_[ int(rand(@_)) ] };
    my $bad  = 0;
    for (1 .. 1000) {
        my @steps = map {
            [$pick->(0, 0, 1, 3), $pick->(0, 0, 2), $pick->(0, 0, 0, 0, 2), $pick->(0.001, 0.01, 0.03)]
        } 1 .. 1 + int(rand(60));
        $bad++ if run_connections(int(rand(8)), int(rand(30)), @steps);
    }
    is($bad, 0, '1000 runs');
};

subtest 'a preloaded worker reads every 100 ms at most' => sub {
    # RSS 30 over a limit of 8, USS 2: a connection every millisecond for
    # a second.
    my $limits = { max => LIMIT };
    my ($reads, $found) = (0, 0);
    for my $ms (1 .. 1000) {
        $found++ if defined Forkpool::Worker::Kernel::memory_past($limits, 30, $ms / 1000,
            sub { $reads++; 2 });
    }
    is($found, 0, 'never past');
    cmp_ok($reads, '>=', 1,  'read');
    cmp_ok($reads, '<=', 10, 'at most every 100 ms');
};

subtest 'a worker growing fast is read after each connection that could pass' => sub {
    my $limits = { max => LIMIT };
    my $reads  = 0;
    my $look   = sub {
        my ($rss, $uss) = @_;
        Forkpool::Worker::Kernel::memory_past($limits, $rss, 0.001 * ++$reads, sub { $uss });
    };
    ok(!defined $look->(8, 2), 'RSS at the limit');
    ok(!$limits->{last_rollup}, 'nothing read');
    ok(!defined $look->(9, 3), 'above it: USS 3');
    is($limits->{last_rollup}[0], 3, 'read');
    is($look->(15, 9), 9, '6 more could pass the 5 left, and do');
};

subtest 'the real look keeps its read' => sub {
    plan skip_all => 'no pread64 syscall number' unless defined Forkpool::Worker::syscall_number('pread64');
    # This test process holds more than 1 KiB of its own, and less than a
    # petabyte.
    for my $case ([1024, 'memory'], [1 << 50, undef]) {
        my ($max, $want) = @$case;
        my $self = bless { max_memory => $max, slot => 1 }, 'Forkpool::Worker';
        Forkpool::Worker::Kernel::_start_limits($self);
        is(Forkpool::Worker::Kernel::_past_limit($self), $want, "limit $max");
        if ($want) {
            cmp_ok($self->{limits}{last_rollup}[0], '>', $max, 'its read kept');
        }
        else {
            ok(!$self->{limits}{last_rollup}, 'RSS under the limit: no read');
        }
        POSIX::close($self->{limits}{statm});
    }
};

done_testing;
