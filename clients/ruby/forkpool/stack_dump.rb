# frozen_string_literal: true

module Forkpool
  # Stack dumps (docs/protocol.md, "Stack dumps"): on SIGURG the worker
  # writes the backtrace of every thread to stderr, which the supervisor
  # logs with the slot, and carries on. Ruby runs the handler between two
  # steps of the main thread; a blocking read or select is interrupted,
  # the handler runs, and the call resumes.
  module StackDump
    SIGNAL = "URG"

    module_function

    # Installs the handler (loading forkpool/worker does it); `out` is
    # where the dumps go.
    def install(out = $stderr)
      trap(SIGNAL) { dump(out) }
    end

    def dump(out)
      text = +"forkpool: stack dump of pid #{Process.pid} (SIGURG), #{Thread.list.size} thread(s)\n"
      Thread.list.each do |thread|
        text << "thread #{thread.name || thread.object_id} (#{thread.status || 'dead'})" \
                "#{thread == Thread.main ? ' main' : ''}:\n"
        (thread.backtrace || []).each { |line| text << "    #{line}\n" }
      end
      # syswrite: no buffer, no lock (a trap handler may not take a Mutex).
      out.syswrite(text)
    rescue IOError, SystemCallError
      nil
    end
  end

  StackDump.install
end
