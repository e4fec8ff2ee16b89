# frozen_string_literal: true

# The Sinatra app crates/forkpool-cli/tests/rack.rs serves with
# forkpool-rack, every request through Rack::Lint.
require "sinatra/base"
require "forkpool/worker"

# Opened while loading: under --preload, in the template only. Its
# descriptor must not reach the workers (docs/protocol.md, "What the forked
# worker does", step 1); the test looks for it in /proc.
LOADED_FILE = File.open(__FILE__)

# after_fork hooks run in every worker before it says Ready.
AFTER_FORK_PIDS = []
Forkpool::Worker.after_fork { AFTER_FORK_PIDS << Process.pid }

class TestApp < Sinatra::Base
  # Errors reach the server, which answers 500 itself.
  set :show_exceptions, false
  set :raise_errors, true
  set :logging, false

  before do
    headers "X-Forkpool-Pid" => Process.pid.to_s, "X-Forkpool-Slot" => ENV.fetch("FORKPOOL_SLOT", "")
  end

  get "/" do
    sleep(params[:work_ms].to_i / 1000.0) if params[:work_ms]
    "hello #{params[:name] || 'world'}\n"
  end

  post "/echo" do
    request.body.read
  end

  # Answers without reading the body.
  post "/ignore" do
    "ignored\n"
  end

  get "/stream" do
    stream do |out|
      params[:parts].to_i.times { |i| out << "part #{i + 1}\n" }
    end
  end

  get "/raise" do
    raise "the app failed on purpose"
  end

  # What the app sees of itself: whether Rack::Lint wraps its input, and
  # whether its after_fork hook ran in this very process.
  get "/self" do
    "#{env['rack.input'].class} #{AFTER_FORK_PIDS.include?(Process.pid)}\n"
  end

  # Whether this process runs with YJIT (ruby --yjit, RUBY_YJIT_ENABLE=1).
  get "/yjit" do
    "yjit #{defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? 'on' : 'off'}\n"
  end

  # What the server put in the environment, and a response header named
  # by the request (the server remembers what it saw of both).
  get "/env" do
    headers params[:h] => "1" if params[:h]
    "#{env['SERVER_NAME']} #{env['SERVER_PORT']} #{env['HTTP_X_A'].inspect} " \
      "#{env['HTTP_X_B'].inspect} #{env.key?('HTTP_X_C')} #{env['REMOTE_ADDR']}:#{env['REMOTE_PORT']}\n"
  end

  get "/recycle" do
    env["forkpool.recycle"].call
    "leaving\n"
  end

  get "/recycle-after-reply" do
    env["rack.after_reply"] << env["forkpool.recycle"]
    "leaving after the reply\n"
  end

  get "/slow-for-a-dump" do
    $stderr.syswrite("slow request started\n") # the test waits for this
    deadline = Time.now + params[:s].to_f
    sleep 0.01 while Time.now < deadline
    "woke\n"
  end
end

use Rack::Lint
run TestApp
