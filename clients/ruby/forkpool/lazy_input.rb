# frozen_string_literal: true

require_relative "binary_input"

module Forkpool
  # `rack.input`: the request body, read from the client only when the app
  # first reads it (then whole, by `load`, so that it can rewind as Rack 2
  # asks). So `Expect: 100-continue` is answered only if the app wants the
  # body, and an app that answers without reading it never makes the
  # client send it. An error while reading (a bad chunk, a body too slow)
  # is raised in the app's read.
  class LazyInput
    include BinaryInput

    def initialize(&load)
      @load = load
      @io = nil
    end

    def loaded?
      !@io.nil?
    end

    # True when reading the body failed: what is left of it on the
    # connection cannot be trusted, and the connection must close.
    def failed?
      @failed == true
    end

    def gets(*args)
      io.gets(*args)
    end

    def read(*args)
      io.read(*args)
    end

    def each(&block)
      io.each(&block)
    end

    def rewind
      io.rewind
    end

    def size
      io.size
    end

    def close
      @io&.close
    end

    private

    def io
      return @io if @io
      raise IOError, "the request body could not be read" if @failed

      @failed = true
      @io = @load.call
      @failed = false
      @io
    end
  end
end
