# frozen_string_literal: true

# Unit tests of Forkpool::Board on a file mapped like the scoreboard (the
# file's pages are the mapping's: a write to the file is what the
# supervisor's store would be). Run: ruby -I clients/ruby clients/ruby/test/board_test.rb
# (crates/forkpool-cli/tests/kernel_ruby.rs tests the rest of the record
# the same way, from Rust).

require "minitest/autorun"
require "tempfile"
require "forkpool/board"

class BoardTest < Minitest::Test
  SLOTS = 4
  SLOT = 2

  def setup
    @file = Tempfile.new("forkpool-board")
    words = ["fkpbrd01".unpack1("Q<"), SLOTS] + [0] * (6 + 4 * SLOTS)
    @file.write(words.pack("Q<*").ljust(4096, "\0"))
    @file.flush
  end

  def teardown
    @board&.release
    @file.close!
  end

  def write_word(word, value)
    @file.pwrite([value].pack("Q<"), 8 * word)
  end

  # Words 3 and 4 say one connection waits on the overflow: only word 5,
  # the dispatch bound, can keep slot 2 from looking there.
  def test_a_slot_at_or_beyond_the_dispatch_bound_does_not_look_at_the_overflow
    write_word(3, 3)
    write_word(4, 2)
    @board = Forkpool::Board.new(@file.fileno, SLOT)
    seen = [0, 4, 3, 2, 1, 0].map do |bound|
      write_word(5, bound)
      [bound, @board.overflow_may_wait?]
    end
    assert_equal [[0, true], [4, true], [3, true], [2, false], [1, false], [0, true]], seen,
                 "0 is no bound; a bound above the slot lets it look"
    write_word(4, 3)
    write_word(5, 3)
    refute @board.overflow_may_wait?, "within the width, nothing waits"
  end
end
