# The Plack "hello" app bench/apps.sh serves with every PSGI server.
my $app = sub {
    return [200, ['Content-Type' => 'text/plain', 'Content-Length' => 6], ["hello\n"]];
};
