# frozen_string_literal: true

# The template side of Forkpool::Worker (`forkpool run --preload`, protocol
# version 2; docs/protocol.md, "Templates"): wait for Fork orders, fork each
# worker through an intermediate child, and turn the forked process into an
# ordinary worker. Also refork: a worker told T becomes the template.

module Forkpool
  class Worker
    # How long a forked worker waits for its intermediate parent to exit.
    REPARENT_DEADLINE = 5.0

    private

    def init_template(env)
      @template = true
      version = required(env, "FORKPOOL_PROTOCOL")
      if version != TEMPLATE_PROTOCOL_VERSION.to_s
        raise ArgumentError, "FORKPOOL_TEMPLATE_FD is set with protocol #{version}; " \
                             "templates speak protocol #{TEMPLATE_PROTOCOL_VERSION}"
      end
      @version = TEMPLATE_PROTOCOL_VERSION
      @slot = nil
      @supervisor_pid = Integer(required(env, "FORKPOOL_SUPERVISOR_PID"))
      @channel = channel_at(Integer(required(env, "FORKPOOL_TEMPLATE_FD")), "FORKPOOL_TEMPLATE_FD")
    end

    # Answers the supervisor until told to quit (false) or until this
    # process is a newly forked worker (true).
    def serve_orders
      warm_up
      # Ruby's "IGNORE" for SIGCHLD is not the kernel's SIG_IGN: Ruby keeps
      # its own handler and reaps every child itself. Here that is what is
      # wanted (each intermediate is reaped as it exits, no zombie, no
      # waitpid round trip per fork); the intermediate must undo it before
      # it forks the worker (see intermediate).
      @program_sigchld = trap("CHLD", "IGNORE")
      forked = false
      begin
        send_message("R", [@pid].pack("N"))
        loop do
          message = receive(TEMPLATE_PAYLOAD)
          break if message.nil?

          kind, payload, ios = message
          case kind
          when "p" then send_message("P", payload)
          when "Q" then break
          when "F"
            slot, generation = payload.unpack("NN")
            forked = fork_worker(slot, generation, ios)
            break if forked
          end
        end
      rescue Errno::EPIPE, Errno::ECONNRESET
        nil # the supervisor is gone
      ensure
        trap("CHLD", @program_sigchld || "DEFAULT") unless forked
      end
      forked
    end

    # Before the template forks: everything the workers will share should
    # be settled, so no worker copies a page the template later changes
    # and the workers' own first collections have little to do.
    # Process.warmup (Ruby 3.3+) does exactly this; on older Rubies, a
    # full collection and a compaction.
    def warm_up
      if Process.respond_to?(:warmup)
        Process.warmup
      else
        GC.start(full_mark: true, immediate_sweep: true)
        GC.compact if GC.respond_to?(:compact)
      end
    rescue NotImplementedError
      nil # compaction is not supported on this platform
    end

    # The double fork. True in the worker, false in the template.
    def fork_worker(slot, generation, ios)
      self.class.hooks[:before_fork].each(&:call)
      begin
        intermediate = Process.fork
      rescue SystemCallError => e
        send_message("E", [slot, e.errno].pack("NN"))
        ios.each(&:close)
        return false
      end
      if intermediate.nil?
        me = Process.pid
        intermediate(slot)
        become_worker(slot, generation, ios, me)
        return true
      end
      ios.each(&:close)
      false # Ruby reaps the intermediate (SIGCHLD "IGNORE")
    end

    # In the intermediate child: fork the worker and report it. Returns in
    # the worker; the intermediate itself exits.
    def intermediate(slot)
      # Inherited from the template, Ruby's IGNORE would reap a worker that
      # dies before this process exits: nobody would see it go and its slot
      # would never be freed. SYSTEM_DEFAULT leaves it a zombie for the
      # supervisor to reap once it adopts it. (DEFAULT is not enough: in
      # Ruby it means "Ruby's own handler", which is IGNORE's for CHLD.)
      begin
        trap("CHLD", "SYSTEM_DEFAULT")
        worker = Process.fork
      rescue SystemCallError => e
        send_message("E", [slot, e.errno].pack("NN"))
        exit!(0)
      rescue Exception # rubocop:disable Lint/RescueException
        exit!(1)
      end
      return if worker.nil?

      begin
        send_message("W", [slot, worker].pack("NN"))
      ensure
        exit!(0)
      end
    end

    # In the forked worker: steps 1-5 of "What the forked worker does".
    # `intermediate` is the pid of its parent at the fork.
    def become_worker(slot, generation, ios, intermediate)
      # The worker's own children are its to wait for.
      trap("CHLD", @program_sigchld || "DEFAULT")
      channel_io, stderr_io = ios
      place = @channel.fileno
      # 1. Close what the program opened (not the VM's own descriptors).
      close_program_descriptors([0, 1, 2, place, channel_io.fileno, stderr_io.fileno] +
                                @listeners.map(&:fileno))
      # 2. The channel to 3+n (over the template channel, which the same
      # Socket object then names), stderr to 2.
      $stderr.flush
      Libc.dup2(stderr_io.fileno, 2)
      Libc.dup2(channel_io.fileno, place)
      channel_io.close
      stderr_io.close
      @channel.close_on_exec = true
      # 3. The environment of an exec'd worker.
      ENV.delete("FORKPOOL_TEMPLATE_FD")
      ENV["FORKPOOL_CHANNEL_FD"] = place.to_s
      ENV["FORKPOOL_SLOT"] = slot.to_s
      ENV["FORKPOOL_GENERATION"] = generation.to_s
      ENV["LISTEN_PID"] = Process.pid.to_s unless @listeners.empty?
      # 4. Armed only once reparented: the parent-death signal fires when
      # the current parent dies, and the intermediate dies at once.
      wait_reparented(intermediate)
      Libc.parent_death_signal(Signal.list.fetch("TERM"))
      if Process.ppid != @supervisor_pid
        warn "forkpool worker: parent is #{Process.ppid}, not the supervisor #{@supervisor_pid}: " \
             "the supervisor is gone"
        exit!(1)
      end
      @template = false
      @pid = Process.pid
      @slot = slot
      @generation = generation
    end

    # The kernel sends the parent-death signal while it reparents, so wait
    # until the intermediate is reaped (its /proc entry gone), not just
    # until getppid() has changed.
    def wait_reparented(intermediate)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + REPARENT_DEADLINE
      while Process.ppid == intermediate || File.exist?("/proc/#{intermediate}")
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          warn "forkpool worker: not reparented to the supervisor"
          exit!(1)
        end
        sleep 0.0002
      end
    end

    # Closes every descriptor the program opened while loading, keeping
    # `keep`, the VM's own (BOOT_FDS, still what they were, and any
    # eventfd, should the VM have made new ones). IO objects on a closed
    # descriptor are told not to close it again: their finalizer would
    # otherwise close whatever reuses the number later.
    def close_program_descriptors(keep)
      doomed = Dir.children("/proc/self/fd").map(&:to_i).reject do |fd|
        keep.include?(fd) || vm_descriptor?(fd)
      end
      ObjectSpace.each_object(IO) do |io|
        next if io.closed?

        io.autoclose = false if doomed.include?(io.fileno)
      rescue IOError
        nil
      end
      doomed.each { |fd| Libc.close(fd) }
    end

    def vm_descriptor?(fd)
      target = File.readlink("/proc/self/fd/#{fd}")
      target == "anon_inode:[eventfd]" || BOOT_FDS[fd] == target
    rescue SystemCallError
      true # gone already (the directory listing's own descriptor)
    end

    # Refork: this worker becomes the template, on channel `io`.
    def become_template(io)
      leave_board if @board
      place = @channel.fileno
      Libc.dup2(io.fileno, place) # closes the worker channel
      io.close
      @channel.close_on_exec = true
      ENV.delete("FORKPOOL_CHANNEL_FD")
      ENV.delete("FORKPOOL_SLOT")
      ENV["FORKPOOL_TEMPLATE_FD"] = place.to_s
      @supervisor_pid ||= Integer(ENV.fetch("FORKPOOL_SUPERVISOR_PID", Process.ppid.to_s))
      @template = true
      @slot = nil
      @leaving = false
    end
  end
end
