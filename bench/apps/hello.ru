# frozen_string_literal: true

# The Rack "hello" app bench/apps.sh serves with forkpool-rack, unicorn
# and Puma alike.
run ->(_env) { [200, { "Content-Type" => "text/plain", "Content-Length" => "6" }, ["hello\n"]] }
