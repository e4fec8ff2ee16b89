# frozen_string_literal: true

# Serve connections as a forkpool worker, in Ruby (standard library only).
#
#   require "forkpool/worker"
#
#   Forkpool::Worker.from_env.serve do |conn, listener|
#     conn.read_nonblock(4096, exception: false)
#     conn.write("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n")
#   end
#
# `forkpool run -- ruby my_worker.rb` starts the program once per slot;
# `forkpool run --preload -- ruby my_worker.rb` starts it once, as a
# template, and forks every worker from it (protocol version 2). The same
# program runs unchanged either way: everything before `serve` runs once,
# in the template, and the object `from_env` returned turns into each
# forked worker (and, on a refork, a worker turns into the template).
#
# The block gets a connected socket and the index of the listener it came
# on, once per connection; the worker closes the socket after the block
# returns. An exception in the block ends the worker (its backtrace goes to
# stderr, which the supervisor logs with the slot); the supervisor starts
# another. `worker.leave` asks to exit after the current connection; the
# worker also leaves by itself when its descriptor table fills (a leak).
#
# Every dispatch mode: `handoff` (connections arrive over the back-channel
# with SCM_RIGHTS), `order` (accept when told), `shared`/`herd` (wait on
# the listeners; Ruby has no epoll, so every idle worker wakes for each
# connection, as in `herd`), `kernel` (wait on the slot's own socket and
# keep the record on the scoreboard: forkpool/kernel_dispatch.rb). The
# wire format is docs/protocol.md.

require "socket"
require "fcntl"
require "io/wait"
require_relative "libc"
require_relative "stack_dump"

module Forkpool
  PROTOCOL_VERSION = 1
  # Version 2: version 1 plus templates (`forkpool run --preload`).
  TEMPLATE_PROTOCOL_VERSION = 2
  LISTEN_FDS_START = 3
  # Longer than any message, so an oversized one shows as MSG_TRUNC.
  RECV_SIZE = 16
  # Room for the control data of a message: the two descriptors of an F
  # and more (more than expected shows as MSG_CTRUNC or a count refused).
  # Given, so Ruby's recvmsg does not first peek at each message to size
  # it (a second recvmsg, and a close of the descriptors the peek got).
  CONTROL_SIZE = 64
  # Supervisor-to-worker messages: kind => payload length.
  WORKER_PAYLOAD = { "C" => 2, "A" => 2, "p" => 4, "Q" => 0 }.freeze
  WORKER_PAYLOAD_V2 = WORKER_PAYLOAD.merge("T" => 0).freeze
  # Supervisor-to-template messages.
  TEMPLATE_PAYLOAD = { "F" => 8, "p" => 4, "Q" => 0 }.freeze

  # The interpreter's own descriptors, as they were when this file was
  # loaded: Ruby's VM keeps eventfds (and, elsewhere, pipes) for its
  # threads and signals, made before the program runs. A forked worker
  # never closes these: closing them aborts the interpreter at its next
  # signal. Files are not among them (a file open now is one being
  # `require`d, closed soon, its number reused by the program).
  BOOT_FDS = Dir.children("/proc/self/fd").each_with_object({}) do |name, fds|
    target = File.readlink("/proc/self/fd/#{name}")
    fds[name.to_i] = target if target.start_with?("anon_inode:", "pipe:")
  rescue SystemCallError
    nil
  end.freeze

  # The supervisor sent something this worker does not understand.
  class ProtocolError < StandardError; end

  # Descriptors kept free below the soft RLIMIT_NOFILE (at most a quarter
  # of it): once the one at the reserve's start is open, the worker leaves
  # after its connection (docs/protocol.md, "Running out of descriptors").
  DESCRIPTOR_RESERVE = 32
  # fcntl's "a copy at the lowest free number at or above", close-on-exec
  # (Linux; Ruby's Fcntl does not name it).
  F_DUPFD_CLOEXEC = 1030
  # An accept failing with one of these: this process is out of
  # descriptors or memory, and a retry would fail again at once.
  EXHAUSTED = [Errno::EMFILE, Errno::ENFILE, Errno::ENOBUFS, Errno::ENOMEM].freeze

  # The supervisor sent T: this worker is the pool's template now.
  class BecomeTemplate < StandardError
    attr_reader :io

    def initialize(io)
      super("become the template")
      @io = io
    end
  end

  # One worker process's end of the back-channel and its listeners; under
  # --preload, first the template's (see forkpool/template.rb).
  class Worker
    attr_reader :slot, :pid, :generation, :dispatch, :listeners, :channel, :version,
                :supervisor_pid

    class << self
      # Runs the block in every worker just before it says Ready: right
      # after the fork under --preload, at start-up otherwise. Reopen
      # database connections, log files and sockets here.
      def after_fork(&block)
        hooks[:after_fork] << block
        block
      end

      # Runs the block in the template before each fork (close a database
      # connection the workers must not share). Never runs without
      # --preload: there is no fork then.
      def before_fork(&block)
        hooks[:before_fork] << block
        block
      end

      def hooks
        @hooks ||= { after_fork: [], before_fork: [] }
      end

      # The back-channel (or template channel) and listeners `forkpool run`
      # passed. Raises ArgumentError, naming the fix, when the program was
      # not started by `forkpool run` or the environment is inconsistent.
      def from_env(env = ENV)
        new(env)
      end
    end

    def initialize(env)
      @pid = Process.pid
      @leaving = false
      @headroom_checked = false # for the connection being served (#ending_connection)
      dispatch = required(env, "FORKPOOL_DISPATCH")
      # Kernel dispatch is announced as handoff plus FORKPOOL_KERNEL_DISPATCH=1,
      # so that a worker written before it serves as in handoff.
      dispatch = "kernel" if dispatch == "handoff" && env["FORKPOOL_KERNEL_DISPATCH"] == "1"
      if dispatch == "none"
        raise ArgumentError, "the pool runs with --dispatch none, which has no back-channel: " \
                             "accept on the LISTEN_FDS listeners directly instead"
      end
      @dispatch = dispatch
      # Kernel dispatch: the memory and lifetime limits the worker checks
      # after each connection (a template's workers inherit them).
      @limits = WorkerLimits.from_env(env) if dispatch == "kernel"
      @listeners = listeners_from(env)
      @generation = Integer(required(env, "FORKPOOL_GENERATION"))
      if env.key?("FORKPOOL_TEMPLATE_FD")
        init_template(env)
      else
        init_worker(env)
      end
    end

    def template?
      @template
    end

    # Asks to exit after the current connection: the worker says Leaving
    # (X) instead of Idle, and the supervisor starts a replacement.
    def leave
      @leaving = true
    end

    def leaving?
      @leaving
    end

    # True when a message (or end of file) from the supervisor waits,
    # within `timeout` seconds.
    def channel_waiting?(timeout = 0)
      !IO.select([@channel], nil, nil, timeout).nil?
    end

    # Says Ready, then serves until told to quit or the supervisor is gone;
    # returns in both cases. Under --preload, forks a worker for each order
    # and returns in the template when it is told to quit; each worker runs
    # the block.
    def serve(&handle)
      raise ArgumentError, "serve needs a block: serve { |conn, listener| ... }" unless handle

      loop do
        if @template
          return unless serve_orders # true: this process is a new worker
        else
          begin
            serve_as_worker(handle)
            return
          rescue BecomeTemplate => e
            become_template(e.io)
          end
        end
      end
    end

    private

    def required(env, name)
      env.fetch(name) do
        raise ArgumentError, "#{name} is not set: run this program under " \
                             "`forkpool run [--preload] ... -- ruby PROGRAM`"
      end
    end

    def listeners_from(env)
      return [] unless env.key?("LISTEN_FDS")

      if Integer(required(env, "LISTEN_PID")) != Process.pid
        raise ArgumentError, "LISTEN_PID names another process: the listeners were passed " \
                             "to a parent (a shell wrapper that forks instead of exec'ing?)"
      end
      Array.new(Integer(env["LISTEN_FDS"])) { |i| listener_at(LISTEN_FDS_START + i) }
    end

    # Socket.for_fd leaves the descriptor's flags alone. The listeners'
    # open file is shared with the supervisor and every other worker, and
    # Ruby's accept_nonblock sets O_NONBLOCK on the listener when it is not
    # set: harmless only because the supervisor made it non-blocking.
    # Refuse to start on a blocking one rather than change it for all.
    #
    # A TCP listener is a TCPServer: its accept makes no Addrinfo, which
    # costs Socket#accept a getsockopt (SO_TYPE) and two objects on every
    # connection.
    def listener_at(fd)
      sock = Socket.for_fd(fd)
      sock.autoclose = false
      sock.close_on_exec = true
      sock = TCPServer.for_fd(fd).tap { |server| server.autoclose = false } if tcp?(sock)
      nonblocking(sock)
    end

    # `sock` made a TCPServer when it is a TCP socket (the server then owns
    # the descriptor, as `sock` did).
    def as_tcp_server(sock)
      return sock unless tcp?(sock)

      server = TCPServer.for_fd(sock.fileno)
      server.autoclose = sock.autoclose?
      server.close_on_exec = true
      sock.autoclose = false
      server
    end

    def tcp?(sock)
      sock.local_address.ip? && sock.getsockopt(Socket::SOL_SOCKET, Socket::SO_TYPE).int == Socket::SOCK_STREAM
    rescue SystemCallError, SocketError
      false
    end

    # `sock`, checked to be non-blocking.
    def nonblocking(sock)
      if (sock.fcntl(Fcntl::F_GETFL) & File::NONBLOCK).zero?
        raise ArgumentError, "listener #{sock.fileno} is blocking: forkpool passes non-blocking listeners " \
                             "in every mode with a back-channel; something cleared O_NONBLOCK"
      end
      sock
    end

    def channel_at(fd, what)
      count = @listeners.size
      if fd != LISTEN_FDS_START + count
        raise ArgumentError, "#{what} is #{fd}, but with #{count} listener(s) it must be " \
                             "#{LISTEN_FDS_START + count}"
      end
      sock = Socket.for_fd(fd)
      sock.autoclose = false
      sock.close_on_exec = true
      if sock.getsockopt(Socket::SOL_SOCKET, Socket::SO_TYPE).int != Socket::SOCK_SEQPACKET
        raise ArgumentError, "descriptor #{fd} is not the back-channel"
      end
      sock
    end

    def init_worker(env)
      @template = false
      version = required(env, "FORKPOOL_PROTOCOL")
      unless [PROTOCOL_VERSION.to_s, TEMPLATE_PROTOCOL_VERSION.to_s].include?(version)
        raise ArgumentError, "the supervisor speaks back-channel protocol #{version}, this " \
                             "helper speaks #{PROTOCOL_VERSION} and #{TEMPLATE_PROTOCOL_VERSION}"
      end
      @version = Integer(version)
      @slot = Integer(required(env, "FORKPOOL_SLOT"))
      @channel = channel_at(Integer(required(env, "FORKPOOL_CHANNEL_FD")), "FORKPOOL_CHANNEL_FD")
      @supervisor_pid = env["FORKPOOL_SUPERVISOR_PID"]&.to_i
      init_kernel(env) if @dispatch == "kernel"
    end

    # -- the worker loop ------------------------------------------------------

    def serve_as_worker(handle)
      Random.srand # a forked worker must not repeat the template's sequence
      self.class.hooks[:after_fork].each(&:call)
      # After the hooks: the program may have changed its limit.
      @fd_limit, = Process.getrlimit(:NOFILE)
      @fd_ceiling = (@fd_limit - [DESCRIPTOR_RESERVE, @fd_limit / 4].min if @fd_limit != Process::RLIM_INFINITY)
      # Its lifetime counts from here, its K.
      @limit_check = @limits&.start
      send_message(@dispatch == "kernel" ? "K" : "R", [@pid].pack("N"))
      case @dispatch
      when "kernel"
        # Forked by a template, the worker gets its seat (its own sockets
        # and the board) on the channel.
        serve_on_board(handle) if @board || take_seat
      when "handoff", "order"
        nil while take_message(handle) && !@leaving
      when "shared", "herd"
        wait_on_listeners(handle)
      else
        raise ProtocolError, "unknown dispatch mode #{@dispatch.inspect}"
      end
    rescue Errno::EPIPE, Errno::ECONNRESET
      nil # the supervisor is gone: treat as end of file
    end

    def send_message(kind, payload = "")
      @channel.sendmsg("#{@version.chr}#{kind}#{payload}".b)
    end

    # One message: [kind, payload, io or nil], or nil at end of file.
    def receive(known)
      data, _addr, rflags, *controls = @channel.recvmsg(RECV_SIZE, 0, CONTROL_SIZE + 4 * @listeners.size,
                                                        scm_rights: true)
      ios = controls.flat_map { |c| c.cmsg_is?(:SOCKET, :RIGHTS) ? c.unix_rights || [] : [] }
      return nil if data.empty? && ios.empty?

      check_message(data, rflags, ios, known)
      [data[1], data.byteslice(2..), ios]
    rescue ProtocolError
      ios&.each(&:close)
      raise
    end

    def check_message(data, rflags, ios, known)
      if (rflags & (Socket::MSG_TRUNC | Socket::MSG_CTRUNC)).nonzero?
        raise ProtocolError, "a message or its descriptors were cut short"
      end
      raise ProtocolError, "protocol version #{data.getbyte(0)} is not supported" if data.getbyte(0) != @version

      kind = data[1]
      raise ProtocolError, "malformed message #{data.inspect}" if known[kind] != data.bytesize - 2

      wanted = { "C" => 1, "T" => 1, "F" => 2, "S" => @listeners.size + 1 }.fetch(kind, 0)
      raise ProtocolError, "#{data.inspect} came with #{ios.size} descriptor(s)" if ios.size != wanted
    end

    # Acts on one message; false when it is time to exit.
    def take_message(handle)
      message = receive(@version == 1 ? WORKER_PAYLOAD : WORKER_PAYLOAD_V2)
      return false if message.nil?

      kind, payload, ios = message
      case kind
      when "p" then send_message("P", payload)
      when "Q"
        drain_own_sockets(handle) if @board
        return false
      when "T" then raise BecomeTemplate, ios.first
      when "C" # in kernel dispatch, the supervisor claimed this worker on the board
        expect_mode(kind, %w[handoff kernel], ios)
        listener = payload.unpack1("n")
        serve_connections(connection(ios.first, listener), listener, handle)
      when "A"
        expect_mode(kind, %w[order], ios)
        listener = payload.unpack1("n")
        raise ProtocolError, "told to accept on unknown listener #{listener}" if listener >= @listeners.size

        accept_and_serve(listener, handle)
      end
      true
    end

    def expect_mode(kind, modes, ios)
      return if modes.include?(@dispatch)

      ios.each(&:close)
      raise ProtocolError, "#{kind.inspect} is not expected in #{@dispatch} mode"
    end

    # The received IO as a Socket (it is a connected stream socket; Ruby
    # makes a received socket a Socket already, close-on-exec: it receives
    # with MSG_CMSG_CLOEXEC).
    def connection(io, _listener)
      return io if io.is_a?(Socket)

      io.autoclose = false
      fd = io.fileno
      sock = Socket.for_fd(fd)
      sock.close_on_exec = true
      sock
    end

    def accept_and_serve(listener, handle)
      conn = accept(listener)
      if conn.nil?
        send_message("M") # another worker was faster, or accept failed
        say_leaving if @leaving # out of descriptors
        return
      end
      send_message("B")
      serve_connections(conn, listener, handle)
    end

    # One waiting connection from `listener`, or nil. Never waits.
    def accept(listener)
      accept_from(@listeners[listener])
    end

    # One waiting connection from listening socket `sock`, or nil (a
    # TCPServer's accept returns the socket alone, a Socket's an array).
    def accept_from(sock)
      conn = sock.accept_nonblock(exception: false)
      return nil if conn == :wait_readable

      conn.is_a?(Array) ? conn.first : conn
    rescue Errno::ECONNABORTED, Errno::EPROTO
      nil # gone before it was taken
    rescue *EXHAUSTED => e
      warn "forkpool worker: accept failed: #{e.message}: this worker is out of descriptors or " \
           "memory (does the app leak them? else raise ulimit -n / LimitNOFILE); it leaves, " \
           "the connection waits for a fresh one"
      @leaving = true
      nil
    rescue SystemCallError => e
      warn "forkpool worker: accept failed: #{e.message}"
      nil
    end

    # After a connection (and, in a server that keeps connections alive,
    # every few requests): leave when the descriptor at the start of the
    # reserve below RLIMIT_NOFILE is open. Descriptors are taken lowest
    # first, so the table has filled up to there: an app that leaks them
    # would soon fail its own opens, or this worker an accept.
    def check_headroom
      return if @fd_ceiling.nil? || @leaving || ceiling_free?

      warn "forkpool worker: descriptor #{@fd_ceiling} is open, with RLIMIT_NOFILE at #{@fd_limit}: " \
           "this worker is running out of descriptors (does the app leak them? else raise " \
           "ulimit -n / LimitNOFILE); it leaves after this connection and the supervisor starts a fresh one"
      @leaving = true
    end
    public :check_headroom

    # Whether descriptor @fd_ceiling is free. A copy of the channel asked
    # for at or above it is given the lowest free number there: the
    # ceiling itself exactly when it is free. The copy is closed at once,
    # through a socket object (an IO would read its flags and ask whether
    # it is a terminal as well: a BasicSocket makes one fstat). Three
    # system calls, yet a third of the instructions of one fcntl(F_GETFD)
    # through Fiddle, whose failure (EBADF) is what a healthy worker gets.
    def ceiling_free?
      copy = @channel.fcntl(F_DUPFD_CLOEXEC, @fd_ceiling)
      BasicSocket.for_fd(copy).close
      copy == @fd_ceiling
    rescue SystemCallError # EMFILE: nothing free at or above it
      false
    end

    def serve_connections(conn, listener, handle)
      while conn
        following = nil
        begin
          @serving = listener
          handle.call(conn, listener)
          following = finish(listener)
        rescue Exception # rubocop:disable Lint/RescueException
          following&.close
          raise
        ensure
          conn.close unless conn.closed?
        end
        conn = following
      end
    end

    # After a connection on `listener`, before its close: the next
    # connection to serve, or nil.
    def finish(listener)
      unless @headroom_checked # (else in #ending_connection)
        check_headroom
        check_limits if @board
      end
      @headroom_checked = false
      return finish_on_board(listener) if @board

      # A leaving worker does not report Idle: the supervisor could hand
      # it a connection before it sees the exit. It says Leaving, so the
      # exit counts as a retirement, not a death.
      if @leaving
        say_leaving
        return nil
      end
      following = take_next(listener)
      if following.nil? && @leaving # out of descriptors
        say_leaving
        return nil
      end
      # The report goes before the close: a client that reconnects at
      # once then finds this (hot) worker idle.
      send_message(following ? "N" : "I")
      following
    end

    def say_leaving
      send_message("X")
    rescue SystemCallError
      nil # the supervisor is gone; the exit says enough
    end

    # `handoff`: the next connection already waiting on `listener`, or nil.
    # A message from the supervisor goes first (Quit or Ping is read after
    # reporting Idle). The accept is tried only when the listener has
    # something (most of the time another worker or the supervisor took it
    # already, and an accept that fails costs two system calls in Ruby).
    def take_next(listener)
      return nil if @dispatch != "handoff" || listener >= @listeners.size
      return nil unless connection_waiting?(@listeners[listener])

      accept(listener)
    end

    # Whether a connection waits on listening socket `sock` and no
    # message from the supervisor (which goes first), looked at without
    # waiting. A poll of each descriptor: in Ruby, two cost less than one
    # IO.select of both (whose arrays alone cost more than a poll).
    def connection_waiting?(sock)
      !@channel.wait_readable(0) && !sock.wait_readable(0).nil?
    end

    # `shared`, `herd` and `kernel`: wait on the channel and the listeners
    # at once. The channel goes first when both are ready.
    def wait_on_listeners(handle)
      watched = [@channel] + @listeners
      loop do
        ready, = IO.select(watched)
        if ready.include?(@channel)
          return unless take_message(handle)
        elsif @board
          take_own(@listeners.index(ready.first), handle)
        else
          accept_and_serve(@listeners.index(ready.first), handle)
        end
        return if @leaving
      end
    end
  end
end

require_relative "template"
require_relative "kernel_dispatch"
