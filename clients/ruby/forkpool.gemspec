# frozen_string_literal: true

# The Ruby helper as a gem, built from the repository and installed
# without network:
#   cd clients/ruby && gem build forkpool.gemspec
#   gem install --local forkpool-*.gem
# It needs Rack (Debian: ruby-rack), which `gem install --local` finds
# already installed; nothing else.
Gem::Specification.new do |s|
  s.name = "forkpool"
  s.version = "0.1.0"
  s.summary = "forkpool's Ruby worker helper and a Rack server on it"
  s.description = "Forkpool::Worker speaks forkpool's back-channel protocol (every dispatch mode, " \
                  "--preload templates, refork); forkpool-rack and Rack::Handler::Forkpool serve a " \
                  "Rack app from a forkpool pool."
  s.authors = ["the forkpool authors"]
  s.license = "MIT OR Apache-2.0"
  s.required_ruby_version = ">= 3.0"
  s.files = Dir["forkpool/*.rb", "rack/handler/*.rb", "forkpool-rack"]
  s.require_paths = ["."]
  s.bindir = "."
  s.executables = ["forkpool-rack"]
  s.add_runtime_dependency "rack", ">= 2.2"
end
