# frozen_string_literal: true

# The worker side of `kernel` dispatch (docs/protocol.md, "`kernel`
# dispatch"): the kernel queues each connection on the socket of the lowest
# idle slot, and the worker keeps its own record on the scoreboard instead
# of reporting busy and idle. It says `K` instead of `R`, waits on its own
# sockets and the channel, takes the next connection waiting on the
# overflow (the pool's listeners) as it finishes one, and sends `I` only
# when the supervisor, holding connections, asks for it on the board.
# Given FORKPOOL_MAX_REQUESTS, it leaves (`X`) after that many connections,
# still busy on the board, so nothing more is queued for it; given
# FORKPOOL_MAX_CHILD_MEMORY or FORKPOOL_MAX_CHILD_LIFETIME_MS (WorkerLimits), it
# leaves the same way after the connection that took it past one, and
# then waits for the supervisor to let it go. A worker forked
# by a template (`--preload`) gets its own sockets, the board and its share
# in `S` after its `K`, and gives them up when it becomes the template.

require_relative "board"
require_relative "limits"

module Forkpool
  class Worker
    # What a worker forked by a template reads before its seat.
    SEAT_PAYLOAD = { "S" => 10, "p" => 4, "Q" => 0 }.freeze

    # The listeners where connections wait for a worker: in `kernel`
    # dispatch the pool's (the overflow), not this worker's own sockets.
    # A kept-alive connection gives way when one of these is readable.
    def pool_listeners
      @overflow || @listeners
    end

    # The connection being served ends with the response about to go out
    # (a server calls this just before the write that completes it, when
    # that write will not wait for the client): in kernel dispatch the worker goes idle now, not after it has closed
    # the connection, so that a client that reconnects the moment it has
    # the answer (as one told `Connection: close` does) finds this worker
    # idle and lands on it again, on the CPU it shares with it, rather than
    # on a cold one. Not when something may wait on the overflow (the
    # finish takes it), nor when the worker leaves after this connection
    # (told to, its share served, or past its memory or lifetime limit); a
    # no-op outside kernel dispatch.
    # The look at the overflow is the finish's: when it sees a connection
    # there and no message, the finish takes it without looking again.
    def ending_connection
      return if @board.nil? || @idle_early || @headroom_checked

      check_headroom
      check_limits
      @headroom_checked = true
      return if @leaving
      return if @max_requests.positive? && @served_here + 1 >= @max_requests

      if @board.within_width? && connection_waiting?(@overflow[@serving])
        @next_seen = true
        return
      end
      @idle_early = true
      send_message("I") if @board.idle!
    end

    private

    # FORKPOOL_BOARD_FD mapped and checked, and the overflow listeners:
    # after the channel, the n overflow listeners, then the board.
    def init_kernel(env)
      first = Integer(required(env, "FORKPOOL_OVERFLOW_FD"))
      board = Integer(required(env, "FORKPOOL_BOARD_FD"))
      if first != @channel.fileno + 1 || board != first + @listeners.size
        raise ArgumentError, "FORKPOOL_OVERFLOW_FD=#{first} and FORKPOOL_BOARD_FD=#{board} do not follow " \
                             "the channel #{@channel.fileno} and #{@listeners.size} listener(s): " \
                             "use a forkpool of the same version as this helper"
      end
      @board = Board.new(board, @slot)
      @overflow = Array.new(@listeners.size) { |i| listener_at(first + i) }
      @max_requests = Integer(env.fetch("FORKPOOL_MAX_REQUESTS", "0"))
      @served_here = 0
    end

    # A worker forked by a template, after its `K`: waits for `S`
    # (answering pings); true once seated, false on `Q` or end of file.
    def take_seat
      loop do
        message = receive(SEAT_PAYLOAD)
        return false if message.nil?

        kind, payload, ios = message
        case kind
        when "p" then send_message("P", payload)
        when "Q" then return false
        when "S" then return sit(payload, ios)
        end
      end
    end

    # `S`: the slot's own sockets (the listeners from now on; the pool's,
    # inherited from the template, are the overflow), the board, the share.
    def sit(payload, ios)
      count, max_requests = payload.unpack("nQ>")
      if count != @listeners.size
        ios.each(&:close)
        raise ProtocolError, "S brought #{count} own socket(s) for #{@listeners.size} listener(s)"
      end
      *own, @board_io = ios
      @overflow = @listeners
      @listeners = own.map { |sock| nonblocking(as_tcp_server(sock)) }
      @board = Board.new(@board_io.fileno, @slot)
      @max_requests = max_requests
      @served_here = 0
      true
    end

    # Refork: busy, the own sockets and the board given up; the pool's
    # listeners are the listeners again, as a template has them.
    def leave_board
      @board.busy!
      @board.release
      @board_io&.close
      @listeners.each(&:close)
      @listeners = @overflow
      @overflow = @board = @board_io = nil
    end

    # Step 3 of "The worker's life": idle, then wait on the own sockets and
    # the channel (Worker#wait_on_listeners).
    def serve_on_board(handle)
      @board.idle!
      wait_on_listeners(handle)
      await_release if @past_limit
    end

    # After a connection, before the worker would go idle: past its memory
    # or lifetime limit, it leaves (busy, `X`) instead.
    def check_limits
      return if @limit_check.nil? || @leaving

      @past_limit = @limit_check.past
      @leaving = true if @past_limit
    end

    # After its `X` for a limit: reads the channel until `Q` or end of file
    # (ignoring what the supervisor sent before it read the `X`), so that
    # the supervisor, which reads the worker's memory itself, finds it
    # still there; it shuts its end down once it has.
    def await_release
      loop do
        IO.select([@channel])
        message = receive(@version == 1 ? WORKER_PAYLOAD : WORKER_PAYLOAD_V2)
        return if message.nil? || message[0] == "Q"

        message[2].each(&:close)
      end
    rescue SystemCallError, IOError, ProtocolError
      nil
    end

    # Own socket `listener` is readable: the kernel queued a connection
    # for this worker. Nothing there (a client gone): wait again, say
    # nothing.
    def take_own(listener, handle)
      conn = accept(listener)
      if conn.nil?
        if @leaving # out of descriptors: busy, so nothing more is queued here
          @board.busy!
          say_leaving
        end
        return
      end

      @board.busy!
      @board.took!
      serve_connections(conn, listener, handle)
    end

    # Finishes a connection (see Worker#serve_connections): the next
    # connection waiting on the overflow is served in turn; with none, the
    # worker goes idle (and says `I` if the board asks) before the
    # connection is closed, so a client that reconnects at once finds this
    # worker idle. Its share served, it leaves, still busy on the board.
    # Idle already (#ending_connection), it only counts the connection.
    def finish_on_board(listener)
      @board.served!
      @served_here += 1
      idle_early = @idle_early
      @idle_early = false
      seen = @next_seen
      @next_seen = false
      leave if @served_here == @max_requests
      if @leaving
        @board.busy!
        say_leaving
        return nil
      end
      return nil if idle_early

      following = take_overflow(listener, seen)
      if following.nil? && @leaving # out of descriptors
        @board.busy!
        say_leaving
        return nil
      end
      if following
        @board.took_next!
      elsif @board.idle!
        send_message("I")
      end
      following
    end

    # The next connection waiting on overflow listener `listener`, unless
    # the supervisor has a message first. Nothing is asked when this slot
    # is outside the dispatch width (word 5: the worker goes idle, and the
    # kernel gives it nothing new either); else one look asks about both
    # (Worker#connection_waiting?), and the accept is tried only when the
    # listener has something. `seen`: #ending_connection's look saw a
    # connection there and no message, so it is not asked again.
    #
    # Word 4 is left alone: Ruby has no atomic add of its own, and one
    # through Fiddle costs three times the instructions of this look, on
    # nearly every connection under load (when most are taken here). The
    # words then never say that nothing waits, so neither does this helper
    # read them: it looks (protocol.md, step 6).
    def take_overflow(listener, seen)
      return nil unless @board.within_width?

      return nil unless seen || connection_waiting?(@overflow[listener])

      accept_from(@overflow[listener])
    end

    # On `Q`: busy, then serve what the kernel queued on the own sockets
    # before it saw the state change, until every accept finds nothing.
    def drain_own_sockets(handle)
      @board.busy!
      # Leaving: no early idle (#ending_connection) while it drains, and a
      # server closes what it serves now.
      @leaving = true
      @listeners.each_with_index do |sock, listener|
        while (conn = accept_from(sock))
          @board.took!
          begin
            handle.call(conn, listener)
            @board.served!
          ensure
            conn.close unless conn.closed?
          end
        end
      end
    end
  end
end
