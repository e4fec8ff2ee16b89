# frozen_string_literal: true

require_relative "binary_input"

module Forkpool
  # `rack.input` of a request without a body: always at its end. It holds
  # no state, so one serves every such request (no LazyInput, no buffer).
  class NullInput
    include BinaryInput

    # nil at the end, as IO#gets.
    def gets(*)
      nil
    end

    # As IO#read at the end: "" without a length (or 0), nil with one; a
    # given buffer is emptied.
    def read(length = nil, buffer = nil)
      buffer&.clear
      return nil if length&.positive?

      buffer || "".b
    end

    def each
      return to_enum(:each) unless block_given?

      self
    end

    def rewind
      0
    end

    def size
      0
    end

    # Nothing to close; the app may still call it.
    def close
      nil
    end

    def loaded?
      true
    end

    def failed?
      false
    end
  end
end
