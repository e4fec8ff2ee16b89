# frozen_string_literal: true

module Forkpool
  # What every `rack.input` of forkpool-rack says of its encoding: a body
  # is bytes, whatever the app's default encoding.
  module BinaryInput
    def external_encoding
      Encoding::ASCII_8BIT
    end

    def binmode?
      true
    end
  end
end
