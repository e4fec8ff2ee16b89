# Shell functions the benchmark scripts share (sourced, not run): waiting
# for a server's port and stopping the server they started, by pid.

# Waits up to 30 s until something accepts on 127.0.0.1:PORT.
wait_for_port() { # PORT
  local tries=300
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || return 1
    sleep 0.1
  done
}

# Stops the server whose pid is in $server_pid: TERM, up to 10 s to exit,
# then KILL; clears $server_pid.
stop_server() {
  [ -n "$server_pid" ] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  local tries=100
  while kill -0 "$server_pid" 2>/dev/null && [ "$tries" -gt 0 ]; do
    tries=$((tries - 1))
    sleep 0.1
  done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
