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

  # Only word 5, the dispatch bound, keeps slot 2 from looking at the
  # overflow; words 3 and 4 (the overflow's counts) are not read.
  def test_a_slot_at_or_beyond_the_dispatch_bound_does_not_look_at_the_overflow
    [true, false].each { |buffer| check_the_bound(buffer) }
  end

  # The counts and the state, as the supervisor reads them, through an
  # IO::Buffer mapping and through the Fiddle pointer alike; each starts
  # from what the record held.
  def test_the_record_reads_as_stored
    [true, false].each do |buffer|
      write_word(8 + 4 * SLOT + 1, 7)
      board = Forkpool::Board.new(@file.fileno, SLOT, buffer: buffer)
      board.took!
      board.took_next!
      board.served!
      record = @file.pread(32, 8 * (8 + 4 * SLOT)).unpack("Q<4")
      assert_equal [0, 9, 1, 1], record, "busy, taken 7+2, served 1, taken next 1 (buffer: #{buffer})"
      refute board.idle!, "nobody waits (buffer: #{buffer})"
      assert_equal 1, @file.pread(8, 8 * (8 + 4 * SLOT)).unpack1("Q<"), "idle (buffer: #{buffer})"
      write_word(2, 1)
      assert board.idle!, "the supervisor waits (buffer: #{buffer})"
      board.busy!
      assert_equal 0, board.state
      write_word(2, 0)
      (8 + 4 * SLOT).upto(8 + 4 * SLOT + 3) { |word| write_word(word, 0) }
      board.release
    end
  end

  def check_the_bound(buffer)
    write_word(3, 3)
    write_word(4, 0)
    @board&.release
    @board = Forkpool::Board.new(@file.fileno, SLOT, buffer: buffer)
    seen = [0, 4, 3, 2, 1, 0].map do |bound|
      write_word(5, bound)
      [bound, @board.within_width?]
    end
    assert_equal [[0, true], [4, true], [3, true], [2, false], [1, false], [0, true]], seen,
                 "0 is no bound; a bound above the slot lets it look (buffer: #{buffer})"
  end
end
