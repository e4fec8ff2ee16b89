# frozen_string_literal: true

# The worker side of `kernel` dispatch (docs/protocol.md, "`kernel`
# dispatch"): the kernel queues each connection on the socket of the lowest
# idle slot, and the worker keeps its own record on the scoreboard instead
# of reporting busy and idle. It says `K` instead of `R`, waits on its own
# sockets and the channel, takes the next connection waiting on the
# overflow (the pool's listeners) as it finishes one, and sends `I` only
# when the supervisor, holding connections, asks for it on the board.
# Given FORKPOOL_MAX_REQUESTS, it leaves (`X`) after that many connections,
# still busy on the board, so nothing more is queued for it.

require_relative "board"

module Forkpool
  class Worker
    # Supervisor-to-worker messages in `kernel` dispatch.
    KERNEL_PAYLOAD = { "C" => 2, "p" => 4, "Q" => 0 }.freeze

    # The listeners where connections wait for a worker: in `kernel`
    # dispatch the pool's (the overflow), not this worker's own sockets.
    # A kept-alive connection gives way when one of these is readable.
    def pool_listeners
      @overflow || @listeners
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

    # Step 3 of "The worker's life": idle, then wait on the own sockets and
    # the channel (Worker#wait_on_listeners).
    def serve_on_board(handle)
      @board.idle!
      wait_on_listeners(handle)
    end

    # Own socket `listener` is readable: the kernel queued a connection
    # for this worker. Nothing there (a client gone): wait again, say
    # nothing.
    def take_own(listener, handle)
      conn = accept(listener)
      return if conn.nil?

      @board.busy!
      @board.took!
      serve_connections(conn, listener, handle)
    end

    # Acts on one message; false when it is time to exit.
    def take_board_message(handle)
      message = receive(KERNEL_PAYLOAD)
      return false if message.nil?

      kind, payload, ios = message
      case kind
      when "p" then send_message("P", payload)
      when "Q"
        drain_own_sockets(handle)
        return false
      when "C" # the supervisor claimed this worker on the board already
        listener = payload.unpack1("n")
        serve_connections(connection(ios.first, listener), listener, handle)
      end
      true
    end

    # Finishes a connection (see Worker#serve_connections): the next
    # connection waiting on the overflow is served in turn; with none, the
    # worker goes idle (and says `I` if the board asks) before the
    # connection is closed, so a client that reconnects at once finds this
    # worker idle. Its share served, it leaves, still busy on the board.
    def finish_on_board(listener)
      @board.served!
      @served_here += 1
      leave if @served_here == @max_requests
      if @leaving
        @board.busy!
        say_leaving
        return nil
      end
      following = take_overflow(listener)
      if following
        @board.took_next!
      elsif @board.idle!
        send_message("I")
      end
      following
    end

    # The next connection waiting on overflow listener `listener`, unless
    # the supervisor has a message first. One select asks about both, and
    # the accept is tried only when the listener has something.
    def take_overflow(listener)
      ready, = IO.select([@channel, @overflow[listener]], nil, nil, 0)
      return nil if ready.nil? || ready.include?(@channel)

      accept_from(@overflow[listener])
    end

    # On `Q`: busy, then serve what the kernel queued on the own sockets
    # before it saw the state change, until every accept finds nothing.
    def drain_own_sockets(handle)
      @board.busy!
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
