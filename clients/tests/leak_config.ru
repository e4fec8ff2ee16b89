# frozen_string_literal: true

# A Rack app that leaks a descriptor on every request (tests only): each
# request opens /dev/null and never closes it, as a handler with a leak
# does; the answer is the worker's pid, or 500 with the error once an open
# fails. tests/leaky_apps.rs serves it kept alive under a small
# RLIMIT_NOFILE.

LEAKED = [] # rubocop:disable Style/MutableConstant (the leak)

run(lambda do |_env|
  LEAKED << IO.sysopen("/dev/null")
  [200, { "Content-Type" => "text/plain" }, ["#{Process.pid}\n"]]
rescue SystemCallError => e
  [500, { "Content-Type" => "text/plain" }, ["#{e.message}\n"]]
end)
