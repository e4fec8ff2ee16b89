# frozen_string_literal: true

require "rack"
require "forkpool/rack_cli"

module Rack
  module Handler
    # `rackup -s forkpool config.ru`, run under `forkpool run`: rackup
    # loads the app, this serves it as a forkpool worker. forkpool-rack's
    # options are given as `-O name=value` (`-O keepalive_turn=0`,
    # `-O access_log=false`); rackup's Host and Port are not used: the
    # listeners are forkpool's (`forkpool run --listen`).
    module Forkpool
      def self.run(app, **options)
        worker = ::Forkpool::Worker.from_env
        limits = ::Forkpool::RackCLI.limits_from(options)
        access_log = !%w[false 0 no].include?(options.fetch(:access_log, "true").to_s)
        server = ::Forkpool::RackServer.new(app, worker, limits, access_log: access_log)
        yield server if block_given?
        server.serve
      end

      def self.valid_options
        ::Forkpool::RackCLI::OPTIONS.to_h do |name, _field, _kind, help|
          ["#{name.tr('-', '_')}=VALUE", help]
        end.merge("access_log=false" => "no access-log line per request")
      end
    end

    register "forkpool", "Rack::Handler::Forkpool"
  end
end
