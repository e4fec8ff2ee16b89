# frozen_string_literal: true

require "optparse"
require_relative "rack_server"

module Forkpool
  # The command line of `forkpool-rack` and the options the Rack handler
  # (`rackup -s forkpool -O NAME=VALUE`) takes: the same names.
  module RackCLI
    USAGE = "forkpool run [pool options] -- ruby -Iclients/ruby clients/ruby/forkpool-rack [options] [config.ru]"

    # [name, limit, conversion, help]
    OPTIONS = [
      ["head-timeout", :head_timeout, :Float, "the whole request head must arrive within SECONDS, else 408 (10)"],
      ["body-timeout", :body_timeout, :Float, "the whole request body must arrive within SECONDS, else 408 (30)"],
      ["keepalive-timeout", :keepalive_timeout, :Float, "longest silence between two requests on a connection (5)"],
      ["keepalive-turn", :keepalive_turn, :Float,
       "how long a kept-alive connection keeps its worker while other clients wait (0.02)"],
      ["read-timeout", :io_timeout, :Float, "longest wait for one write of a response (30)"],
      ["max-requests-per-connection", :max_requests, :Integer,
       "requests on one connection; 1 turns keep-alive off (1000)"],
      ["max-body", :max_body, :Integer, "largest request body in bytes, else 413 (1073741824)"]
    ].freeze

    module_function

    # Parses `argv`: [config.ru path, limits, access_log, chdir].
    def parse(argv)
      limits = HTTP::Limits.defaults
      access_log = true
      chdir = nil
      parser = OptionParser.new do |o|
        o.banner = "usage: #{USAGE}\nServes the Rack app of config.ru (default ./config.ru) as a forkpool worker."
        OPTIONS.each do |name, field, kind, help|
          o.on("--#{name} VALUE", help) { |v| limits[field] = convert(name, v, kind) }
        end
        o.on("--no-access-log", "no access-log line per request on stderr") { access_log = false }
        o.on("--chdir DIR", "change to DIR before loading the app") { |d| chdir = d }
        o.on("-I DIR", "add DIR to the load path") { |d| $LOAD_PATH.unshift(File.expand_path(d)) }
      end
      rest = parser.parse(argv)
      abort "forkpool-rack: one config.ru at most, got #{rest.join(' ')}\nusage: #{USAGE}" if rest.size > 1
      [rest.first || "config.ru", limits, access_log, chdir]
    rescue OptionParser::ParseError, ArgumentError => e
      abort "forkpool-rack: #{e.message}\nusage: #{USAGE}"
    end

    # `value` as a number > 0 (0 allowed for the keep-alive turn).
    def convert(name, value, kind)
      number = kind == :Float ? Float(value) : Integer(value, 10)
      return number if number.positive? || (number.zero? && name == "keepalive-turn")

      raise ArgumentError, "--#{name} must be greater than 0, got #{value}"
    end

    # Loads the app of `path` as rackup does (Rack 2 and 3).
    def load_app(path)
      unless File.file?(path)
        abort "forkpool-rack: no #{path} in #{Dir.pwd}: name the config.ru, or pass --chdir DIR"
      end
      app = ::Rack::Builder.parse_file(path)
      app.is_a?(Array) ? app.first : app
    end

    # Applies the handler's options (symbols or strings, values as text).
    def limits_from(options)
      limits = HTTP::Limits.defaults
      OPTIONS.each do |name, field, kind, _help|
        value = options[name.tr("-", "_").to_sym] || options[name.to_sym]
        limits[field] = convert(name, value.to_s, kind) unless value.nil?
      end
      limits
    end

    def main(argv)
      path, limits, access_log, chdir = parse(argv)
      Dir.chdir(chdir) if chdir
      # Loaded before the worker says ready: under --preload, once, in the
      # template, and a broken app shows as a start-up failure.
      app = load_app(path)
      begin
        worker = Worker.from_env
      rescue ArgumentError => e
        abort "forkpool-rack: #{e.message}"
      end
      RackServer.new(app, worker, limits, access_log: access_log).serve
    end
  end
end
